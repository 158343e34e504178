"""Make the consortium's secret for blind mode (docs/blind.md): one site makes it and hands it to the others, never
to the server."""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from typing import BinaryIO

from ..core.errors import SiteConfigError
from ..data.storage import write_atomically
from ..flare.protocol import BUNDLE_JOBS
from .options import user_path

NAME = "blind-secret"
HELP = "make the consortium's secret for blind mode (one site makes it and hands it to the others, never to the server)"


def _labels_of(config: Mapping, aliases: Mapping[str, str]) -> list[str]:
    from ..training.config import site_config_from_dict
    from ..training.site_data import resolve_table

    return list(resolve_table(site_config_from_dict(config, job_aliases=aliases)).classes)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", required=True, type=user_path, help="e.g. <site workspace>/local/blind_secret.json")
    classes = parser.add_mutually_exclusive_group(required=True)
    classes.add_argument("--classes", nargs="+", metavar="NAME", help="the consortium's class list (any spelling)")
    classes.add_argument(
        "--job", choices=BUNDLE_JOBS, help="the union of the classes of one of the bundle's jobs' default sites"
    )
    parser.add_argument("--label-aliases", type=user_path, metavar="FILE", help="the job's aliases")
    parser.add_argument("--force", action="store_true", help="replace --out when it exists")


def run(args: argparse.Namespace) -> int:
    from ..core.blind import BlindSecret
    from ..core.labels import job_vocabulary, label_aliases

    aliases = label_aliases(args.label_aliases)
    if args.job:
        from ..flare.recipe import BUNDLE_RECIPES  # imports FLARE: only for --job

        configs = BUNDLE_RECIPES[args.job]().site_configs.values()
        names = sorted({name for config in configs for name in _labels_of(config, aliases)})
    else:
        names = args.classes
    classes = sorted(job_vocabulary(aliases, None).canonical_list(names, "--classes"))
    if args.out.exists() and not args.force:
        raise SiteConfigError(f"{args.out} exists: a new secret would lock its sites out of their federation; pass "
                              "--force to replace it")  # fmt: skip
    secret = BlindSecret.new(classes)
    text = secret.to_json().encode()

    def owner_only(handle: BinaryIO) -> None:  # made its owner's only before the secret is in it
        os.fchmod(handle.fileno(), 0o600)
        handle.write(text)

    write_atomically(args.out, owner_only, "blind secret")
    print(
        f"wrote the blind secret of {len(classes)} classes to {args.out} (readable by its owner only). Copy it to "
        "every site's local/ folder over a channel the server does not run, and set blind_secret in each site "
        f"config. Each site can compare the consortium's fingerprint: {secret.fingerprint}"
    )
    return 0
