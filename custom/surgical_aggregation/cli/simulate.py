"""Run one of the bundle's jobs in FLARE's simulator, one process per site, then print a summary of its results;
earlier results in the workspace are moved aside, not overwritten."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..flare.protocol import BUNDLE_JOBS, NIH_CHEXPERT
from .options import add_site_config_option, add_start_option, site_configs, start_option, user_path

NAME = "simulate"
HELP = (
    "run one of the bundle's jobs in FLARE's simulator (SimEnv): one process per site, the CPU cores "
    "shared among them, a summary of the results at the end"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=NIH_CHEXPERT, choices=BUNDLE_JOBS, help="which of the bundle's jobs")
    parser.add_argument(
        "--workspace",
        type=user_path,
        default=Path("results/simulation"),
        help="FLARE's workspaces go to <workspace>/<job name> (default results/simulation)",
    )
    add_start_option(parser)
    add_site_config_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..flare.recipe import BUNDLE_RECIPES  # imports FLARE: only for this command
    from ..flare.simulation import simulate

    start = start_option(args, args.name, server_here=True)
    recipe = BUNDLE_RECIPES[args.name](site_configs(args.site_config), **start)
    result = simulate(recipe, args.workspace)
    if result.earlier_results is not None and ".incomplete-" in result.earlier_results.name:
        print(f"an earlier run in this workspace had not finished (no results): moved to {result.earlier_results}")
    elif result.earlier_results is not None:
        print(f"the earlier results in this workspace were kept: moved to {result.earlier_results}")
    print("\n".join(result.summary()))
    return 0
