"""Radiology report texts as a modality: report table -> cached sentence embeddings -> datasets -> the MLP."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ..core.devices import resolve_device
from ..core.errors import SiteConfigError
from ..data.table import LabelTable, MaterialisedTable
from .data import IU_REPORTS, REPORT_KINDS, load_reports
from .embeddings import EMBEDDING_MODELS, MINILM, embedding_dimension

if TYPE_CHECKING:  # the config sits above the modalities; they only read it
    from ..config import SiteConfig


@dataclass(frozen=True)
class ReportModality:
    name: str = "reports"
    kinds: tuple[str, ...] = REPORT_KINDS
    architecture: str = "report_mlp"
    sample_noun: str = "reports"
    threshold_metrics: bool = True  # the report-labelling paper reports accuracy, sensitivity, specificity

    def check(self, config: SiteConfig, where: str) -> None:
        # without a location, iu_reports reads the IU reports shipped in torchxrayvision's data folder
        if config.data.location is None and config.data.kind != IU_REPORTS:
            raise SiteConfigError(f"{where}: data.location is required for kind {config.data.kind!r}: the CSV file")
        if config.embedding_model not in EMBEDDING_MODELS:
            raise SiteConfigError(
                f"{where}: embedding_model must be one of {list(EMBEDDING_MODELS)}, got {config.embedding_model!r}"
            )

    def load_table(self, config: SiteConfig, log: logging.Logger) -> LabelTable:
        table, summary = load_reports(config.data.kind, config.data.location, **config.data.options)
        log.info(summary.describe())
        return table

    def describe(self, config: SiteConfig, table: LabelTable) -> str:
        return f"{config.data.kind}, {len(table)} reports"

    def preprocessing(self, config: SiteConfig) -> dict[str, Any]:
        return {"embedding_model": config.embedding_model, "in_features": embedding_dimension(config.embedding_model)}

    def materialise(
        self, config: SiteConfig, table: LabelTable, log: logging.Logger, progress: bool
    ) -> MaterialisedTable:
        from .dataset import ReportDataset, embed_table  # loads the sentence encoder only when needed

        device = "cuda" if resolve_device(config.device).type == "cuda" else "cpu"
        vectors, summary = embed_table(table, config.cache_root, config.embedding_model, device, progress)

        def dataset(split: LabelTable, train: bool) -> ReportDataset:
            return ReportDataset(split, vectors, table.classes)

        return MaterialisedTable(table, dataset, summary)

    def build_model(self, class_names: Sequence[str], preprocessing: Mapping[str, Any]) -> nn.Module:
        from .model import ReportMLP

        width = preprocessing.get("in_features") or embedding_dimension(preprocessing.get("embedding_model", MINILM))
        return ReportMLP(class_names, in_features=int(width))

    def load_pretrained(self, model: nn.Module, weights_path: str) -> None:
        raise SiteConfigError(
            f"pretrained weights ({weights_path}) are ImageNet DenseNet121 weights; the report MLP has none"
        )

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        width = int(
            preprocessing.get("in_features") or embedding_dimension(preprocessing.get("embedding_model", MINILM))
        )
        vectors = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
        return vectors / vectors.norm(dim=1, keepdim=True)  # sentence embeddings are unit vectors


REPORTS = ReportModality()
