"""Decoding one chest X-ray file into a square 8-bit grayscale array (:mod:`.grayscale` says how)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.errors import ImageLoadError
from .grayscale import UnusableImage, model_grayscale


def read_grayscale(path: str | Path, size: int | None = None) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W), resized to (size, size) when ``size`` is given.

    Raises :class:`ImageLoadError` naming the file when it is missing, truncated, not an image, or too large or
    small to use.
    """
    try:
        with Image.open(path) as image:
            return np.array(model_grayscale(image, size), dtype=np.uint8)
    except FileNotFoundError:
        raise ImageLoadError(path, "file not found") from None
    except UnusableImage as error:
        raise ImageLoadError(path, str(error)) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as error:
        raise ImageLoadError(path, f"cannot decode image ({type(error).__name__}: {error})") from None
