"""An opened chest X-ray -> the 8-bit grayscale square the model reads: the one definition of it.

Training, ``predict`` and the exported MONAI Bundle all read images through :func:`radiograph_pixels`; the bundle
carries a copy of this file and of :mod:`.dicom` (``scripts/``), which is why they import nothing but Pillow, NumPy
and (for DICOM) pydicom.
"""

from __future__ import annotations

import numpy as np
from PIL import Image

from .dicom import dicom_grayscale, is_dicom

# What an image may be. Real radiographs are up to ~4k x 4k (16 MP); above MAX_IMAGE_PIXELS a file is refused
# before it is decoded (PIL's own decompression-bomb check is replaced by this one, which names the size); below
# MIN_IMAGE_SIDE it carries too little to score.
MAX_IMAGE_PIXELS = 64_000_000
MIN_IMAGE_SIDE = 16
Image.MAX_IMAGE_PIXELS = None


class UnusableImage(ValueError):
    """An image too large or too small to read; the message says which and by how much."""


def _to_uint8(image: Image.Image) -> np.ndarray:
    if image.mode in ("I;16", "I;16B", "I;16L", "I", "F"):
        # 16-bit/float radiographs: stretch the file's own range onto 0..255.
        array = np.asarray(image, dtype=np.float64)
        low, high = float(array.min()), float(array.max())
        scaled = (array - low) / (high - low) * 255.0 if high > low else np.zeros_like(array)
        return np.rint(scaled).astype(np.uint8)
    if image.mode != "L":
        image = image.convert("L")
    return np.asarray(image, dtype=np.uint8)


def model_grayscale(image: Image.Image, size: int | None = None) -> Image.Image:
    """``image`` (opened, not yet loaded) as an 8-bit grayscale ("L") image, resized to (size, size) when ``size``
    is given: bilinear with Pillow's reducing gap 3, after a reduced-scale JPEG decode."""
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise UnusableImage(f"{width} x {height} pixels, more than the {MAX_IMAGE_PIXELS:,} an image may have")
    if min(width, height) < MIN_IMAGE_SIDE:
        raise UnusableImage(f"{width} x {height} pixels, a side below the minimum of {MIN_IMAGE_SIDE}")
    if size is not None and image.format == "JPEG":
        image.draft("L", (size, size))  # JPEG decodes at reduced scale: much faster
    image.load()
    gray = image if image.mode == "L" else Image.fromarray(_to_uint8(image))
    if size is not None and gray.size != (size, size):
        gray = gray.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
    return gray


def radiograph_pixels(path: str, size: int | None = None) -> np.ndarray:
    """The file at ``path`` (PNG, JPEG, TIFF, BMP or DICOM) as the model's uint8 (H, W) pixels, (size, size) when
    ``size`` is given."""
    if is_dicom(path):
        return np.array(model_grayscale(dicom_grayscale(path), size), dtype=np.uint8)
    with Image.open(path) as image:
        return np.array(model_grayscale(image, size), dtype=np.uint8)
