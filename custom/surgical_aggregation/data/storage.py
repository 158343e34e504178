"""Where the bundle keeps what it derives from a site's data (decoded images, embeddings, embedded
datasets), and the file lock that serialises processes writing the same folder."""

from __future__ import annotations

import contextlib
import errno
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from ..core.errors import DataNotFoundError, ModelFileError, StorageError

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


def _sync_directory(directory: Path) -> None:
    """Make a rename in ``directory`` durable (where the platform allows opening a directory)."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - e.g. Windows
        return
    try:
        os.fsync(descriptor)
    except OSError:  # pragma: no cover - some file systems refuse fsync on directories
        pass
    finally:
        os.close(descriptor)


def write_atomically(path: Path, write: Callable[[BinaryIO], None], what: str) -> Path:
    """Write ``path`` through a temporary file in its folder (written, flushed, fsynced, renamed): a reader, or a
    process restarted after a crash, sees the previous file or the new one, never half of one. On any failure the
    temporary file is removed and the previous file stays; a full disk or another OS error is a
    :class:`StorageError` naming the file, the cause and that the previous file is kept."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(temporary, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
        _sync_directory(path.parent)
    except OSError as error:
        temporary.unlink(missing_ok=True)
        cause = "no space left on the device" if error.errno == errno.ENOSPC else (error.strerror or repr(error))
        kept = f"the previous {path.name} is kept" if path.exists() else "nothing was written"
        raise StorageError(f"could not write the {what} {path}: {cause}; {kept}") from error
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return path


def keep_previous(path: Path, backup: Path) -> None:
    """Make ``backup`` a copy of ``path`` (a hard link where possible), replacing it atomically; nothing when
    ``path`` does not exist yet."""
    if not path.is_file():
        return
    staging = backup.with_name(f".{backup.name}.{os.getpid()}.tmp")
    staging.unlink(missing_ok=True)
    try:
        try:
            os.link(path, staging)
        except OSError:
            shutil.copy2(path, staging)
        os.replace(staging, backup)
    except OSError as error:
        staging.unlink(missing_ok=True)
        raise StorageError(f"could not keep a backup of {path} as {backup}: {error.strerror or error!r}") from error
