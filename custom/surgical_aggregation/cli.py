"""Command line: ``surgical-aggregation <command>`` (also ``python -m surgical_aggregation``).

* ``prepare``  decode and resize a dataset's images once into the preprocessing cache;
* ``generate`` write the embedded (generated) datasets in the real NIH / CheXpert / MIMIC layouts.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .data.cache import ON_ERROR_POLICIES, default_cache_root
from .data.images import ImageLoadError
from .data.sources import DATASET_KINDS, load_table
from .data.synthetic import GENERATORS, ensure_generated
from .data.table import UNCERTAINTY_POLICIES, DatasetFormatError
from .labels import UnknownLabelError

USER_ERRORS = (
    FileNotFoundError,
    DatasetFormatError,
    UnknownLabelError,
    ImageLoadError,
    ValueError,
    KeyError,
    TypeError,
)


def _add_prepare(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "prepare",
        help="build the preprocessing cache of a dataset (decode + resize every image once)",
        description="Decode and resize every image of a dataset once into the on-disk cache that training reads.",
    )
    parser.add_argument("--kind", required=True, choices=DATASET_KINDS, help="on-disk layout of the dataset")
    parser.add_argument("--data", required=True, type=Path, help="dataset folder (or the CSV file for --kind csv)")
    parser.add_argument("--size", type=int, default=224, help="side of the cached square images (default 224)")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"cache root (default {default_cache_root()})")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decoding threads")
    parser.add_argument(
        "--on-error",
        choices=ON_ERROR_POLICIES,
        default="error",
        help="unreadable images: 'error' stops with their names, 'skip' leaves them out and counts them",
    )
    parser.add_argument(
        "--uncertainty", choices=UNCERTAINTY_POLICIES, default=None, help="CheXpert/MIMIC/CSV -1 labels"
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def _add_generate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "generate",
        help="write the embedded demo datasets (generated images in the real layouts)",
        description="Write small generated datasets in the exact NIH, CheXpert and MIMIC-CXR-JPG folder layouts.",
    )
    parser.add_argument("--kind", choices=[*GENERATORS, "all"], default="all")
    parser.add_argument("--out", required=True, type=Path, help="parent folder; each kind goes to <out>/<kind>")
    parser.add_argument("--patients", type=int, default=200, help="patients per dataset")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--labels",
        choices=("auto", "reference", "builtin"),
        default="auto",
        help="label rows: real ones from torchxrayvision's files (reference), built-in frequencies, or auto",
    )


def _prepare(args: argparse.Namespace) -> int:
    from .data.dataset import cache_table

    options = {} if args.uncertainty is None else {"uncertainty": args.uncertainty}
    table = load_table(args.kind, args.data, **options)
    print(f"{args.kind} data at {args.data}: {len(table)} images of {table.n_patients} patients")
    kept, _, report = cache_table(
        table,
        args.cache_dir or default_cache_root(),
        args.size,
        on_error=args.on_error,
        workers=args.workers,
        progress=not args.no_progress,
    )
    print(report.summary())
    for path, reason in report.failures[:20]:
        print(f"  skipped {path}: {reason}")
    if len(report.failures) > 20:
        print(f"  ... and {len(report.failures) - 20} more")
    print(f"{len(kept)} images ready for training")
    return 0


def _generate(args: argparse.Namespace) -> int:
    kinds = list(GENERATORS) if args.kind == "all" else [args.kind]
    for kind in kinds:
        dataset, created = ensure_generated(
            kind,
            args.out / kind,
            n_patients=args.patients,
            image_size=args.size,
            seed=args.seed,
            label_source=args.labels,
        )
        print(("generated " if created else "already present: ") + dataset.describe())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="surgical-aggregation", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_prepare(commands)
    _add_generate(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {"prepare": _prepare, "generate": _generate}
    try:
        return handlers[args.command](args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
