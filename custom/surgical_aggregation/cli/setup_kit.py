"""Write this bundle's local/ files (resources.json with the site launcher or allow-list, authorization.json,
privacy.json with the jobs' scope, a site's config template) into a startup kit that 'nvflare package' assembled at
its participant, as provisioning/project.yml's builder does for kits made centrally; the server's kit also gets its
heartbeat timeout. The kit's startup files say its role."""

from __future__ import annotations

import argparse

from ..flare.protocol import CODE_DELIVERIES
from ..modalities import DATA_KINDS
from .options import POC_DEFAULT_JOB, user_path

NAME = "setup-kit"
HELP = "add this bundle's local/ files to a kit made by FLARE's distributed provisioning (nvflare package)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("kit", type=user_path, help="the participant's kit folder (.../prod_00/<name>)")
    parser.add_argument("--code", choices=CODE_DELIVERIES, default="byoc", help="how the code reaches the sites")
    parser.add_argument(
        "--job",
        type=user_path,
        default=POC_DEFAULT_JOB,
        help=f"the job the site's config template follows ({POC_DEFAULT_JOB})",
    )
    parser.add_argument("--data-kind", choices=DATA_KINDS, help="a site's data kind (its template's)")


def run(args: argparse.Namespace) -> int:
    from ..flare.deploy import setup_kit

    written = setup_kit(args.kit, args.code, args.job, args.data_kind)
    print("\n".join(f"wrote {path}" for path in written) or f"{args.kit}: an admin's kit needs no local files")
    return 0
