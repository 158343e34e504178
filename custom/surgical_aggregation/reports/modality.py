"""Radiology report texts as a modality: report table -> cached sentence embeddings -> datasets -> the MLP."""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils.data import Dataset

from ..core.devices import resolve_device
from ..core.errors import DatasetFormatError, ModelFileError, SiteConfigError
from ..data.site_view import SiteView
from ..data.storage import default_cache_root
from ..data.table import PATH_COLUMN, LabelTable, MaterialisedTable
from .data import DEFAULT_TEXT_COLUMN, TEXT_COLUMN, load_reports, read_report_texts
from .embeddings import EMBEDDING_MODELS, MINILM, embedding_dimension
from .names import ARCHITECTURE, IU_REPORTS, KINDS
from .settings import ReportSettings
from .texts import NO_TEXT

if TYPE_CHECKING:
    from ..data.bundle_parts import BundleParts


@dataclass(frozen=True)
class ReportModality:
    name: str = "reports"
    kinds: tuple[str, ...] = KINDS
    settings_type: type = ReportSettings
    architecture: str = ARCHITECTURE
    row_column: str = "report_id"  # what identifies an input in predict's output
    sample_noun: str = "reports"
    threshold_metrics: bool = True  # the report-labelling paper reports accuracy, sensitivity, specificity

    def check(self, config: SiteView, where: str) -> None:
        config.settings.check(where)
        # without a location, iu_reports reads the IU reports shipped in torchxrayvision's data folder
        if config.data.location is None and config.data.kind != IU_REPORTS:
            raise SiteConfigError(f"{where}: data.location is required for kind {config.data.kind!r}: the CSV file")

    def load_table(self, config: SiteView, log: logging.Logger) -> LabelTable:
        table, summary = load_reports(config.data.kind, config.data.location, config.vocabulary, **config.data.options)
        log.info(summary.describe())
        return table

    def describe(self, config: SiteView, table: LabelTable) -> str:
        return f"{config.data.kind}, {len(table)} reports"

    def preprocessing(self, config: SiteView) -> dict[str, Any]:
        model = config.settings.embedding_model
        return {"embedding_model": model, "in_features": embedding_dimension(model)}

    def materialise(
        self, config: SiteView, table: LabelTable, log: logging.Logger, progress: bool
    ) -> MaterialisedTable:
        from .dataset import ReportDataset, embed_table  # loads the sentence encoder only when needed

        device = "cuda" if resolve_device(config.device).type == "cuda" else "cpu"
        vectors, summary = embed_table(table, config.cache_root, config.settings.embedding_model, device, progress)

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

    def unlabelled_table(self, source: Path, column: str | None) -> LabelTable:
        return read_report_texts(source, column or DEFAULT_TEXT_COLUMN)

    def scoring_dataset(
        self, table: LabelTable, preprocessing: Mapping[str, Any], cache_dir: str | None, on_error: str, device: str
    ) -> tuple[Dataset, LabelTable, list[tuple[str, str]]]:
        from .dataset import ReportDataset, embed_table  # loads the sentence encoder only when needed

        model = preprocessing.get("embedding_model", MINILM)
        if model not in EMBEDDING_MODELS:
            raise ModelFileError(f"the model's inputs come from {model!r}, which this bundle does not have")
        texts = table.frame[TEXT_COLUMN]
        empty = texts.str.len() == 0
        left_out = [(row, NO_TEXT) for row in table.frame.loc[empty, PATH_COLUMN]]
        if left_out and on_error == "error":
            raise DatasetFormatError(f"{len(left_out)} report(s) without text, e.g. {[row for row, _ in left_out[:3]]}")
        kept = table.subset(~empty.to_numpy())
        embed_on = "cuda" if resolve_device(device).type == "cuda" else "cpu"
        vectors, _ = embed_table(kept, cache_dir or default_cache_root(), model, embed_on, sys.stderr.isatty())
        return ReportDataset(kept, vectors, kept.classes), kept, left_out

    def read_sample(self, table: LabelTable, config: SiteView, limit: int | None) -> list[tuple[str, str]]:
        texts = table.frame[TEXT_COLUMN].iloc[:limit]
        return [(row, NO_TEXT) for row, text in zip(table.paths[:limit], texts, strict=True) if not text]

    def unreadable_policy(self, config: SiteView) -> tuple[bool, str]:
        return False, "left out: a report without text is skipped"

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        width = int(
            preprocessing.get("in_features") or embedding_dimension(preprocessing.get("embedding_model", MINILM))
        )
        vectors = torch.randn(2, width, generator=torch.Generator().manual_seed(0))
        return vectors / vectors.norm(dim=1, keepdim=True)  # sentence embeddings are unit vectors

    def bundle_parts(self, preprocessing: Mapping[str, Any], class_count: int) -> BundleParts:
        from .bundle import report_bundle_parts

        return report_bundle_parts(preprocessing, class_count)


MODALITY = ReportModality()
