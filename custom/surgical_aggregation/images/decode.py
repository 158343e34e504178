"""Decoding one chest X-ray file (PNG, JPEG, TIFF, BMP, or DICOM: :mod:`.dicom`) into a square 8-bit grayscale array
(:mod:`.grayscale` says how)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import UnidentifiedImageError

from ..core.errors import ImageLoadError
from .dicom import UnreadableDicom
from .grayscale import UnusableImage, radiograph_pixels


def read_grayscale(path: str | Path, size: int | None = None) -> np.ndarray:
    """The image at ``path`` as uint8 (H, W), resized to (size, size) when ``size`` is given.

    Raises :class:`ImageLoadError` naming the file when it is missing, truncated, not an image, or too large or
    small to use.
    """
    try:
        return radiograph_pixels(str(path), size)
    except FileNotFoundError:
        raise ImageLoadError(path, "file not found") from None
    except (UnusableImage, UnreadableDicom) as error:
        raise ImageLoadError(path, str(error)) from None
    except UnidentifiedImageError:
        raise ImageLoadError(path, "cannot decode image: not PNG, JPEG, TIFF, BMP or DICOM") from None
    except (OSError, ValueError, SyntaxError) as error:
        raise ImageLoadError(path, f"cannot decode image ({type(error).__name__}: {error})") from None
