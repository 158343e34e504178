"""Both sides of a job's handshake, before a federation runs: the site config read as the site reads it (the job's
label aliases under its own), its data loaded and split, its labels read as the server reads them (new classes
listed, closed vocabularies and limits applied), the federation's preprocessing compared, and every input of every
split read as training reads it (--sample N: the first N of each). Exit code 0 when the site would pass the
handshake, 2 with each problem on its own line otherwise."""

from __future__ import annotations

import argparse

from .options import POC_DEFAULT_JOB, positive, user_path

NAME = "check-site"
HELP = "check a site config against the job it will run: fields, preprocessing, labels, every input"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--job", type=user_path, default=POC_DEFAULT_JOB, help=f"the job folder (default {POC_DEFAULT_JOB})"
    )
    parser.add_argument(
        "--config", required=True, type=user_path, help="the site config, e.g. <kit>/local/surgical_aggregation.json"
    )
    parser.add_argument("--site", help="the site's name in the job (default: the kit's, else 'this site')")
    parser.add_argument("--sample", type=positive, help="read only the first N inputs of each split (default: all)")


def run(args: argparse.Namespace) -> int:
    from ..flare.site_check import check_site

    site = args.site
    if site is None and args.config.resolve().parent.name == "local":  # <kit>/local/<config>: the kit's name
        site = args.config.resolve().parent.parent.name
    result = check_site(args.job, args.config, site, args.sample)
    print("\n".join(result.lines))
    return 0 if result.passed else 2
