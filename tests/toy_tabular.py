"""A third modality that lives only in the tests: tabular measurements (a CSV of numeric features and 0/1 finding
columns) read by a small MLP. It shows the seam is complete: registered for a block (``modalities.registry.
registered``), it trains, aggregates, is checked, saved and scored by the bundle's code, none of it changed."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.utils.data import Dataset

from surgical_aggregation.core.errors import DatasetFormatError, SiteConfigError
from surgical_aggregation.core.head import distinct_class_names
from surgical_aggregation.data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable, MaterialisedTable

FEATURE_PREFIX = "feature_"
TOY_FINDINGS = ("Mass", "Nodule", "Edema", "Hernia")  # finding i is positive where feature i is above 0.5


@dataclass
class TabularSettings:
    hidden_units: int = 16

    def check(self, where: str) -> None:
        if self.hidden_units < 1:
            raise SiteConfigError(f"{where}: hidden_units must be positive, got {self.hidden_units}")


class TabularMLP(nn.Module):
    def __init__(self, class_names: Sequence[str], features: int, hidden_units: int) -> None:
        super().__init__()
        self.class_names = distinct_class_names(class_names)
        self.features = nn.Sequential(nn.Linear(features, hidden_units), nn.ReLU())
        self.class_layers = nn.Sequential()
        self.class_layers.add_module("out", nn.Linear(hidden_units, len(self.class_names)))

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return self.class_layers(self.features(rows))


class TabularDataset(Dataset):
    def __init__(self, table: LabelTable, classes: Sequence[str] | None = None, missing: str = "error") -> None:
        self.table = table
        self.class_names = list(table.classes if classes is None else classes)
        columns = [column for column in table.frame.columns if column.startswith(FEATURE_PREFIX)]
        self.inputs = torch.tensor(table.frame[columns].to_numpy(np.float32))
        labels, mask = table.label_matrix(self.class_names, missing)
        self.labels, self.mask = torch.from_numpy(labels), torch.from_numpy(mask)

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.inputs[index], "label": self.labels[index], "mask": self.mask[index]}

    def relabelled(self, classes: Sequence[str], missing: str) -> TabularDataset:
        return TabularDataset(self.table, classes, missing)

    def reseed(self, seed: int) -> None:
        """Nothing random per row."""

    def batch_transform(self, inputs: torch.Tensor) -> torch.Tensor:
        return inputs


def read_rows(path: Path, vocabulary: Any = None) -> LabelTable:
    """``row_id``, ``patient_id``, ``feature_*`` columns and 0/1 finding columns (named through ``vocabulary``)."""
    frame = pd.read_csv(path)
    findings = [c for c in frame.columns if c not in ("row_id", "patient_id") and not c.startswith(FEATURE_PREFIX)]
    names = vocabulary.renaming(findings, str(path)) if vocabulary is not None else {name: name for name in findings}
    table = pd.DataFrame({PATH_COLUMN: frame["row_id"].astype(str), PATIENT_COLUMN: frame["patient_id"].astype(str)})
    for column in frame.columns:
        if column.startswith(FEATURE_PREFIX):
            table[column] = frame[column].astype(np.float32)
    for raw, name in names.items():
        table[name] = frame[raw].astype(np.float32)
    return LabelTable("toy_table", path.parent, list(names.values()), table)


@dataclass(frozen=True)
class TabularModality:
    name: str = "tabular"
    kinds: tuple[str, ...] = ("toy_table",)
    settings_type: type = TabularSettings
    architecture: str = "toy_tabular_mlp"
    sample_noun: str = "rows"
    row_column: str = "row_id"
    threshold_metrics: bool = False

    def check(self, config, where: str) -> None:
        config.settings.check(where)
        if config.data.location is None:
            raise SiteConfigError(f"{where}: data.location is required for kind 'toy_table': the CSV file")

    def load_table(self, config, log: logging.Logger) -> LabelTable:
        return read_rows(Path(config.data.location), config.vocabulary)

    def describe(self, config, table: LabelTable) -> str:
        return f"toy_table, {len(table)} rows"

    def preprocessing(self, config) -> dict[str, Any]:
        frame = pd.read_csv(config.data.location, nrows=1)
        features = sum(column.startswith(FEATURE_PREFIX) for column in frame.columns)
        return {"features": features, "hidden_units": config.settings.hidden_units}

    def materialise(self, config, table: LabelTable, log: logging.Logger, progress: bool) -> MaterialisedTable:
        return MaterialisedTable(table, lambda split, train: TabularDataset(split, table.classes), "rows as read")

    def build_model(self, class_names: Sequence[str], preprocessing: Mapping[str, Any]) -> nn.Module:
        return TabularMLP(class_names, int(preprocessing["features"]), int(preprocessing["hidden_units"]))

    def load_pretrained(self, model: nn.Module, weights_path: str) -> None:
        raise SiteConfigError("the toy tabular model has no pretrained weights")

    def unlabelled_table(self, source: Path, column: str | None) -> LabelTable:
        table = read_rows(source)
        return LabelTable("scored", table.root, [], table.frame.drop(columns=table.classes))

    def scoring_dataset(self, table, preprocessing, cache_dir, on_error, device):
        return TabularDataset(table, table.classes), table, []

    def read_sample(self, table: LabelTable, config, limit: int) -> list[tuple[str, str]]:
        return []

    def unreadable_policy(self, config) -> tuple[bool, str]:
        return True, "a row that cannot be read stops the site"

    def probe_input(self, preprocessing: Mapping[str, Any]) -> torch.Tensor:
        return torch.randn(2, int(preprocessing["features"]), generator=torch.Generator().manual_seed(0))


TABULAR = TabularModality()


def write_rows(path: Path, classes: Sequence[str], rows: int, seed: int) -> Path:
    """Rows whose findings follow their features (:data:`TOY_FINDINGS`), with ``classes`` labelled."""
    rng = np.random.default_rng(seed)
    features = rng.random((rows, 6)).astype(np.float32)
    if not set(classes) <= set(TOY_FINDINGS):
        raise DatasetFormatError(f"write_rows: findings of {TOY_FINDINGS} only")
    frame = pd.DataFrame(
        {"row_id": [f"r{seed}-{i}" for i in range(rows)], "patient_id": [f"p{i}" for i in range(rows)]}
    )
    for index in range(features.shape[1]):
        frame[f"{FEATURE_PREFIX}{index}"] = features[:, index]
    for name in classes:
        frame[name] = (features[:, TOY_FINDINGS.index(name)] > 0.5).astype(int)
    frame.to_csv(path, index=False)
    return path
