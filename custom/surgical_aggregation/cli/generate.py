"""Write small generated datasets in the exact folder layouts of NIH, CheXpert, MIMIC-CXR-JPG, PadChest, VinDr-CXR,
Google's NIH labels, RSNA and SIIM (the last five: real label rows only)."""

from __future__ import annotations

import argparse

from ..images.names import GENERATED_KINDS, SHARED_ROWS
from .options import add_co_occurrence, positive, user_path

NAME = "generate"
HELP = "write the embedded demo datasets (generated images in the real layouts)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", choices=[*GENERATED_KINDS, "all"], default="all")
    parser.add_argument(
        "--out", required=True, type=user_path, help="the dataset's folder for one --kind; for all, <out>/<kind> each"
    )
    parser.add_argument("--patients", type=positive, default=200, help="patients per dataset")
    parser.add_argument("--size", type=positive, default=64, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--labels",
        choices=("auto", "reference", "builtin"),
        default="auto",
        help="label rows: real ones from torchxrayvision's files (reference), built-in frequencies, or auto",
    )
    add_co_occurrence(parser)


def run(args: argparse.Namespace) -> int:
    from ..images.synthetic import ensure_generated

    # the default is not written into the dataset's record, so folders generated before it existed are reused
    joint = {} if args.co_occurrence == SHARED_ROWS else {"co_occurrence": args.co_occurrence}
    for kind in GENERATED_KINDS if args.kind == "all" else [args.kind]:
        dataset, created = ensure_generated(
            kind,
            args.out / kind if args.kind == "all" else args.out,
            n_patients=args.patients,
            image_size=args.size,
            seed=args.seed,
            label_source=args.labels,
            **joint,
        )
        print(("generated " if created else "already present: ") + dataset.describe())
    return 0
