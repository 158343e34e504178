"""One entry point for every supported chest X-ray folder layout, chosen by a ``kind`` string (site configs use it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from ..core.errors import SiteConfigError
from ..core.labels import BUILTIN_VOCABULARY, Vocabulary
from ..data.table import UNCERTAINTY_POLICIES, LabelTable
from .chexpert import load_chexpert
from .csv_table import load_csv_table
from .mimic import load_mimic
from .names import CHEXPERT, CSV, LAYOUT_KINDS, MIMIC, NIH
from .nih import load_nih
from .public import PADCHEST_LABELLERS, PUBLIC_DATASETS

LOADERS = {
    NIH: load_nih,
    CHEXPERT: load_chexpert,
    MIMIC: load_mimic,
    CSV: load_csv_table,
    **{kind: dataset.load for kind, dataset in PUBLIC_DATASETS.items()},
}
VOCABULARY_ARGUMENT = "vocabulary"  # every loader's; given by the site, never a data.option


def _names(value: Any) -> bool:
    return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(item, str) for item in value)


# What each data.option may hold: (test, what the error says it must be). Any other option is a path or column name.
OPTION_RULES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "uncertainty": (lambda value: value in UNCERTAINTY_POLICIES, f"one of {list(UNCERTAINTY_POLICIES)}"),
    "labelled_by": (lambda value: value in PADCHEST_LABELLERS, f"one of {list(PADCHEST_LABELLERS)}"),
    "min_readers": (lambda value: value in (1, 2, 3) and not isinstance(value, bool), "1, 2 or 3"),
    "projections": (_names, "a list of projection names, e.g. ['PA', 'AP']"),
    "csv_files": (_names, "a list of CSV file names"),
    "label_columns": (lambda value: value is None or _names(value), "a list of column names, or null"),
    "new_classes": (lambda value: value is None or _names(value), "a list of the site's own finding names, or null"),
}
TEXT_OPTION = (lambda value: value is None or isinstance(value, (str, PathLike)), "a text (a file, folder or column)")


def check_options(kind: str, options: Mapping[str, Any], where: str) -> None:
    """Refuse a data.option the kind's loader does not take, or a value it could not use, before any data is read:
    what ``check-site`` calls valid is what the site can load."""
    try:
        loader = LOADERS[kind]
    except KeyError:
        raise SiteConfigError(f"unknown dataset kind {kind!r}; choose one of {', '.join(LAYOUT_KINDS)}") from None
    accepted = set(loader.__code__.co_varnames[1 : loader.__code__.co_argcount]) - {VOCABULARY_ARGUMENT}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise SiteConfigError(
            f"{where}: dataset kind {kind!r} takes no data.options {unknown}; it takes {sorted(accepted)}"
        )
    for name, value in options.items():
        test, wanted = OPTION_RULES.get(name, TEXT_OPTION)
        if not test(value):
            raise SiteConfigError(f"{where}: data.options.{name} must be {wanted}, got {value!r}")


def load_table(
    kind: str, location: str | Path, vocabulary: Vocabulary = BUILTIN_VOCABULARY, /, **options: Any
) -> LabelTable:
    """Read a dataset: ``location`` is the data folder (nih, chexpert, mimic, the public datasets of ``public``)
    or the CSV file (csv); its label names are read through ``vocabulary`` (a site's: its config's; given by
    position, so that no data.option can stand in for it).

    ``options`` go to the loader (e.g. ``uncertainty="ignore"`` for chexpert/mimic/csv,
    ``image_dir`` for nih, ``image_column``/``label_columns`` for csv); an option the loader
    does not take is an error that lists the ones it does.
    """
    check_options(kind, options, str(location))
    return LOADERS[kind](location, vocabulary=vocabulary, **options)
