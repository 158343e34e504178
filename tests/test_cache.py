"""The preprocessing cache: decode once, reuse, notice changed files, and handle unreadable images."""

from __future__ import annotations

import os
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from surgical_aggregation.core.errors import ImageLoadError
from surgical_aggregation.images.cache import ImageCache, UnreadableImagesError, build_cache, cache_directory
from surgical_aggregation.images.dataset import cache_table
from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.layouts import load_table


@pytest.fixture
def image_folder(nih_data, tmp_path):
    """A private copy of the NIH fixture (tests here damage files)."""
    root = tmp_path / "nih"
    shutil.copytree(nih_data.root, root)
    return root


def test_build_then_reuse(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    cache, report = build_cache(paths, tmp_path / "c", 24, progress=False)
    assert (report.decoded, report.reused, report.failures) == (len(paths), 0, [])
    for path in paths[:5]:
        np.testing.assert_array_equal(cache.read(path), read_grayscale(path, 24))
        assert cache.read(path).shape == (24, 24) and cache.read(path).dtype == np.uint8
    _, again = build_cache(paths, tmp_path / "c", 24, progress=False)
    assert (again.decoded, again.reused) == (0, len(paths))


def test_changed_source_file_is_decoded_again(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    build_cache(paths, tmp_path / "c", 24, progress=False)
    gradient = np.tile(np.arange(0, 240, 6, dtype=np.uint8), (40, 1))  # a new image: a left-to-right ramp
    Image.fromarray(gradient).save(paths[0])
    stat = os.stat(paths[0])
    os.utime(paths[0], ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    cache, report = build_cache(paths, tmp_path / "c", 24, progress=False)
    assert (report.decoded, report.reused) == (1, len(paths) - 1)
    assert np.array_equal(cache.read(paths[0]), read_grayscale(paths[0], 24))
    assert (np.diff(cache.read(paths[0]).astype(int), axis=1) > 0).all()


def test_corrupt_image_error_names_the_file_and_keeps_the_rest(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    corrupt = paths[3]
    Path(corrupt).write_bytes(b"\x89PNG\r\n\x1a\n this is not an image")
    truncated = paths[5]
    data = Path(truncated).read_bytes()
    Path(truncated).write_bytes(data[: len(data) // 2])
    os.remove(paths[7])
    with pytest.raises(UnreadableImagesError) as caught:
        build_cache(paths, tmp_path / "c", 24, progress=False)
    message = str(caught.value)
    assert caught.value.path == corrupt
    assert "3 unreadable image(s)" in message
    for path in (corrupt, truncated, paths[7]):
        assert path in message
    assert f"{paths[7]} (file not found)" in message
    # the readable images were cached before the error: the next run decodes nothing again
    cache = ImageCache(tmp_path / "c")
    assert len(cache) == len(paths) - 3
    _, report = build_cache(paths, tmp_path / "c", 24, on_error="skip", progress=False)
    assert (report.decoded, report.reused, len(report.failures)) == (0, len(paths) - 3, 3)


def test_skip_policy_counts_and_drops_unreadable_images(image_folder, tmp_path):
    table = load_table("nih", image_folder)
    Path(table.paths[0]).write_bytes(b"garbage")
    kept, cache, report = cache_table(table, tmp_path / "cache", 24, on_error="skip", progress=False)
    assert len(report.failures) == 1 and report.failures[0][0] == table.paths[0]
    assert "cannot decode image" in report.failures[0][1]
    assert len(kept) == len(table) - 1 and table.paths[0] not in kept.paths
    assert all(path in cache for path in kept.paths)
    assert cache.directory == cache_directory(tmp_path / "cache", "nih", image_folder, 24)


def test_reader_survives_a_later_build_and_pickling(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    first, _ = build_cache(paths[:10], tmp_path / "c", 24, progress=False)
    shipped = pickle.loads(pickle.dumps(first))  # as a DataLoader worker would get it
    second, report = build_cache(paths, tmp_path / "c", 24, progress=False)
    assert (report.reused, report.decoded) == (10, len(paths) - 10)
    for reader in (first, shipped, second):
        np.testing.assert_array_equal(reader.read(paths[2]), read_grayscale(paths[2], 24))


def test_different_sizes_live_side_by_side(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    small, _ = build_cache(paths, cache_directory(tmp_path, "nih", image_folder, 16), 16, progress=False)
    large, _ = build_cache(paths, cache_directory(tmp_path, "nih", image_folder, 32), 32, progress=False)
    assert small.read(paths[0]).shape == (16, 16) and large.read(paths[0]).shape == (32, 32)
    with pytest.raises(ValueError, match="unknown on_error policy 'ignore'"):
        build_cache(paths, tmp_path / "x", 16, on_error="ignore")


def test_threaded_build_equals_serial(image_folder, tmp_path):
    paths = load_table("nih", image_folder).paths
    serial, _ = build_cache(paths, tmp_path / "serial", 20, workers=1, progress=False)
    threaded, _ = build_cache(paths, tmp_path / "threaded", 20, workers=3, progress=False)
    for path in paths:
        np.testing.assert_array_equal(serial.read(path), threaded.read(path))


def test_read_grayscale_errors_name_the_file(tmp_path):
    with pytest.raises(ImageLoadError, match=r"nothing.png: file not found"):
        read_grayscale(tmp_path / "nothing.png")
    (tmp_path / "text.png").write_text("hello")
    with pytest.raises(ImageLoadError, match=r"text.png: cannot decode image"):
        read_grayscale(tmp_path / "text.png")
