"""Preprocessing cache: every image decoded and resized once, reused across epochs and rounds.

NIH images are 1024x1024 PNGs; decoding one costs far more than a training step at 224 px
on a GPU. The cache stores each image as uint8 (size x size) in one memory-mapped ``.npy``
file per (source, size), with an ``index.json`` mapping image path -> row and the file's
size/mtime so a changed source file is decoded again. Building is where unreadable images are
found, so training never meets one in the middle of an epoch.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
import uuid
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
from tqdm.auto import tqdm

from ..core.errors import DataNotFoundError, ImageLoadError
from ..core.progress import PROGRESS_SECONDS
from ..data.storage import exclusive
from .decode import read_grayscale
from .names import ON_ERROR_POLICIES

logger = logging.getLogger(__name__)

OnError = Literal["error", "skip"]
INDEX_FILE = "index.json"
CACHE_FORMAT = 2  # 2: images screened (near-constant renders, DICOMs of another modality or body part)


class UnreadableImagesError(ImageLoadError):
    """Some images could not be read; ``failures`` lists (path, reason) for each."""

    def __init__(self, failures: Sequence[tuple[str, str]]):
        listed = "; ".join(f"{path} ({reason})" for path, reason in failures[:10])
        more = f"; and {len(failures) - 10} more" if len(failures) > 10 else ""
        super().__init__(
            failures[0][0],
            f"{len(failures)} unreadable image(s): {listed}{more}. Fix or remove them, "
            "or choose the 'skip' policy to leave them out and count them.",
        )
        self.failures = list(failures)


@dataclass
class CacheReport:
    directory: Path
    size: int
    requested: int
    reused: int = 0
    decoded: int = 0
    seconds: float = 0.0
    failures: list[tuple[str, str]] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"image cache {self.directory}: {self.requested} requested, {self.reused} reused, "
            f"{self.decoded} decoded, {len(self.failures)} unreadable, {self.seconds:.1f} s"
        )


def cache_directory(cache_root: str | Path, source: str, data_root: str | Path, size: int) -> Path:
    """One folder per (source, data location, size): ``<root>/<source>-<hash>/<size>px``."""
    digest = hashlib.sha1(str(Path(data_root).resolve()).encode()).hexdigest()[:12]
    return Path(cache_root) / f"{source}-{digest}" / f"{size}px"


class ImageCache:
    """Read access to a built cache. Picklable: each process maps the file on first use.

    A later build may replace the images file (adding images); a reader whose file is gone
    re-reads the index, which still lists every image it knew.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._load_index()

    def _load_index(self) -> None:
        index = _read_index(self.directory)
        if index is None:
            raise DataNotFoundError(f"no image cache in {self.directory}; build it with build_cache / 'prepare'")
        self.size: int = index["size"]
        self._file = self.directory / index["images_file"]
        self._rows: dict[str, int] = {path: entry[0] for path, entry in index["entries"].items()}
        self._array: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, path: str) -> bool:
        return path in self._rows

    def read(self, path: str) -> np.ndarray:
        if self._array is None:
            try:
                self._array = np.load(self._file, mmap_mode="r")
            except FileNotFoundError:
                self._load_index()
                self._array = np.load(self._file, mmap_mode="r")
        return np.array(self._array[self._rows[path]])

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_array": None}


