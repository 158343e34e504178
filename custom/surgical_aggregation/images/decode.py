"""Decoding one chest X-ray file (PNG, JPEG, TIFF, BMP, or DICOM: :mod:`.dicom`) into a square 8-bit grayscale array
(:mod:`.grayscale` says how)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..core.errors import ImageLoadError
from .grayscale import radiograph_pixels, unreadable_reason


def read_grayscale(path: str | Path, size: int | None = None, accept_non_chest: bool = False) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W), resized to (size, size) when ``size`` is given.

    Raises :class:`ImageLoadError` naming the file when it is missing, truncated, not an image, too large or small to
    use, near-constant, or a DICOM that says it is not a chest radiograph (unless ``accept_non_chest``).
    """
    try:
        return radiograph_pixels(str(path), size, accept_non_chest)
    except Exception as error:
        reason = unreadable_reason(error)
        if reason is None:
            raise
        raise ImageLoadError(path, reason) from None
