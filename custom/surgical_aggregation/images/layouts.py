"""One entry point for every supported chest X-ray folder layout, chosen by a ``kind`` string (site configs use it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..core.errors import SiteConfigError
from ..core.labels import BUILTIN_VOCABULARY, Vocabulary
from ..data.table import LabelTable
from .chexpert import load_chexpert
from .csv_table import load_csv_table
from .mimic import load_mimic
from .names import CHEXPERT, CSV, LAYOUT_KINDS, MIMIC, NIH
from .nih import load_nih
from .public import PUBLIC_DATASETS

LOADERS = {
    NIH: load_nih,
    CHEXPERT: load_chexpert,
    MIMIC: load_mimic,
    CSV: load_csv_table,
    **{kind: dataset.load for kind, dataset in PUBLIC_DATASETS.items()},
}
VOCABULARY_ARGUMENT = "vocabulary"  # every loader's; given by the site, never a data.option


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
    try:
        loader = LOADERS[kind]
    except KeyError:
        raise SiteConfigError(f"unknown dataset kind {kind!r}; choose one of {', '.join(LAYOUT_KINDS)}") from None
    accepted = set(loader.__code__.co_varnames[1 : loader.__code__.co_argcount]) - {VOCABULARY_ARGUMENT}
    unknown = sorted(set(options) - accepted)
    if unknown:
        raise SiteConfigError(f"dataset kind {kind!r} takes no data.options {unknown}; it takes {sorted(accepted)}")
    return loader(location, vocabulary=vocabulary, **options)
