"""Where the bundle keeps what it derives from a site's data (decoded images, embeddings, embedded
datasets), and the file lock that serialises processes writing the same folder."""

from __future__ import annotations

import contextlib
import os
import pickle
import zipfile
from collections.abc import Iterator
from pathlib import Path

from ..core.errors import DataNotFoundError, ModelFileError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no cross-process lock, builds must not overlap
    fcntl = None

CACHE_ENV = "SURGICAL_AGGREGATION_CACHE"


def default_cache_root() -> Path:
    """``$SURGICAL_AGGREGATION_CACHE``, else ``~/.cache/surgical_aggregation``."""
    return Path(os.environ.get(CACHE_ENV, Path.home() / ".cache" / "surgical_aggregation"))


@contextlib.contextmanager
def exclusive(directory: Path) -> Iterator[None]:
    """Hold ``directory``'s lock: one writer at a time (e.g. two simulated sites sharing a data folder)."""
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as lock:
        if fcntl is not None:
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(lock, fcntl.LOCK_UN)


TORCH_ZIP_MAGIC = b"PK\x03\x04"  # torch.save's format since 1.6
PICKLE_PROTOCOL_MARK = b"\x80"  # the legacy format: a bare pickle


def read_tensor_file(path: Path, what: str) -> object:
    """A file written by ``torch.save``, loaded safely (``weights_only``); a file that is not one, or that
    holds more than tensors and plain containers, is a :class:`ModelFileError` naming it."""
    import torch  # only readers of model files pay for it

    if not path.is_file():
        raise DataNotFoundError(f"{what} not found: {path}")
    with path.open("rb") as handle:
        head = handle.read(4)
    if not (head.startswith(TORCH_ZIP_MAGIC) or head[:1] == PICKLE_PROTOCOL_MARK):
        raise ModelFileError(
            f"{path}: not a {what}: one is written by torch.save (a zip archive), this file starts with {head!r}"
        )
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError:  # torch's safe loader met something other than tensors
        raise ModelFileError(
            f"{path}: not a {what} this bundle reads: it holds objects other than tensors, names and numbers, "
            "which are not loaded (unpickling them could run code)"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, KeyError, IndexError, zipfile.BadZipFile) as error:
        raise ModelFileError(f"{path}: not a {what} (a file written by torch.save): {error!r}") from None
