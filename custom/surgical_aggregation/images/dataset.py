"""PyTorch datasets over a :class:`LabelTable`, reading pixels from the preprocessing cache."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np
import pandas as pd
import torch
from torch.utils.data import Dataset

from ..core.errors import DataNotFoundError, DatasetFormatError
from ..data.table import PATH_COLUMN, LabelTable, MissingClassPolicy
from .cache import CacheReport, ImageCache, OnError, build_cache, cache_directory
from .dicom import DICOM_SUFFIXES, is_dicom
from .grayscale import folder_files
from .transforms import ImageBatchTransform


class ImageReader(Protocol):
    def read(self, path: str) -> np.ndarray: ...


class ChestXrayDataset(Dataset):
    """Items are dicts: ``image`` (1, H, W) uint8 tensor as cached, ``label`` and ``mask`` (n_classes,) floats.

    The float work (scaling, augmentation, normalisation) is :meth:`batch_transform`, applied by the loops
    to whole batches on the training device. ``classes`` picks and orders label columns by name (default:
    the table's own); ``missing`` says what a class the table does not label becomes (see
    :meth:`LabelTable.label_matrix`).
    """

    def __init__(
        self,
        table: LabelTable,
        images: ImageReader,
        transform: ImageBatchTransform,
        classes: Sequence[str] | None = None,
        missing: MissingClassPolicy = "error",
    ) -> None:
        self.table = table
        self.class_names = list(table.classes if classes is None else classes)
        self.paths = table.paths
        labels, mask = table.label_matrix(self.class_names, missing)
        self.labels = torch.from_numpy(labels)
        self.mask = torch.from_numpy(mask)
        self.images = images
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def relabelled(self, classes: Sequence[str], missing: MissingClassPolicy) -> ChestXrayDataset:
        """The same images with label columns ``classes`` (e.g. a federation's union, vanilla FL's negatives)."""
        return ChestXrayDataset(self.table, self.images, self.transform, classes, missing)

    def reseed(self, seed: int) -> None:
        """Seed the augmentation (no effect without)."""
        self.transform.reseed(seed)

    def batch_transform(self, images: torch.Tensor) -> torch.Tensor:
        """A batch of items' ``image`` (on the training device) -> the model's input."""
        return self.transform(images)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        image = torch.from_numpy(self.images.read(self.paths[index])).unsqueeze(0)
        return {"image": image, "label": self.labels[index], "mask": self.mask[index]}


def cache_table(
    table: LabelTable,
    cache_root: str | Path,
    size: int,
    on_error: OnError = "error",
    workers: int = 0,
    progress: bool = True,
    accept_non_chest: bool = False,
) -> tuple[LabelTable, ImageCache, CacheReport]:
    """Build/reuse the table's image cache; returns the table without unreadable images.

    With ``on_error="skip"`` the unreadable images are dropped here (and counted in the
    report), so no epoch ever meets one.
    """
    directory = cache_directory(cache_root, table.source, table.root, size)
    cache, report = build_cache(table.paths, directory, size, on_error, workers, progress, accept_non_chest)
    readable = np.fromiter((path in cache for path in table.paths), dtype=bool, count=len(table))
    return table.subset(readable), cache, report


IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff", *DICOM_SUFFIXES)


def list_images(source: str | Path, image_column: str = PATH_COLUMN) -> list[str]:
    """Absolute image paths from a folder (every file under it, recursively: the decoder decides by content what is
    an image, and a file that is none is listed with its reason where it is scored), one image file, or a CSV's
    ``image_column`` (relative paths from the CSV's folder)."""
    source = Path(source).expanduser().resolve()
    if source.is_file() and (source.suffix.lower() in IMAGE_SUFFIXES or is_dicom(source)):
        return [str(source)]
    if source.is_dir():
        paths = folder_files(source)
        if not paths:
            raise DataNotFoundError(f"no files under {source}")
        return paths
    if not source.is_file():
        raise DataNotFoundError(f"not a folder or CSV file: {source}")
    frame = pd.read_csv(source, dtype=str)
    if image_column not in frame:
        raise DatasetFormatError(f"{source}: no {image_column!r} column; columns are {list(frame.columns)}")
    if frame.empty:
        raise DatasetFormatError(f"{source}: no rows")
    return [str(Path(p) if Path(p).is_absolute() else (source.parent / p).resolve()) for p in frame[image_column]]
