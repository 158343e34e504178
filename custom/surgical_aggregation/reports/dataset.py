"""Report datasets for the site trainer: embedding vectors with their labels and label mask.

Batches look like the image datasets' (``"image"`` is the model input, here an embedding), so
the same trainer, loss, recipe and metrics serve both jobs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from ..data.table import LabelTable, MissingClassPolicy
from .data import TEXT_COLUMN
from .embeddings import EmbeddingCache, encoder_for


class ReportDataset(Dataset):
    """Reports of a table as (embedding, labels, mask) over ``classes`` (default: the table's own)."""

    def __init__(
        self,
        table: LabelTable,
        vectors: dict[str, np.ndarray],
        classes: Sequence[str] | None = None,
        missing: MissingClassPolicy = "error",
    ) -> None:
        self.table = table
        self.vectors = vectors
        self.class_names = list(table.classes if classes is None else classes)
        labels, mask = table.label_matrix(self.class_names, missing)
        self.labels = torch.from_numpy(labels)
        self.mask = torch.from_numpy(mask)
        self.inputs = torch.from_numpy(np.stack([vectors[path] for path in table.paths])) if len(table) else None

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {"image": self.inputs[index], "label": self.labels[index], "mask": self.mask[index]}

    def relabelled(self, classes: Sequence[str], missing: MissingClassPolicy) -> ReportDataset:
        """The same reports with label columns ``classes`` (e.g. vanilla FL's union with negatives)."""
        return ReportDataset(self.table, self.vectors, classes, missing)

    def reseed(self, seed: int) -> None:
        """Nothing random per sample (dropout is in the model)."""

    def batch_transform(self, inputs: torch.Tensor) -> torch.Tensor:
        """The embeddings are the model's input as they are."""
        return inputs


def embed_table(
    table: LabelTable, cache_root: str | Path, model: str, device: str = "cpu", progress: bool = False
) -> tuple[dict[str, np.ndarray], str]:
    """Every report's embedding, by report id (computed once per text and model, then read from the cache),
    and a line saying how many were computed now."""
    cache = EmbeddingCache(cache_root, encoder_for(model, device))
    vectors, computed = cache.embed(table.frame[TEXT_COLUMN].tolist(), progress=progress)
    summary = (
        f"{len(table)} report embeddings ({model}): {computed} computed now, "
        f"{len(table) - computed} from the cache {cache.folder}"
    )
    return dict(zip(table.paths, vectors, strict=True)), summary
