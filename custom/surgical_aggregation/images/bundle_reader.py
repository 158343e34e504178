"""MONAI's image reader in an exported bundle: every file training reads (PNG, JPEG, TIFF, BMP, DICOM) decoded to
training's own 8-bit pixels by the bundle's copy of :mod:`.grayscale` (and :mod:`.dicom`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from monai.data import ImageReader

from .grayscale import radiograph_pixels


class RadiographReader(ImageReader):
    """Reads a radiograph file as training does; rows first, no channel (``EnsureChannelFirstd`` adds it)."""

    def __init__(self, size: int | None = None) -> None:
        super().__init__()
        self.size = size

    def verify_suffix(self, filename: str | Sequence[str]) -> bool:
        return True  # the decoder decides, by content (a DICOM export may have no suffix)

    def read(self, data: str | Sequence[str], **kwargs: Any) -> list[np.ndarray]:
        paths = [data] if isinstance(data, str) else list(data)
        return [radiograph_pixels(str(path), self.size) for path in paths]

    def get_data(self, img: list[np.ndarray]) -> tuple[np.ndarray, dict]:
        array = img[0] if len(img) == 1 else np.stack(img)
        return array, {"spatial_shape": np.asarray(img[0].shape), "original_channel_dim": float("nan")}
