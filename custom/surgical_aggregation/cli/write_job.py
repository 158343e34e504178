"""Write a FLARE job folder of this bundle (e.g. jobs/nih_chexpert) from its recipe: the server's settings, each
site's config and the code policy; an existing folder is replaced only when write-job wrote it and nobody changed it
since (or with --force)."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..core.errors import DataNotFoundError
from ..flare.protocol import BUNDLE_JOBS, CODE_DELIVERIES, NIH_CHEXPERT, RESUME_CHOICES, TIMED_TASKS
from .options import add_site_config_option, add_start_option, site_configs, start_option, user_path

NAME = "write-job"
HELP = "(re)write a FLARE job folder of this bundle from its recipe"


def _initial_model(path: str | None) -> str | None:
    """``--initial-model``: a model file of this bundle, checked here (the server reads the same path at start)."""
    if path is None:
        return None
    from ..training.checkpoint import load_checkpoint

    file = Path(path).expanduser()
    if not file.is_file():
        what = "a folder" if file.is_dir() else "not found"
        raise DataNotFoundError(
            f"--initial-model {file}: {what}; give the model file (e.g. an earlier job's best_FL_global_model.pt), "
            "at the path the server will read it from"
        )
    load_checkpoint(file)  # a file that is not a model of this bundle is refused now, not when the job starts
    return str(file.resolve())


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default=NIH_CHEXPERT, choices=BUNDLE_JOBS, help="which of the bundle's jobs")
    parser.add_argument(
        "--out",
        required=True,
        type=user_path,
        help="job folder to write: absent, empty, or a job folder write-job wrote and nobody changed",
    )
    parser.add_argument(
        "--force", action="store_true", help="replace --out even if it holds other files (they are deleted)"
    )
    parser.add_argument(
        "--code",
        choices=CODE_DELIVERIES,
        default="byoc",
        help="byoc (default): each site app has custom/ and the submitter needs the byoc right; preinstalled: no "
        "custom/, the package is installed at every participant and allow-listed in local/resources.json",
    )
    parser.add_argument(
        "--ship-library", action="store_true", help="byoc: also copy the surgical_aggregation package into custom/"
    )
    parser.add_argument(
        "--initial-model",
        help="continue a federation: start from this checkpoint of the bundle (e.g. the last job's best model, "
        "as the server sees the path); its classes keep their learned rows, new classes get new ones",
    )
    parser.add_argument(
        "--no-publish",
        action="store_true",
        help="keep the final global model on the server (by default it is published to every site at the end)",
    )
    parser.add_argument(
        "--site-to-site-evaluation",
        action="store_true",
        help="add FLARE's cross-site evaluation of the sites' local models; it REVEALS each site's class set and "
        "a model trained on its data alone to the other sites",
    )
    parser.add_argument(
        "--privacy-filter",
        type=user_path,
        metavar="FILE",
        help="one of FLARE's privacy filters on every site's training results, as its update: a JSON file {\"path\": "
        '"exclude_vars" | "percentile" | "svt", "args": {...}} (see provisioning/README.md)',
    )
    parser.add_argument(
        "--label-aliases",
        type=user_path,
        metavar="FILE",
        help='the consortium\'s synonyms for class names: a JSON/YAML mapping {"alias": "class name"}; they win '
        "over the built-in ones, and the server and every site apply them",
    )
    parser.add_argument(
        "--accepted-class",
        action="append",
        metavar="NAME",
        help="a closed vocabulary: a class the job accepts (repeat for each); a site bringing any other is refused "
        "at the handshake. Default: any class joins",
    )
    parser.add_argument(
        "--blind",
        action="store_true",
        help="blind mode: the server adds ciphertexts and learns no class name, row or site's backbone; every site "
        "needs the consortium's secret (blind-secret, and blind_secret in its site config). See docs/blind.md",
    )
    parser.add_argument(
        "--resume",
        choices=RESUME_CHOICES,
        help="an unfinished federation of this job's name on the server (after a crash): latest (default) continues "
        "from its last saved round, backup from the state saved one round earlier, never starts afresh",
    )
    parser.add_argument(
        "--leave-out",
        action="append",
        default=[],
        metavar="SITE",
        help="run the job without this site (repeat for each): e.g. a site an earlier job's screening named; it is "
        "left out of the job's deploy map and apps",
    )
    parser.add_argument(
        "--min-clients",
        type=int,
        metavar="N",
        help="sites needed at the handshake, and valid results needed for a round to make a model (default: every "
        "site of the job)",
    )
    parser.add_argument(
        "--judging-site",
        action="append",
        metavar="SITE",
        help="a site whose validation losses select the best model and stop early (repeat for each; default: every "
        "accepted site, their median with three or more)",
    )
    for task in TIMED_TASKS:
        parser.add_argument(
            f"--{task}-timeout",
            type=int,
            metavar="SECONDS",
            help=f"seconds a site may take for a {task} task (default: the job's, sized for the embedded data)",
        )
    add_start_option(parser)
    add_site_config_option(parser)


def run(args: argparse.Namespace) -> int:
    from ..core.labels import label_aliases
    from ..flare.recipe import BUNDLE_RECIPES, write_job  # imports FLARE: only for this command
    from ..flare.update_privacy import read_privacy_filter

    aliases = label_aliases(args.label_aliases)
    sites = site_configs(args.site_config, aliases)  # the sites' labels read as the job's sites read them
    # FLARE runs an in-process script only from the job's custom/ folder
    execution = "external_process" if args.code == "preinstalled" else "in_process"
    controller = {f"{task}_timeout": getattr(args, f"{task}_timeout") for task in TIMED_TASKS}
    controller.update(resume=args.resume, judging_sites=args.judging_site, min_clients=args.min_clients)
    recipe = BUNDLE_RECIPES[args.name](
        sites,
        controller={name: value for name, value in controller.items() if value is not None},
        code=args.code,
        client_execution=execution,
        ship_library=args.ship_library,
        initial_model=_initial_model(args.initial_model),
        publish_global_model=not args.no_publish,
        site_to_site_evaluation=args.site_to_site_evaluation,
        label_aliases=aliases,
        accepted_classes=args.accepted_class,
        update_privacy=None if args.privacy_filter is None else read_privacy_filter(args.privacy_filter),
        blind=args.blind,
        left_out=args.leave_out,
        **start_option(args, args.name, server_here=False),
    )
    mode = f"{args.code}, blind" if args.blind else args.code
    print(f"wrote job {args.name!r} ({mode}) to {write_job(recipe, args.out, force=args.force)}")
    return 0
