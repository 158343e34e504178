"""MONAI's image reader in an exported bundle: every file training reads (PNG, JPEG, TIFF, BMP, DICOM) decoded to
training's own 8-bit pixels by the bundle's copy of :mod:`.grayscale` (and :mod:`.dicom`), and the bundle's inputs
screened before MONAI's loader meets them: every file of the input folder is scored or listed with its reason."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
from monai.data import ImageReader

from .grayscale import folder_files, radiograph_pixels, unreadable_reason


class RadiographReader(ImageReader):
    """Reads a radiograph file as training does; rows first, no channel (``EnsureChannelFirstd`` adds it)."""

    def __init__(self, size: int | None = None, accept_non_chest: bool = False) -> None:
        super().__init__()
        self.size = size
        self.accept_non_chest = accept_non_chest

    def verify_suffix(self, filename: str | Sequence[str]) -> bool:
        return True  # the decoder decides, by content (a DICOM export may have no suffix)

    def read(self, data: str | Sequence[str], **kwargs: Any) -> list[np.ndarray]:
        paths = [data] if isinstance(data, str) else list(data)
        return [radiograph_pixels(str(path), self.size, self.accept_non_chest) for path in paths]

    def get_data(self, img: list[np.ndarray]) -> tuple[np.ndarray, dict]:
        array = img[0] if len(img) == 1 else np.stack(img)
        return array, {"spatial_shape": np.asarray(img[0].shape), "original_channel_dim": float("nan")}


def screened_inputs(folder: str, size: int, accept_non_chest: bool, readable: str) -> dict[str, list]:
    """Every file under ``folder``, decoded to see whether it can be scored (MONAI's loader decodes the scored ones
    again: this costs one more decode per input, and keeps a bad file out of the loader, whose error would end the run
    in a chain of tracebacks): ``rows`` (every file, sorted),
    ``statuses`` (``readable``, or why not) and ``datalist`` (the files to score, MONAI's list of dicts). Each file
    not scored is one line on stderr, then a count; a file's error is its line, never a traceback."""
    rows = folder_files(folder)
    if not rows:
        raise FileNotFoundError(f"no files under {folder}")
    statuses = []
    for path in rows:
        try:
            radiograph_pixels(path, size, accept_non_chest)
            statuses.append(readable)
        except Exception as error:
            reason = unreadable_reason(error)
            if reason is None:
                raise
            statuses.append(reason)
            print(f"{path}: not scored: {reason}", file=sys.stderr)
    scored = [path for path, status in zip(rows, statuses, strict=True) if status == readable]
    print(f"scoring {len(scored)} of the {len(rows)} file(s) under {folder}", file=sys.stderr)
    return {"rows": rows, "statuses": statuses, "datalist": [{"image": path} for path in scored]}
