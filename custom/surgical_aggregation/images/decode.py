"""Decoding one chest X-ray file into a square 8-bit grayscale array."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.errors import ImageLoadError

# What an image may be. Real radiographs are up to ~4k x 4k (16 MP); above MAX_IMAGE_PIXELS a file is refused
# before it is decoded (PIL's own decompression-bomb check is replaced by this one, which names the file); below
# MIN_IMAGE_SIDE it carries too little to score. Either way the image is unreadable: on_unreadable decides.
MAX_IMAGE_PIXELS = 64_000_000
MIN_IMAGE_SIDE = 16
Image.MAX_IMAGE_PIXELS = None


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


def read_grayscale(path: str | Path, size: int | None = None) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W), resized to (size, size) when ``size`` is given.

    Raises :class:`ImageLoadError` naming the file when it is missing, truncated or not an image.
    """
    try:
        with Image.open(path) as image:
            width, height = image.size
            if width * height > MAX_IMAGE_PIXELS:
                raise ImageLoadError(
                    path, f"{width} x {height} pixels, more than the {MAX_IMAGE_PIXELS:,} an image may have"
                )
            if min(width, height) < MIN_IMAGE_SIDE:
                raise ImageLoadError(path, f"{width} x {height} pixels, a side below the minimum of {MIN_IMAGE_SIDE}")
            if size is not None and image.format == "JPEG":
                image.draft("L", (size, size))  # JPEG decodes at reduced scale: much faster
            image.load()
            gray = image if image.mode == "L" else Image.fromarray(_to_uint8(image))
            if size is not None and gray.size != (size, size):
                gray = gray.resize((size, size), Image.Resampling.BILINEAR, reducing_gap=3.0)
            return np.array(gray, dtype=np.uint8)
    except FileNotFoundError:
        raise ImageLoadError(path, "file not found") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageLoadError(path, f"cannot decode image ({type(error).__name__}: {error})") from None
