"""Images/s when reading training images from the source files vs from the preprocessing cache.

Not a test: it generates NIH-sized (1024 x 1024 PNG) images in a temporary folder and times
(1) decoding + resizing from the PNGs, as every epoch would without a cache, (2) building the
cache once, and (3) reading the cached uint8 arrays, with and without the training augmentation (batches of 64, CPU).

    python benchmarks/cache_speed.py --images 200 --size 224 --out docs/data/cache_speed.json

``--out`` keeps each path's images/s, the settings and the machine (docs/data.md's table is held to it).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch

from surgical_aggregation.experiments.grid_run import machine
from surgical_aggregation.images.cache import build_cache
from surgical_aggregation.images.decode import read_grayscale
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.synthetic import generate_nih
from surgical_aggregation.images.transforms import image_batch_transform


def _rate(count: int, seconds: float) -> str:
    return f"{count / seconds:9.1f} images/s  ({seconds:6.2f} s for {count})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=200, help="about how many source images to generate")
    parser.add_argument("--source-size", type=int, default=1024, help="side of the generated PNGs (NIH: 1024)")
    parser.add_argument("--size", type=int, default=224, help="training image side")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decoding threads for the cache build")
    parser.add_argument("--out", type=Path, help="JSON record of the rates, settings and machine")
    args = parser.parse_args()
    torch.set_num_threads(1)

    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        started = time.perf_counter()
        dataset = generate_nih(folder / "nih", n_patients=max(1, args.images // 2), image_size=args.source_size)
        print(f"generated {dataset.n_images} PNGs of {args.source_size}px in {time.perf_counter() - started:.1f} s")
        paths = load_table("nih", dataset.root).paths
        megabytes = sum(os.path.getsize(p) for p in paths) / 2**20
        print(f"source: {megabytes:.1f} MiB on disk ({megabytes / len(paths):.2f} MiB per image)\n")

        started = time.perf_counter()
        for path in paths:
            read_grayscale(path, args.size)
        source_seconds = time.perf_counter() - started

        started = time.perf_counter()
        cache, _ = build_cache(paths, folder / "cache", args.size, workers=args.workers, progress=False)
        build_seconds = time.perf_counter() - started

        started = time.perf_counter()
        for path in paths:
            cache.read(path)
        cache_seconds = time.perf_counter() - started

        transform = image_batch_transform(args.size, train=True)
        started = time.perf_counter()
        for first in range(0, len(paths), 64):
            transform(torch.stack([torch.from_numpy(cache.read(path)) for path in paths[first : first + 64]]))
        transform_seconds = time.perf_counter() - started

        rows = {
            "decode + resize from source (1 thread)": source_seconds,
            f"build the cache ({args.workers} threads)": build_seconds,
            "read from the cache": cache_seconds,
            "read from the cache + training augmentation": transform_seconds,
        }
        for label, seconds in rows.items():
            print(f"{label:<44}{_rate(len(paths), seconds)}")
        print(f"\ncache read is {source_seconds / cache_seconds:.0f}x faster than decoding the source")
        if args.out:
            record = {
                "command": "python benchmarks/cache_speed.py "
                f"--images {args.images} --source-size {args.source_size} --size {args.size} --workers {args.workers}",
                "machine": machine(),
                "images": len(paths),
                "images_per_second": {label: round(len(paths) / seconds, 1) for label, seconds in rows.items()},
            }
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