def _read_index(directory: Path) -> dict | None:
    try:
        index = json.loads((directory / INDEX_FILE).read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    if index.get("format") != CACHE_FORMAT or not (directory / index.get("images_file", "")).is_file():
        return None
    return index


def _decode(task: tuple[str, int, bool]) -> tuple[str, np.ndarray | None, str]:
    path, size, accept_non_chest = task
    try:
        return path, read_grayscale(path, size, accept_non_chest), ""
    except ImageLoadError as error:
        return path, None, error.reason


def _decoded(tasks: list[tuple[str, int, bool]], workers: int) -> Iterator[tuple[str, np.ndarray | None, str]]:
    if workers <= 1:
        yield from map(_decode, tasks)
        return
    # Threads, not processes: Pillow releases the GIL while decoding and resizing, and threads
    # neither re-import the caller (spawn) nor fork a FLARE client's threads.
    with ThreadPoolExecutor(max_workers=workers) as pool:
        yield from pool.map(_decode, tasks)


def build_cache(
    paths: Sequence[str],
    directory: str | Path,
    size: int,
    on_error: OnError = "error",
    workers: int = 0,
    progress: bool = True,
    accept_non_chest: bool = False,
) -> tuple[ImageCache, CacheReport]:
    """Make sure every image in ``paths`` is in the cache at ``directory`` (decoding what is not).

    Unreadable images (missing, truncated, not an image, refused as no chest radiograph: :func:`.decode.read_grayscale`
    with ``accept_non_chest``) never stop the build halfway: all
    readable ones are cached first, then ``on_error="error"`` raises
    :class:`UnreadableImagesError` naming the files, while ``"skip"`` reports them in the
    returned :class:`CacheReport` (and they are absent from the cache).
    """
    if on_error not in ON_ERROR_POLICIES:
        raise ValueError(f"unknown on_error policy {on_error!r}; choose one of {', '.join(ON_ERROR_POLICIES)}")
    if size < 8:
        raise ValueError(f"image size must be at least 8 pixels, got {size}")
    started = time.perf_counter()
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    wanted = list(dict.fromkeys(paths))
    report = CacheReport(directory=directory, size=size, requested=len(wanted))
    with exclusive(directory):
        index = _read_index(directory)
        if index is not None and (index["size"], index.get("accept_non_chest")) != (size, accept_non_chest):
            index = None
        entries: dict[str, list[int]] = {} if index is None else index["entries"]
        todo: list[tuple[str, os.stat_result]] = []
        for path in wanted:
            try:
                stat = os.stat(path)
            except OSError:
                report.failures.append((path, "file not found"))
                continue
            entry = entries.get(path)
            if entry is not None and entry[1:] == [stat.st_size, stat.st_mtime_ns]:
                report.reused += 1
            else:
                todo.append((path, stat))
        if todo:
            _extend(directory, index, todo, size, workers, progress, report, accept_non_chest)
    report.seconds = time.perf_counter() - started
    position = {path: index for index, path in enumerate(wanted)}
    report.failures.sort(key=lambda failure: position[failure[0]])  # in the dataset's order
    if report.failures and on_error == "error":
        raise UnreadableImagesError(report.failures)
    return ImageCache(directory), report


def _extend(
    directory: Path,
    index: dict | None,
    todo: list[tuple[str, os.stat_result]],
    size: int,
    workers: int,
    progress: bool,
    report: CacheReport,
    accept_non_chest: bool,
) -> None:
    """Write a new images file = still-valid old rows + newly decoded ones, then swap the index."""
    stale = {path for path, _ in todo}
    carried = {} if index is None else {p: e for p, e in index["entries"].items() if p not in stale}
    images_file = f"images-{uuid.uuid4().hex[:8]}.npy"
    target = np.lib.format.open_memmap(
        directory / images_file, mode="w+", dtype=np.uint8, shape=(len(carried) + len(todo), size, size)
    )
    entries: dict[str, list[int]] = {}
    if carried:
        old = np.load(directory / index["images_file"], mmap_mode="r")
        for row, (path, entry) in enumerate(carried.items()):
            target[row] = old[entry[0]]
            entries[path] = [row, *entry[1:]]
        del old
    stats = dict(todo)
    row = len(carried)
    tasks = [(path, size, accept_non_chest) for path, _ in todo]
    bar = tqdm(total=len(tasks), desc=f"caching {size}px images", unit="img", disable=not progress, mininterval=2)
    started = last_log = time.monotonic()
    with bar:
        for done, (path, array, reason) in enumerate(_decoded(tasks, workers), start=1):
            bar.update()
            if not progress and time.monotonic() - last_log >= PROGRESS_SECONDS:  # a log line instead of the bar
                last_log = time.monotonic()
                logger.info("caching %dpx images: %d/%d (%.0f s)", size, done, len(tasks), last_log - started)
            if array is None:
                report.failures.append((path, reason))
                continue
            target[row] = array
            entries[path] = [row, stats[path].st_size, stats[path].st_mtime_ns]
            report.decoded += 1
            row += 1
    target.flush()
    del target
    new_index = {
        "format": CACHE_FORMAT,
        "size": size,
        "accept_non_chest": accept_non_chest,
        "images_file": images_file,
        "entries": entries,
    }
    temporary = directory / f"{INDEX_FILE}.tmp"
    temporary.write_text(json.dumps(new_index))
    temporary.replace(directory / INDEX_FILE)
    if index is not None:
        # Readers that mapped the old file keep it open; unlinking is safe on POSIX.
        (directory / index["images_file"]).unlink(missing_ok=True)
