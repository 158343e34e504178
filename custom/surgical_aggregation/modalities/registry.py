"""The registry of modalities: the seam between what a site's data is and everything else, one :class:`Modality` per
kind of input.

A modality turns a site config's ``data`` into a label table, materialises it (decoded images in
the preprocessing cache, or cached sentence embeddings) into datasets, describes it at the
handshake, and builds the model with a named head that reads it. The rest of the bundle (config,
site data, trainer, FLARE layer, experiments) asks this registry and never branches on a data kind.
Adding a third modality is a new package implementing :class:`Modality` and one entry in
:data:`MODALITIES`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn
from torch.utils.data import Dataset

from ..core.errors import SiteConfigError
from ..data.table import LabelTable, MaterialisedTable
from ..images.modality import IMAGES
from ..reports.modality import REPORTS
from . import ARCHITECTURES, DATA_KINDS

if TYPE_CHECKING:  # the config sits above this seam; modalities only read it
    from ..config import SiteConfig


class Modality(Protocol):
    """What one kind of input (chest X-ray images, report texts) brings to the federation."""

    name: str
    kinds: tuple[str, ...]  # the ``data.kind`` values it reads
    architecture: str  # the model it trains, as stored in checkpoints
    sample_noun: str  # "images", "reports": what its logs count
    row_column: str  # what identifies an input in predict's output ("path", "report_id")
    threshold_metrics: bool  # evaluation adds accuracy / sensitivity / specificity at a Youden threshold

    def check(self, config: SiteConfig, where: str) -> None:
        """Modality-specific checks of a site config; raises :class:`SiteConfigError` naming the field."""

    def load_table(self, config: SiteConfig, log: logging.Logger) -> LabelTable:
        """The site's label table over all of its dataset's findings (real data or the embedded default)."""

    def describe(self, config: SiteConfig, table: LabelTable) -> str:
        """One line for the handshake: the layout and size of the data, no paths and no per-class counts."""

    def preprocessing(self, config: SiteConfig) -> dict[str, Any]:
        """What the model is fed (image size and normalisation, or the sentence encoder), stored with models."""

    def materialise(
        self, config: SiteConfig, table: LabelTable, log: logging.Logger, progress: bool
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

    def read_sample(self, table: LabelTable, config: SiteConfig, limit: int) -> list[tuple[str, str]]:
        """Read the first ``limit`` rows of ``table`` as training will (images decoded at the config's size); (row,
        reason) for each that cannot be read (``check-site``)."""

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        """Two fixed inputs, preprocessed as ``preprocessing`` says: the server's check that a model's outputs are
        finite feeds them to every candidate global model."""


MODALITIES: tuple[Modality, ...] = (IMAGES, REPORTS)
if (
    tuple(kind for modality in MODALITIES for kind in modality.kinds) != DATA_KINDS
    or tuple(modality.architecture for modality in MODALITIES) != ARCHITECTURES
):
    raise AssertionError("the modalities' kinds and architectures differ from their names in modalities/__init__.py")


def modality_for_kind(kind: str) -> Modality:
    for modality in MODALITIES:
        if kind in modality.kinds:
            return modality
    raise SiteConfigError(f"unknown data kind {kind!r}; choose one of {list(DATA_KINDS)}")


def modality_for_architecture(architecture: str) -> Modality:
    for modality in MODALITIES:
        if modality.architecture == architecture:
            return modality
    raise ValueError(f"unknown architecture {architecture!r}; choose one of {list(ARCHITECTURES)}")
