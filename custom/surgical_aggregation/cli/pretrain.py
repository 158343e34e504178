"""Train a DenseNet121 backbone centrally on generated pattern images (32 glyph-like 5x5 shapes in the sites'
clutter, no finding of any site) at a profile's image size with the pretraining's own recipe, and write it where
--pretrained reads it (cached by its settings). FedBN+ freezes BatchNorm at the initial model's statistics: this gives
it statistics to freeze when no ImageNet weights are at hand. 'experiment' and the main job start from the copy the
bundle ships of the profiles' stand-in (built by this command on another machine); this command trains one here."""

from __future__ import annotations

import argparse

from .options import add_cache_dir, positive

NAME = "pretrain"
HELP = "train the offline stand-in for ImageNet weights: DenseNet121 on generated pattern images"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..training.profiles import PROFILES

    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="demo", help="image size and budget (default demo)"
    )
    parser.add_argument("--images", type=positive, help="generated pattern images (default: the profile's)")
    parser.add_argument("--epochs", type=positive, help="training epochs (default: the profile's)")
    parser.add_argument("--seed", type=int, default=0)
    add_cache_dir(parser)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ..experiments.pretraining import Pretraining, pretrained_backbone
    from ..training.profiles import PROFILES

    profile = PROFILES[args.profile]
    pretraining = Pretraining.for_profile(profile)
    changes = {"images": args.images, "epochs": args.epochs, "seed": args.seed}
    pretraining = dataclasses.replace(
        pretraining, **{key: value for key, value in changes.items() if value is not None}
    )
    path = pretrained_backbone(pretraining, args.cache_dir, shipped=False)
    print(f"{pretraining.describe()}: {path} (use it with --pretrained)")
    return 0
