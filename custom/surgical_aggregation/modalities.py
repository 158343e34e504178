"""The seam between what a site's data is and everything else: one :class:`Modality` per kind of input.

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
from typing import TYPE_CHECKING, Any, Protocol

import torch
from torch import nn

from .core.errors import SiteConfigError
from .data.table import LabelTable, MaterialisedTable
from .images.modality import IMAGES
from .reports.modality import REPORTS

if TYPE_CHECKING:  # the config sits above this seam; modalities only read it
    from .config import SiteConfig


class Modality(Protocol):
    """What one kind of input (chest X-ray images, report texts) brings to the federation."""

    name: str
    kinds: tuple[str, ...]  # the ``data.kind`` values it reads
    architecture: str  # the model it trains, as stored in checkpoints
    sample_noun: str  # "images", "reports": what its logs count
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

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        """Two fixed inputs, preprocessed as ``preprocessing`` says: the server's check that a model's outputs are
        finite feeds them to every candidate global model."""


MODALITIES: tuple[Modality, ...] = (IMAGES, REPORTS)
DATA_KINDS: tuple[str, ...] = tuple(kind for modality in MODALITIES for kind in modality.kinds)
ARCHITECTURES: tuple[str, ...] = tuple(modality.architecture for modality in MODALITIES)
DEFAULT_ARCHITECTURE = IMAGES.architecture  # of model files that do not record one (the bundle's first models)


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
