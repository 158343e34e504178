"""The registry of modalities: the seam between what a site's data is and everything else, one :class:`Modality` per
kind of input.

A modality turns a site config's ``data`` into a label table, materialises it (decoded images in
the preprocessing cache, or cached sentence embeddings) into datasets, describes it at the
handshake, and builds the model with a named head that reads it. The rest of the bundle (config,
site data, trainer, FLARE layer, experiments) asks this registry and never branches on a data kind.
Adding a third modality is a new package implementing :class:`Modality` and its line in
``modalities.MODALITY_PACKAGES``; a modality outside the bundle (a test's) is :func:`registered` for a block.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Mapping, Sequence
from importlib import import_module
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

from ..core.errors import SiteConfigError
from ..data.bundle_parts import BundleParts
from ..data.site_view import SiteView
from ..data.table import LabelTable, MaterialisedTable
from . import ARCHITECTURES, DATA_KINDS, MODALITY_PACKAGES


class Modality(Protocol):
    """What one kind of input (chest X-ray images, report texts) brings to the federation."""

    name: str
    kinds: tuple[str, ...]  # the ``data.kind`` values it reads
    settings_type: type  # the dataclass of its site-config fields (flat in the JSON), with ``check(where)``
    architecture: str  # the model it trains, as stored in checkpoints
    sample_noun: str  # "images", "reports": what its logs count
    row_column: str  # what identifies an input in predict's output ("path", "report_id")
    threshold_metrics: bool  # evaluation adds accuracy / sensitivity / specificity at a Youden threshold

    def check(self, config: SiteView, where: str) -> None:
        """Checks of a site config's data and of its settings (``config.settings``, a ``settings_type``); raises
        :class:`SiteConfigError` naming ``where`` and the field."""

    def load_table(self, config: SiteView, log: logging.Logger) -> LabelTable:
        """The site's label table over all of its dataset's findings (real data or the embedded default)."""

    def describe(self, config: SiteView, table: LabelTable) -> str:
        """One line for the handshake: the layout and size of the data, no paths and no per-class counts."""

    def preprocessing(self, config: SiteView) -> dict[str, Any]:
        """What the model is fed (image size and normalisation, or the sentence encoder), stored with models."""

    def materialise(
        self, config: SiteView, table: LabelTable, log: logging.Logger, progress: bool
    ) -> MaterialisedTable:
        """Decode or embed the table once (cached), dropping rows that cannot be used by the config's policy."""

    def build_model(self, class_names: Sequence[str], preprocessing: Mapping[str, Any]) -> nn.Module:
        """A fresh model whose head rows are ``class_names`` (``class_layers.out``), for inputs so preprocessed."""

    def load_pretrained(self, model: nn.Module, weights_path: str) -> None:
        """Load local pretrained backbone weights into ``model`` (refused where the modality has none)."""

    def unlabelled_table(self, source: Path, column: str | None) -> LabelTable:
        """What ``predict`` scores: images (a folder, searched recursively, or a CSV's image ``column``), or reports
        (a CSV's text ``column``); one row per input, no classes."""

    def scoring_dataset(
        self, table: LabelTable, preprocessing: Mapping[str, Any], cache_dir: str | None, on_error: str, device: str
    ) -> tuple[Dataset, LabelTable, list[tuple[str, str]]]:
        """``table``'s rows as a trained model's inputs, preprocessed as ``preprocessing`` (a checkpoint's) says:
        (the dataset, the rows it holds, (row, reason) for each row left out)."""

    def read_sample(self, table: LabelTable, config: SiteView, limit: int | None) -> list[tuple[str, str]]:
        """Read the first ``limit`` rows of ``table`` (every row when None) as training will (images decoded at the
        config's size); (row, reason) for each that cannot be read (``check-site``)."""

    def unreadable_policy(self, config: SiteView) -> tuple[bool, str]:
        """Whether an input :meth:`read_sample` finds unreadable stops the site (else it is left out), and what
        ``check-site`` says of it."""

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        """Two fixed inputs, preprocessed as ``preprocessing`` says: the server's check that a model's outputs are
        finite feeds them to every candidate global model."""

    def bundle_parts(self, preprocessing: Mapping[str, Any], class_count: int) -> BundleParts:
        """How a model of this modality reads its inputs in an exported MONAI Bundle (``export-bundle``)."""


def _bundled() -> list[Modality]:
    modalities = [import_module(f"{_BUNDLE}.{package}.modality").MODALITY for package in MODALITY_PACKAGES]
    if (
        tuple(kind for modality in modalities for kind in modality.kinds) != DATA_KINDS
        or tuple(modality.architecture for modality in modalities) != ARCHITECTURES
    ):
        raise AssertionError("the modalities' kinds and architectures differ from their packages' names modules")
    return modalities


_BUNDLE = __package__.rpartition(".")[0]
_MODALITIES: list[Modality] = _bundled()


def registered_modalities() -> tuple[Modality, ...]:
    """The bundle's modalities (``MODALITY_PACKAGES``), then any registered from outside it."""
    return tuple(_MODALITIES)


def modality_kinds() -> tuple[str, ...]:
    """Every ``data.kind`` a site config may name."""
    return tuple(kind for modality in _MODALITIES for kind in modality.kinds)


@contextlib.contextmanager
def registered(modality: Modality) -> Iterator[Modality]:
    """``modality`` registered for the block: a modality that lives outside the bundle (e.g. a test's)."""
    taken = set(modality_kinds()) & set(modality.kinds)
    if taken or any(other.architecture == modality.architecture for other in _MODALITIES):
        raise ValueError(f"modality {modality.name!r}: its kinds {sorted(taken)} or architecture are taken already")
    _MODALITIES.append(modality)
    try:
        yield modality
    finally:
        _MODALITIES.remove(modality)


def modality_for_kind(kind: str) -> Modality:
    for modality in _MODALITIES:
        if kind in modality.kinds:
            return modality
    raise SiteConfigError(f"unknown data kind {kind!r}; choose one of {list(modality_kinds())}")


def modality_for_architecture(architecture: str) -> Modality:
    for modality in _MODALITIES:
        if modality.architecture == architecture:
            return modality
    known = [modality.architecture for modality in _MODALITIES]
    raise ValueError(f"unknown architecture {architecture!r}; choose one of {known}")
