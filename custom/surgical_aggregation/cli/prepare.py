"""Decode and resize every image of a dataset (or embed every report) once into the on-disk cache that training
reads."""

from __future__ import annotations

import argparse
import os

from ..core.errors import DatasetFormatError, SiteConfigError
from ..data.names import UNCERTAINTY_POLICIES
from ..images.names import GENERATED_KINDS, ON_ERROR_POLICIES
from ..modalities import DATA_KINDS
from .options import add_cache_dir, positive, printer, user_path

NAME = "prepare"
HELP = "build the preprocessing cache of a dataset (decode + resize every image, or embed every report, once)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kind", required=True, choices=DATA_KINDS, help="what the data is, and its layout")
    parser.add_argument(
        "--data",
        type=user_path,
        help="dataset folder (the CSV file for the CSV kinds); needed for image kinds; the IU reports default to "
        "torchxrayvision's archive",
    )
    parser.add_argument("--size", type=positive, default=224, help="side of the cached square images (default 224)")
    add_cache_dir(parser)
    parser.add_argument("--workers", type=positive, default=os.cpu_count() or 1, help="decoding threads")
    parser.add_argument(
        "--on-error",
        choices=ON_ERROR_POLICIES,
        default="error",
        help="unreadable images: 'error' stops with their names, 'skip' leaves them out and counts them",
    )
    parser.add_argument("--uncertainty", choices=UNCERTAINTY_POLICIES, help="CheXpert/MIMIC/CSV -1 labels")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def run(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from ..modalities.registry import modality_for_kind
    from ..training.config import site_config_from_dict
    from ..training.site_data import prepare_cache

    if args.data is None and args.kind in GENERATED_KINDS:
        raise SiteConfigError(f"--data is required for --kind {args.kind} (embedded data are prepared on first use)")
    options = {} if args.uncertainty is None else {"uncertainty": args.uncertainty}
    data = {"kind": args.kind, "location": None if args.data is None else str(args.data), "options": options}
    decoding = {"image_size": args.size, "cache_threads": max(args.workers, 1), "on_unreadable": args.on_error}
    read_by_kind = {field.name for field in fields(modality_for_kind(args.kind).settings_type)}  # images' only
    values = {"data": data, "cache_dir": None if args.cache_dir is None else str(args.cache_dir)}
    values.update({name: value for name, value in decoding.items() if name in read_by_kind})
    config = site_config_from_dict(values, where="prepare")
    prepared = prepare_cache(config, printer("prepare"), progress=not args.no_progress)
    print(prepared.summary)
    for path, reason in prepared.left_out[:20]:
        print(f"  skipped {path}: {reason}")
    if len(prepared.left_out) > 20:
        print(f"  ... and {len(prepared.left_out) - 20} more")
    if len(prepared.table) == 0:
        raise DatasetFormatError(f"none of the {config.modality.sample_noun} of {args.data} can be used (listed above)")
    print(f"{len(prepared.table)} {config.modality.sample_noun} ready for training")
    return 0
