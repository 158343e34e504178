"""An opened chest X-ray -> the 8-bit grayscale square the model reads: the one definition of it.

Training, ``predict`` and the exported MONAI Bundle all read images through :func:`radiograph_pixels`; the bundle
carries a copy of this file and of :mod:`.dicom` (``scripts/``), which is why they import nothing but Pillow, NumPy
and (for DICOM) pydicom.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from .dicom import UnreadableDicom, dicom_grayscale, is_dicom

# What an image may be. Real radiographs are up to ~4k x 4k (16 MP); above MAX_IMAGE_PIXELS a file is refused
# before it is decoded (PIL's own decompression-bomb check is replaced by this one, which names the size); below
# MIN_IMAGE_SIDE it carries too little to score.
MAX_IMAGE_PIXELS = 64_000_000
MIN_IMAGE_SIDE = 16
# A render whose middle 90 % of pixels span fewer gray levels than this is no radiograph to read: a blank export, or a
# stale DICOM window that renders the image black or white. Real radiographs span a hundred levels and more.
NEAR_CONSTANT_SPREAD = 8
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


def near_constant_problem(pixels: np.ndarray) -> str | None:
    """Why ``pixels`` (uint8) are too near one gray level to read (None when they are not)."""
    low, high = (int(value) for value in np.percentile(pixels, (5, 95)))
    if high - low >= NEAR_CONSTANT_SPREAD:
        return None
    return (
        f"a near-constant render (90 % of its pixels between gray levels {low} and {high} of 255, mean "
        f"{float(pixels.mean()):.1f}): a blank image, or a DICOM window that renders it black or white"
    )


def radiograph_pixels(path: str, size: int | None = None, accept_non_chest: bool = False) -> np.ndarray:
    """The file at ``path`` (PNG, JPEG, TIFF, BMP or DICOM) as the model's uint8 (H, W) pixels, (size, size) when
    ``size`` is given. Refused: a near-constant render, and a DICOM that says it is not a chest radiograph (unless
    ``accept_non_chest``)."""
    if is_dicom(path):
        pixels = np.array(model_grayscale(dicom_grayscale(path, accept_non_chest), size), dtype=np.uint8)
    else:
        with Image.open(path) as image:
            pixels = np.array(model_grayscale(image, size), dtype=np.uint8)
    problem = near_constant_problem(pixels)
    if problem:
        raise UnusableImage(problem)
    return pixels


def folder_files(folder: str | Path) -> list[str]:
    """Every file under ``folder`` (recursively; by content, not suffix: a PACS export may have none), as sorted
    absolute paths."""
    return sorted(str(path) for path in Path(folder).resolve().rglob("*") if path.is_file())


def unreadable_reason(error: BaseException) -> str | None:
    """Why a file could not be read, in one line, from what :func:`radiograph_pixels` raised on it (None when the
    error is not the file's fault: a bug, which keeps its traceback)."""
    lines = str(error).strip().splitlines()  # pydicom puts a whole traceback into some messages: its first line
    said = lines[0] if lines else type(error).__name__
    if isinstance(error, FileNotFoundError):
        return "file not found"
    if isinstance(error, (UnusableImage, UnreadableDicom)):
        return said
    if isinstance(error, UnidentifiedImageError):
        return "cannot decode image: not PNG, JPEG, TIFF, BMP or DICOM"
    if isinstance(error, (OSError, ValueError, SyntaxError)):
        return f"cannot decode image ({type(error).__name__}: {said})"
    return None
