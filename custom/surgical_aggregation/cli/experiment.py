"""Run or resume a grid: settings x methods x seeds. Finished runs are skipped. Without data folders the embedded
generated datasets are used (the demo profile runs in minutes on CPU)."""

from __future__ import annotations

import argparse

from .options import add_cache_dir, add_co_occurrence, positive, user_path

NAME = "experiment"
HELP = "run a grid of the papers' comparisons (FLARE simulator + baselines), then tables and plots"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from ..core.methods import COMPARATORS
    from ..core.strategies import STRATEGIES
    from ..experiments.choices import CONTROLS, ENGINES, FLARE_ENGINE, FULL, GLYPHS, HEAD_FEATURES, MISSING, VARIANTS
    from ..experiments.grids import GRIDS
    from ..training.profiles import PROFILES

    parser.add_argument("--grid", choices=GRIDS, default="small", help="which settings (default: small)")
    parser.add_argument(
        "--methods",
        nargs="+",
        choices=COMPARATORS,
        default=["surgical", "vanilla", "partial_loss", "centralized"],
        metavar="METHOD",
        help="comparators to run (default: surgical vanilla partial_loss centralized); any of "
        + ", ".join(COMPARATORS),
    )
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="training seeds (default: 0)")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="demo", help="training recipe (default demo)")
    parser.add_argument("--rounds", type=positive, help="override the profile's number of rounds")
    parser.add_argument("--out", required=True, type=user_path, help="results folder (resumes when it exists)")
    parser.add_argument("--nih", help="NIH ChestX-ray14 folder (default: embedded data)")
    parser.add_argument("--chexpert", help="CheXpert folder (default: embedded data)")
    parser.add_argument("--mimic", help="MIMIC-CXR-JPG folder, the external test set (default: embedded)")
    parser.add_argument(
        "--embedded-patients",
        type=positive,
        help="patients per embedded dataset (default: the profile's)",
    )
    parser.add_argument(
        "--controls",
        nargs="+",
        choices=CONTROLS,
        default=[MISSING],
        help="simulated grids: each setting with a site's unlabelled findings in its images (missing, the default, "
        "as in real data) and/or drawn as decoys (absent: the control, embedded data only)",
    )
    add_co_occurrence(parser)
    parser.add_argument(
        "--builtin-labels",
        action="store_true",
        help="run embedded data without torchxrayvision's label files: its labels are then drawn at built-in "
        "frequencies, each finding on its own (another dataset than the grids', whose labels are real rows)",
    )
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        default=FULL,
        help="train the whole network (full, the default) or only the heads on the frozen initial backbone's "
        "features (head_only: seconds per federation on a CPU)",
    )
    parser.add_argument(
        "--head-features",
        choices=HEAD_FEATURES,
        default=GLYPHS,
        help="head_only: read the images with the findings' glyph detectors (glyphs, the default; embedded data) or "
        "with the initial model's frozen backbone (backbone)",
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=FLARE_ENGINE,
        help="where a full-network federation runs: FLARE's simulator (flare, the default) or the same loop in this "
        "process (inprocess: no process per site and job, for grids of many federations on a GPU)",
    )
    parser.add_argument(
        "--backbone",
        choices=[name for name, each in STRATEGIES.items() if not each.personal_methods_only],
        default="fedbn_plus",
        help="backbone strategy of every federated method that does not fix its own (default fedbn_plus, the papers')",
    )
    parser.add_argument("--weighting", choices=("uniform", "samples"), default="uniform", help="aggregation weights")
    parser.add_argument("--pretrained", help="local ImageNet DenseNet121 weights for every model")
    parser.add_argument(
        "--pretrain",
        choices=("auto", "always", "never"),
        default="auto",
        help="without --pretrained: start every model from a backbone trained first on generated pattern images "
        "(see 'pretrain'): always, never, or auto (when FedBN+ needs BatchNorm statistics and the data is "
        "embedded; FedBN+ on real data without --pretrained is refused)",
    )
    parser.add_argument("--only", nargs="+", default=[], help="run only settings whose name contains one of these")
    parser.add_argument(
        "--jobs", type=positive, default=1, help="runs at once, each in its own process (default 1; e.g. 8 on a GPU)"
    )
    parser.add_argument(
        "--loader-workers",
        type=int,
        help="each site's data loader processes (default: the site config's, auto; 0 with many --jobs on a GPU)",
    )
    parser.add_argument("--cpu-threads", type=positive, help="torch CPU threads of each run's sites")
    add_cache_dir(parser)
    parser.add_argument("--keep-workspaces", action="store_true", help="keep the FLARE simulator workspaces")
    parser.add_argument(
        "--tracking",
        choices=("tensorboard", "mlflow"),
        default="tensorboard",
        help="experiment tracking of each federation: TensorBoard (default) or MLflow (FLARE's receiver; an "
        "SQLite store, mlflow.db, in each run's folder)",
    )
    parser.add_argument("--bootstrap", type=positive, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write plan.json and each site's label counts (from the NIH label "
        "file: the real one when torchxrayvision's data is installed), train nothing",
    )
    parser.add_argument("--summarize-only", action="store_true", help="only redo tables and plots of finished runs")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from ..core.errors import DataNotFoundError
    from ..experiments.grid_run import grid_description, run_grid, write_plan
    from ..experiments.grids import DataSources, grid_settings
    from ..experiments.planning import plan_grid
    from ..experiments.runner import RunOptions
    from ..experiments.summary import summarize
    from ..training.profiles import PROFILES

    if args.summarize_only:
        print(f"wrote {summarize(args.out)}")
        return 0
    profile = PROFILES[args.profile]
    if args.rounds is not None:
        profile = dataclasses.replace(profile, rounds=args.rounds)
    patients = args.embedded_patients or profile.embedded_patients
    sources = DataSources(
        args.nih, args.chexpert, args.mimic, embedded_patients=patients, co_occurrence=args.co_occurrence
    )
    missing = sources.missing_label_files()
    if missing and not args.builtin_labels:
        raise DataNotFoundError(
            f"{', '.join(missing)} of torchxrayvision's data folder not installed here, so the embedded labels would "
            "be drawn at built-in frequencies, not the grids' real label rows: install it ('pip install --no-deps "
            "torchxrayvision==1.5.7'; on a lent GPU machine, carry its wheel) or pass --builtin-labels"
        )
    options = RunOptions(
        backbone_strategy=args.backbone,
        weighting=args.weighting,
        pretrained_weights=args.pretrained,
        pretrain=args.pretrain,
        bootstrap=args.bootstrap,
        keep_workspaces=args.keep_workspaces,
        tracking=args.tracking,
        cache_dir=None if args.cache_dir is None else str(args.cache_dir),
        variant=args.variant,
        engine=args.engine,
        head_features=args.head_features,
        loader_workers=args.loader_workers,
        cpu_threads=args.cpu_threads,
    )
    if args.dry_run:  # the initial model is decided (and the stand-in trained) when the grid runs
        settings = grid_settings(args.grid, sources, profile, args.controls)
        plan = write_plan(
            args.out,
            settings,
            args.methods,
            args.seeds,
            profile,
            options,
            grid_description(args.grid, sources),
        )
        print("\n".join(plan_grid(settings, sources, args.out)))
        print(f"wrote {plan}")
        return 0
    summary = run_grid(
        args.grid, args.methods, args.seeds, sources, profile, args.out, options, args.only, args.controls, args.jobs
    )
    print(summary.read_text())
    print(f"wrote {summary} (tables, plots/ and per-run folders under {args.out})")
    return 0
