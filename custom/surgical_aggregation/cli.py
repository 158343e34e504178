"""Command line: ``surgical-aggregation <command>`` (also ``python -m surgical_aggregation``).

* ``prepare``   decode and resize a dataset's images (or embed its reports) once into the cache;
* ``generate``  write the embedded (generated) datasets in the real NIH / CheXpert / MIMIC layouts;
* ``predict``   score a folder or CSV of images with a model: per-class probabilities by class name;
* ``evaluate``  per-class AUROC of a model on a labelled set (the classes both have), table + plot;
* ``export-bundle`` write a model as a MONAI Bundle (metadata with class names, TorchScript, ONNX, inference config);
* ``write-job`` (re)write a FLARE job folder of this bundle (e.g. ``jobs/nih_chexpert``) from its recipe;
* ``blind-secret`` make the consortium's secret for blind mode (``docs/blind.md``);
* ``simulate``  run one of the bundle's jobs in FLARE's simulator, one process per site, then summarise;
* ``check-site`` check a site config against the job it will run, before a federation does;
* ``setup-kit`` add this bundle's local/ files to a startup kit of FLARE's distributed provisioning;
* ``pretrain``  train the offline stand-in for ImageNet weights (DenseNet121 on generated pattern images);
* ``experiment`` run (or resume) a grid of the papers' comparisons and write tables and plots;
* ``poc``       rehearse a deployment locally: prepare, start, submit (wait, download), stop, run.

Each handler parses and calls. The project's own user errors (a bad config, a missing folder, a
wrong file) print one ``error:`` line and exit 2; anything else is a bug and shows its traceback.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

from .core.errors import DataNotFoundError, DatasetFormatError, SiteConfigError, UserError
from .data.names import UNCERTAINTY_POLICIES
from .data.storage import default_cache_root, write_atomically
from .flare.protocol import BUNDLE_JOBS, CODE_DELIVERIES, NIH_CHEXPERT, RESUME_CHOICES, TIMED_TASKS
from .flare.stopping import CommandInterrupted, stopped_cleanly
from .images.names import GENERATED_KINDS, ON_ERROR_POLICIES
from .images.settings import ACCEPT_NON_CHEST
from .modalities import DATA_KINDS

POC_STEPS = ("prepare", "start", "submit", "stop", "run")


def _user_path(text: str) -> Path:
    """A path option; ``~`` is the user's home even where the shell does not expand it (``--out=~/x``, a quoted
    value, a launcher that passes arguments as given)."""
    return Path(text).expanduser()


def _positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


POC_DEFAULT_JOB = Path("jobs/nih_chexpert")


def _add_prepare(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "prepare",
        help="build the preprocessing cache of a dataset (decode + resize every image, or embed every report, once)",
        description="Decode and resize every image of a dataset (or embed every report) once into the on-disk "
        "cache that training reads.",
    )
    parser.add_argument("--kind", required=True, choices=DATA_KINDS, help="what the data is, and its layout")
    parser.add_argument(
        "--data",
        type=_user_path,
        default=None,
        help="dataset folder (the CSV file for the CSV kinds); needed for image kinds; the IU reports default to "
        "torchxrayvision's archive",
    )
    parser.add_argument("--size", type=_positive, default=224, help="side of the cached square images (default 224)")
    parser.add_argument(
        "--cache-dir", type=_user_path, default=None, help=f"cache root (default {default_cache_root()})"
    )
    parser.add_argument("--workers", type=_positive, default=os.cpu_count() or 1, help="decoding threads")
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
        description="Write small generated datasets in the exact folder layouts of NIH, CheXpert, MIMIC-CXR-JPG, "
        "PadChest, VinDr-CXR, Google's NIH labels, RSNA and SIIM (the last five: real label rows only).",
    )
    parser.add_argument("--kind", choices=[*GENERATED_KINDS, "all"], default="all")
    parser.add_argument(
        "--out", required=True, type=_user_path, help="the dataset's folder for one --kind; for all, <out>/<kind> each"
    )
    parser.add_argument("--patients", type=_positive, default=200, help="patients per dataset")
    parser.add_argument("--size", type=_positive, default=64, help="image side in pixels")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--labels",
        choices=("auto", "reference", "builtin"),
        default="auto",
        help="label rows: real ones from torchxrayvision's files (reference), built-in frequencies, or auto",
    )


def _add_predict(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "predict",
        help="score images (or reports) with a model: one probability column per class name",
        description="Score a folder (recursively) or a CSV of images, or a CSV of report texts, with a saved model "
        "(its file says which it reads). Every input gets a row: its status ('ok', or why it could not be read) "
        "and one probability column per class name.",
    )
    parser.add_argument("--model", required=True, type=_user_path, help="e.g. .../app_server/best_FL_global_model.pt")
    parser.add_argument(
        "--input",
        "--images",
        dest="source",
        required=True,
        type=_user_path,
        help="a folder of images, a CSV with an image column, or (report models) a CSV with a text column",
    )
    parser.add_argument(
        "--column",
        "--image-column",
        dest="column",
        default=None,
        help="the CSV's image path column (default: path) or report text column (default: report)",
    )
    parser.add_argument("--out", required=True, type=_user_path, help="CSV file to write")
    parser.add_argument(
        "--calls",
        action="store_true",
        help="add a 0/1 column per class, positive at or above the threshold saved with the model (see evaluate "
        "--thresholds-out)",
    )
    _add_model_options(parser)


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="per-class AUROC of a model on a labelled set (only the classes the set has)",
        description="Evaluate a saved model on labelled data (images, or reports for a report model): per-class AUROC "
        "by class name, mean AUROC with a bootstrap 95% CI; writes per_class_auroc.csv/.png and summary.txt. With "
        "--thresholds-out, each class's threshold is chosen on the validation split (Youden's J), the test split is "
        "evaluated at it (accuracy, sensitivity, specificity), and a copy of the model carrying the thresholds is "
        "written for 'predict --calls'.",
    )
    parser.add_argument("--model", required=True, type=_user_path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--site-config", type=_user_path, help="use a site's data exactly as its config defines it")
    source.add_argument("--kind", choices=DATA_KINDS, help="what the labelled set is, and its layout (with --data)")
    parser.add_argument("--data", type=_user_path, help="dataset folder (or CSV file for --kind csv)")
    parser.add_argument("--uncertainty", choices=UNCERTAINTY_POLICIES, default=None)
    parser.add_argument(
        "--split",
        choices=("all", "train", "val", "test"),
        default="test",
        help="which patient-level split to evaluate on (default test; 'all' for an external set)",
    )
    parser.add_argument("--out", required=True, type=_user_path, help="folder for the table, plot and summary")
    parser.add_argument("--bootstrap", type=_positive, default=1000, help="bootstrap resamples for the CI")
    parser.add_argument(
        "--thresholds-out",
        type=_user_path,
        default=None,
        metavar="MODEL_FILE",
        help="choose per-class thresholds on the validation split, evaluate the test split at them, and write a copy "
        "of the model carrying them here",
    )
    _add_model_options(parser)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=_positive, default=None, help="override the size stored with the model")
    parser.add_argument(
        "--cache-dir", type=_user_path, default=None, help=f"cache root (default {default_cache_root()})"
    )
    parser.add_argument("--on-error", choices=ON_ERROR_POLICIES, default="skip", help="unreadable images")
    parser.add_argument(
        "--accept-non-chest",
        action="store_true",
        help="read DICOMs whose Modality or BodyPartExamined says they are no chest radiograph (refused by default)",
    )
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def _add_write_job(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("write-job", help="(re)write a FLARE job folder of this bundle from its recipe")
    parser.add_argument("--name", default=NIH_CHEXPERT, choices=BUNDLE_JOBS, help="which of the bundle's jobs")
    parser.add_argument(
        "--out",
        required=True,
        type=_user_path,
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
        default=None,
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
        type=_user_path,
        default=None,
        metavar="FILE",
        help="one of FLARE's privacy filters on every site's training results, as its update: a JSON file {\"path\": "
        '"exclude_vars" | "percentile" | "svt", "args": {...}} (see provisioning/README.md)',
    )
    parser.add_argument(
        "--label-aliases",
        type=_user_path,
        default=None,
        metavar="FILE",
        help='the consortium\'s synonyms for class names: a JSON/YAML mapping {"alias": "class name"}; they win '
        "over the built-in ones, and the server and every site apply them",
    )
    parser.add_argument(
        "--accepted-class",
        action="append",
        default=None,
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
        default=None,
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
        default=None,
        metavar="N",
        help="sites needed at the handshake, and valid results needed for a round to make a model (default: every "
        "site of the job)",
    )
    parser.add_argument(
        "--judging-site",
        action="append",
        default=None,
        metavar="SITE",
        help="a site whose validation losses select the best model and stop early (repeat for each; default: every "
        "accepted site, their median with three or more)",
    )
    for task in TIMED_TASKS:
        parser.add_argument(
            f"--{task}-timeout",
            type=int,
            default=None,
            metavar="SECONDS",
            help=f"seconds a site may take for a {task} task (default: the job's, sized for the embedded data)",
        )
    _add_site_config_option(parser)


def _add_site_config_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--site-config",
        action="append",
        default=[],
        metavar="SITE=FILE",
        help="use this site config file (e.g. real data) instead of the job's default for SITE; repeatable",
    )


def _site_configs(entries: Sequence[str], job_aliases: Mapping[str, str] | None = None) -> dict[str, dict]:
    """``--site-config SITE=FILE`` entries: site -> its config (loaded and checked for a job with ``job_aliases``)."""
    from .training.config import load_site_config

    sites = {}
    for entry in entries:
        site, separator, file = entry.partition("=")
        if not separator or not site or not file:
            raise SiteConfigError(f"--site-config takes SITE=FILE, got {entry!r}")
        sites[site] = load_site_config(file, job_aliases).to_dict()
    return sites


def _add_simulate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="run one of the bundle's jobs in FLARE's simulator (SimEnv): one process per site, the CPU cores "
        "shared among them, a summary of the results at the end",
    )
    parser.add_argument("--name", default=NIH_CHEXPERT, choices=BUNDLE_JOBS, help="which of the bundle's jobs")
    parser.add_argument(
        "--workspace",
        type=_user_path,
        default=Path("results/simulation"),
        help="FLARE's workspaces go to <workspace>/<job name> (default results/simulation)",
    )
    _add_site_config_option(parser)


def _add_poc(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "poc",
        help="rehearse a deployment with nvflare poc, isolated in its own workspace and config home",
        description="prepare: a POC with the job's site names; start: server and sites; submit: nvflare job "
        "submit, wait, download; stop: shut down and end every process start recorded (--clean: delete the "
        "workspace); run: all of these, stopping even on failure.",
    )
    parser.add_argument("step", choices=POC_STEPS)
    parser.add_argument(
        "--job", type=_user_path, default=POC_DEFAULT_JOB, help=f"job folder (default {POC_DEFAULT_JOB})"
    )
    parser.add_argument(
        "--workspace", type=_user_path, default=Path("poc/workspace"), help="POC workspace (default poc/workspace)"
    )
    parser.add_argument("--code", choices=CODE_DELIVERIES, default="byoc", help="prepare/run: the sites' code policy")
    parser.add_argument(
        "--as",
        dest="user",
        default="project_admin",
        help="submit/run: submit as this role (project_admin, lead, org_admin, member) or user name",
    )
    parser.add_argument("--out", type=_user_path, default=Path("results/poc"), help="submit/run: download folder")
    parser.add_argument("--timeout", type=float, default=3600, help="submit/run: seconds to wait for the job")
    parser.add_argument(
        "--clean", action="store_true", help="stop: also delete the workspace (run: deletes it when the job completes)"
    )


def _add_experiment(commands: argparse._SubParsersAction) -> None:
    from .core.methods import COMPARATORS
    from .core.strategies import STRATEGIES
    from .experiments.choices import CONTROLS, ENGINES, FLARE_ENGINE, FULL, GLYPHS, HEAD_FEATURES, MISSING, VARIANTS
    from .experiments.grids import GRIDS
    from .training.profiles import PROFILES

    parser = commands.add_parser(
        "experiment",
        help="run a grid of the papers' comparisons (FLARE simulator + baselines), then tables and plots",
        description="Run or resume a grid: settings x methods x seeds. Finished runs are skipped. Without data "
        "folders the embedded generated datasets are used (the demo profile runs in minutes on CPU).",
    )
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
    parser.add_argument("--rounds", type=_positive, default=None, help="override the profile's number of rounds")
    parser.add_argument("--out", required=True, type=_user_path, help="results folder (resumes when it exists)")
    parser.add_argument("--nih", default=None, help="NIH ChestX-ray14 folder (default: embedded data)")
    parser.add_argument("--chexpert", default=None, help="CheXpert folder (default: embedded data)")
    parser.add_argument("--mimic", default=None, help="MIMIC-CXR-JPG folder, the external test set (default: embedded)")
    parser.add_argument(
        "--embedded-patients",
        type=_positive,
        default=None,
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
    parser.add_argument("--pretrained", default=None, help="local ImageNet DenseNet121 weights for every model")
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
        "--jobs", type=_positive, default=1, help="runs at once, each in its own process (default 1; e.g. 8 on a GPU)"
    )
    parser.add_argument(
        "--loader-workers",
        type=int,
        default=None,
        help="each site's data loader processes (default: the site config's, auto; 0 with many --jobs on a GPU)",
    )
    parser.add_argument("--cpu-threads", type=_positive, default=None, help="torch CPU threads of each run's sites")
    parser.add_argument("--cache-dir", default=None, help=f"cache root (default {default_cache_root()})")
    parser.add_argument("--keep-workspaces", action="store_true", help="keep the FLARE simulator workspaces")
    parser.add_argument(
        "--tracking",
        choices=("tensorboard", "mlflow"),
        default="tensorboard",
        help="experiment tracking of each federation: TensorBoard (default) or MLflow (FLARE's receiver; an "
        "SQLite store, mlflow.db, in each run's folder)",
    )
    parser.add_argument("--bootstrap", type=_positive, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="write plan.json and each site's label counts (from the NIH label "
        "file: the real one when torchxrayvision's data is installed), train nothing",
    )
    parser.add_argument("--summarize-only", action="store_true", help="only redo tables and plots of finished runs")


def _experiment(args: argparse.Namespace) -> int:
    import dataclasses

    from .experiments.grids import DataSources, grid_settings
    from .experiments.planning import plan_grid
    from .experiments.runner import RunOptions, run_grid, write_plan
    from .experiments.summary import summarize
    from .training.profiles import PROFILES

    if args.summarize_only:
        print(f"wrote {summarize(args.out)}")
        return 0
    profile = PROFILES[args.profile]
    if args.rounds is not None:
        profile = dataclasses.replace(profile, rounds=args.rounds)
    patients = args.embedded_patients or profile.embedded_patients
    sources = DataSources(args.nih, args.chexpert, args.mimic, embedded_patients=patients)
    options = RunOptions(
        backbone_strategy=args.backbone,
        weighting=args.weighting,
        pretrained_weights=args.pretrained,
        pretrain=args.pretrain,
        bootstrap=args.bootstrap,
        keep_workspaces=args.keep_workspaces,
        tracking=args.tracking,
        cache_dir=args.cache_dir,
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
            {"grid": args.grid, "data": dataclasses.asdict(sources)},
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


def _output_file(path: Path, option: str) -> Path:
    """A file to write: refused when it is a folder (one line naming it), its folder made when missing."""
    if path.is_dir():
        raise SiteConfigError(f"{option} {path.resolve()} is a folder; give the file to write")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _given_preprocessing(args: argparse.Namespace) -> dict[str, int | bool]:
    """What ``--image-size`` gives a model file that does not record its image size, and ``--accept-non-chest``."""
    given: dict[str, int | bool] = {} if args.image_size is None else {"image_size": args.image_size}
    return given | ({ACCEPT_NON_CHEST: True} if args.accept_non_chest else {})


def _predict(args: argparse.Namespace) -> int:
    from .evaluation.inference import STATUS_COLUMN, score

    out = _output_file(args.out, "--out")
    scores, failures = score(
        args.model,
        args.source,
        args.column,
        _given_preprocessing(args),
        args.cache_dir,
        args.on_error,
        device=args.device,
        calls=args.calls,
    )
    scores.to_csv(out, index=False)
    classes = [column for column in scores.columns[2:] if not column.endswith(")")]
    print(f"scored {len(scores) - len(failures)} of {len(scores)} input(s) for {len(classes)} classes -> {out}")
    for path, reason in failures:
        print(f"  not scored {path}: {reason} ({STATUS_COLUMN} column of the output)")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .evaluation.inference import (
        evaluate_and_choose_thresholds,
        evaluate_on_table,
        labelled_splits,
        save_thresholds,
        write_evaluation,
    )

    splits, title = labelled_splits(args.site_config, args.kind, args.data, args.uncertainty)
    options = {
        "preprocessing": _given_preprocessing(args),
        "cache_dir": args.cache_dir,
        "on_error": args.on_error,
        "device": args.device,
        "bootstrap": args.bootstrap,
    }
    if args.thresholds_out is not None:
        target = _output_file(args.thresholds_out, "--thresholds-out")
        report = evaluate_and_choose_thresholds(args.model, splits, **options)
        title = title.format(split="test, thresholds from val")
    else:
        report = evaluate_on_table(args.model, splits[args.split], **options)
        title = title.format(split=args.split)
    print(f"{title}: {report.n_images} {report.noun}")
    print(report.text())
    for path in write_evaluation(report, args.out, title):
        print(f"wrote {path}")
    if args.thresholds_out is not None:
        saved = save_thresholds(
            args.model, report, title.replace("test, thresholds from val", "validation split"), target
        )
        print(f"wrote {saved}: the model with its thresholds (predict --calls)")
    return 0


def _write_job(args: argparse.Namespace) -> int:
    from .core.labels import label_aliases
    from .flare.recipe import BUNDLE_RECIPES, write_job  # imports FLARE: only for this command
    from .flare.update_privacy import read_privacy_filter

    aliases = label_aliases(args.label_aliases)
    sites = _site_configs(args.site_config, aliases)  # the sites' labels read as the job's sites read them
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
    )
    mode = f"{args.code}, blind" if args.blind else args.code
    print(f"wrote job {args.name!r} ({mode}) to {write_job(recipe, args.out, force=args.force)}")
    return 0


def _initial_model(path: str | None) -> str | None:
    """``--initial-model``: a model file of this bundle, checked here (the server reads the same path at start)."""
    if path is None:
        return None
    from .training.checkpoint import load_checkpoint

    file = Path(path).expanduser()
    if not file.is_file():
        what = "a folder" if file.is_dir() else "not found"
        raise DataNotFoundError(
            f"--initial-model {file}: {what}; give the model file (e.g. an earlier job's best_FL_global_model.pt), "
            "at the path the server will read it from"
        )
    load_checkpoint(file)  # a file that is not a model of this bundle is refused now, not when the job starts
    return str(file.resolve())


def _simulate(args: argparse.Namespace) -> int:
    from .flare.recipe import BUNDLE_RECIPES  # imports FLARE: only for this command
    from .flare.simulation import simulate

    recipe = BUNDLE_RECIPES[args.name](_site_configs(args.site_config))
    result = simulate(recipe, args.workspace)
    if result.earlier_results is not None and ".incomplete-" in result.earlier_results.name:
        print(f"an earlier run in this workspace had not finished (no results): moved to {result.earlier_results}")
    elif result.earlier_results is not None:
        print(f"the earlier results in this workspace were kept: moved to {result.earlier_results}")
    print("\n".join(result.summary()))
    return 0


def _poc(args: argparse.Namespace) -> int:
    from .flare.poc import USERS, PocWorkspace  # imports FLARE: only for this command

    poc = PocWorkspace(args.workspace)
    user = USERS.get(args.user, args.user)
    if args.step == "prepare":
        sites = poc.prepare(args.job, args.code)
        print(f"POC prepared in {poc.root} for {', '.join(sites)} ({args.code}); next: surgical-aggregation poc start")
        return 0
    if args.step == "start":
        record = poc.start()
        print(f"POC started (process group {record['process_group']}); logs: {poc.prod_dir}/<participant>/log.txt")
        return 0
    if args.step == "stop":
        poc.stop()
        if args.clean:
            poc.clean()
        print("POC stopped" + (" and its workspace deleted" if args.clean else ""))
        return 0
    if args.step == "submit":
        outcome = poc.submit_and_collect(args.job, user, args.out, args.timeout)
    else:
        outcome = poc.run(args.job, args.code, user, args.out, args.timeout)
    print(f"job {outcome.job_id}: {outcome.state}; downloaded to {outcome.downloaded} (models: workspace/app_server/)")
    if not outcome.completed:
        print(f"the participants' logs: {poc.prod_dir}/<participant>/{outcome.job_id}/log.txt", file=sys.stderr)
    return 0 if outcome.completed else 1


def _prepare(args: argparse.Namespace) -> int:
    from dataclasses import fields

    from .modalities.registry import modality_for_kind
    from .training.config import site_config_from_dict
    from .training.site_data import prepare_cache

    if args.data is None and args.kind in GENERATED_KINDS:
        raise SiteConfigError(f"--data is required for --kind {args.kind} (embedded data are prepared on first use)")
    options = {} if args.uncertainty is None else {"uncertainty": args.uncertainty}
    data = {"kind": args.kind, "location": None if args.data is None else str(args.data), "options": options}
    decoding = {"image_size": args.size, "cache_threads": max(args.workers, 1), "on_unreadable": args.on_error}
    read_by_kind = {field.name for field in fields(modality_for_kind(args.kind).settings_type)}  # images' only
    values = {"data": data, "cache_dir": None if args.cache_dir is None else str(args.cache_dir)}
    values.update({name: value for name, value in decoding.items() if name in read_by_kind})
    config = site_config_from_dict(values, where="prepare")
    prepared = prepare_cache(config, _printer("prepare"), progress=not args.no_progress)
    print(prepared.summary)
    for path, reason in prepared.left_out[:20]:
        print(f"  skipped {path}: {reason}")
    if len(prepared.left_out) > 20:
        print(f"  ... and {len(prepared.left_out) - 20} more")
    if len(prepared.table) == 0:
        raise DatasetFormatError(f"none of the {config.modality.sample_noun} of {args.data} can be used (listed above)")
    print(f"{len(prepared.table)} {config.modality.sample_noun} ready for training")
    return 0


def _generate(args: argparse.Namespace) -> int:
    from .images.synthetic import ensure_generated

    for kind in GENERATED_KINDS if args.kind == "all" else [args.kind]:
        dataset, created = ensure_generated(
            kind,
            args.out / kind if args.kind == "all" else args.out,
            n_patients=args.patients,
            image_size=args.size,
            seed=args.seed,
            label_source=args.labels,
        )
        print(("generated " if created else "already present: ") + dataset.describe())
    return 0


class _StdoutHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stdout`` is when a line is logged (it may be replaced, e.g. by a test)."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value) -> None:
        pass


def _printer(name: str) -> logging.Logger:
    """A logger that prints its messages as plain lines on stdout (what a command reports as it goes)."""
    printer = logging.getLogger(f"surgical_aggregation.cli.{name}")
    if not printer.handlers:
        handler = _StdoutHandler()
        handler.setFormatter(logging.Formatter("%(message)s"))
        printer.addHandler(handler)
        printer.setLevel(logging.INFO)
        printer.propagate = False
    return printer


def _add_check_site(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "check-site",
        help="check a site config against the job it will run: fields, preprocessing, labels, every input",
        description="Both sides of a job's handshake, before a federation runs: the site config read as the site "
        "reads it (the job's label aliases under its own), its data loaded and split, its labels read as the server "
        "reads them (new classes listed, closed vocabularies and limits applied), the federation's preprocessing "
        "compared, and every input of every split read as training reads it (--sample N: the first N of each). Exit "
        "code 0 when the site would pass the "
        "handshake, 2 with each problem on its own line otherwise.",
    )
    parser.add_argument(
        "--job", type=_user_path, default=POC_DEFAULT_JOB, help=f"the job folder (default {POC_DEFAULT_JOB})"
    )
    parser.add_argument(
        "--config", required=True, type=_user_path, help="the site config, e.g. <kit>/local/surgical_aggregation.json"
    )
    parser.add_argument(
        "--site", default=None, help="the site's name in the job (default: the kit's, else 'this site')"
    )
    parser.add_argument(
        "--sample", type=_positive, default=None, help="read only the first N inputs of each split (default: all)"
    )


def _check_site(args: argparse.Namespace) -> int:
    from .flare.site_check import check_site

    site = args.site
    if site is None and args.config.resolve().parent.name == "local":  # <kit>/local/<config>: the kit's name
        site = args.config.resolve().parent.parent.name
    result = check_site(args.job, args.config, site, args.sample)
    print("\n".join(result.lines))
    return 0 if result.passed else 2


def _add_export_bundle(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export-bundle",
        help="write a model as a MONAI Bundle: metadata with the class names, model.pt/.ts/.onnx, inference config",
        description="Export a saved global model (e.g. published_global_model.pt, or the server's "
        "best_FL_global_model.pt) as a MONAI Bundle that 'python -m monai.bundle run' and MONAI Deploy load: "
        "configs/metadata.json (outputs: per-class probabilities, channel_def = the class names; how many sites "
        "labelled each class; aliases; thresholds), configs/inference.json (a folder of images, or a CSV of "
        "reports, to predict's CSV), models/model.pt, model.ts and model.onnx (where the onnx extra is installed), "
        "docs/README.md. Next to a server's model, its union_classes.csv and round_history.json are read.",
    )
    parser.add_argument("model", type=_user_path, help="the model file")
    parser.add_argument("--out", required=True, type=_user_path, help="the bundle's folder (new, or empty)")
    parser.add_argument(
        "--union-table",
        type=_user_path,
        default=None,
        help="the server's union_classes.csv (default: next to the model)",
    )
    parser.add_argument(
        "--history", type=_user_path, default=None, help="the server's round_history.json (default: next to the model)"
    )
    parser.add_argument(
        "--label-aliases", type=_user_path, default=None, help="the job's alias file, reported with the class names"
    )
    onnx = parser.add_mutually_exclusive_group()
    onnx.add_argument("--onnx", dest="onnx", action="store_true", default=None, help="require model.onnx")
    onnx.add_argument("--no-onnx", dest="onnx", action="store_false", help="leave model.onnx out")
    parser.add_argument(
        "--min-sites",
        type=_positive,
        default=1,
        help="leave out the classes fewer than this many sites label (needs the union table; default 1: none)",
    )
    parser.add_argument("--version", default="1.0.0", help="the bundle's version (default 1.0.0)")
    parser.add_argument("--authors", default=None, help="metadata's authors (default: the federation's sites)")
    parser.add_argument("--copyright", default=None, help="metadata's copyright holder (default: the sites)")
    parser.add_argument("--overwrite", action="store_true", help="replace the folder when it exists")


def _export_bundle(args: argparse.Namespace) -> int:
    from .core.labels import job_vocabulary, label_aliases
    from .deployment.bundle import export_bundle, read_history, read_union_counts

    named = {"authors": args.authors, "copyright": args.copyright}
    exported = export_bundle(
        args.model,
        args.out,
        sites_labelling=None if args.union_table is None else read_union_counts(args.union_table),
        history=None if args.history is None else read_history(args.history),
        vocabulary=job_vocabulary(label_aliases(args.label_aliases)),
        onnx=args.onnx,
        min_sites=args.min_sites,
        version=args.version,
        overwrite=args.overwrite,
        **{key: value for key, value in named.items() if value is not None},
    )
    print("\n".join(exported.summary()))
    print(f"run it: cd {args.out} && python -m monai.bundle run --config_file configs/inference.json ...")
    return 0


def _add_setup_kit(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "setup-kit",
        help="add this bundle's local/ files to a kit made by FLARE's distributed provisioning (nvflare package)",
        description="Write this bundle's local/ files (resources.json with the site launcher or allow-list, "
        "authorization.json, privacy.json with the jobs' scope, a site's config template) into a startup kit that "
        "'nvflare package' assembled at its participant, as provisioning/project.yml's builder does for kits made "
        "centrally; the server's kit also gets its heartbeat timeout. The kit's startup files say its role.",
    )
    parser.add_argument("kit", type=_user_path, help="the participant's kit folder (.../prod_00/<name>)")
    parser.add_argument("--code", choices=CODE_DELIVERIES, default="byoc", help="how the code reaches the sites")
    parser.add_argument(
        "--job",
        type=_user_path,
        default=POC_DEFAULT_JOB,
        help=f"the job the site's config template follows ({POC_DEFAULT_JOB})",
    )
    parser.add_argument("--data-kind", choices=DATA_KINDS, default=None, help="a site's data kind (its template's)")


def _setup_kit(args: argparse.Namespace) -> int:
    from .flare.deploy import setup_kit

    written = setup_kit(args.kit, args.code, args.job, args.data_kind)
    print("\n".join(f"wrote {path}" for path in written) or f"{args.kit}: an admin's kit needs no local files")
    return 0


def _add_pretrain(commands: argparse._SubParsersAction) -> None:
    from .training.profiles import PROFILES

    parser = commands.add_parser(
        "pretrain",
        help="train the offline stand-in for ImageNet weights: DenseNet121 on generated pattern images",
        description="Train a DenseNet121 backbone centrally on generated pattern images (4x4 patterns in the sites' "
        "clutter, no finding of any site) with a profile's image size and recipe, and write it where --pretrained "
        "reads it (cached by its settings). FedBN+ freezes BatchNorm at the initial model's statistics: this gives it "
        "statistics to freeze when no ImageNet weights are at hand. 'experiment' does this by itself when needed.",
    )
    parser.add_argument(
        "--profile", choices=sorted(PROFILES), default="demo", help="image size and recipe (default demo)"
    )
    parser.add_argument(
        "--images", type=_positive, default=None, help="generated pattern images (default: the profile's)"
    )
    parser.add_argument("--epochs", type=_positive, default=None, help="training epochs (default: the profile's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=None, help=f"cache root (default {default_cache_root()})")


def _pretrain(args: argparse.Namespace) -> int:
    import dataclasses

    from .experiments.pretraining import Pretraining, pretrained_backbone
    from .training.profiles import PROFILES

    profile = PROFILES[args.profile]
    pretraining = Pretraining.for_profile(profile)
    changes = {"images": args.images, "epochs": args.epochs, "seed": args.seed}
    pretraining = dataclasses.replace(
        pretraining, **{key: value for key, value in changes.items() if value is not None}
    )
    path = pretrained_backbone(profile, pretraining, args.cache_dir)
    print(f"{pretraining.describe()}: {path} (use it with --pretrained)")
    return 0


def _add_blind_secret(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "blind-secret",
        help="make the consortium's secret for blind mode (one site makes it and hands it to the others, never to "
        "the server)",
    )
    parser.add_argument("--out", required=True, type=_user_path, help="e.g. <site workspace>/local/blind_secret.json")
    classes = parser.add_mutually_exclusive_group(required=True)
    classes.add_argument("--classes", nargs="+", metavar="NAME", help="the consortium's class list (any spelling)")
    classes.add_argument(
        "--job", choices=BUNDLE_JOBS, help="the union of the classes of one of the bundle's jobs' default sites"
    )
    parser.add_argument("--label-aliases", type=_user_path, default=None, metavar="FILE", help="the job's aliases")
    parser.add_argument("--force", action="store_true", help="replace --out when it exists")


def _blind_secret(args: argparse.Namespace) -> int:
    from .core.blind import BlindSecret
    from .core.labels import job_vocabulary, label_aliases

    aliases = label_aliases(args.label_aliases)
    if args.job:
        from .flare.recipe import BUNDLE_RECIPES  # imports FLARE: only for --job

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


def _labels_of(config: Mapping, aliases: Mapping[str, str]) -> list[str]:
    from .training.config import site_config_from_dict
    from .training.site_data import resolve_table

    return list(resolve_table(site_config_from_dict(config, job_aliases=aliases)).classes)


HANDLERS = {
    "prepare": (_add_prepare, _prepare),
    "generate": (_add_generate, _generate),
    "predict": (_add_predict, _predict),
    "evaluate": (_add_evaluate, _evaluate),
    "export-bundle": (_add_export_bundle, _export_bundle),
    "write-job": (_add_write_job, _write_job),
    "blind-secret": (_add_blind_secret, _blind_secret),
    "simulate": (_add_simulate, _simulate),
    "check-site": (_add_check_site, _check_site),
    "setup-kit": (_add_setup_kit, _setup_kit),
    "pretrain": (_add_pretrain, _pretrain),
    "experiment": (_add_experiment, _experiment),
    "poc": (_add_poc, _poc),
}


def build_parser() -> argparse.ArgumentParser:
    """The command line's parser (every command and option), as the docs' commands are checked against it."""
    parser = argparse.ArgumentParser(prog="surgical-aggregation", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for add_parser, _ in HANDLERS.values():
        add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        with stopped_cleanly():
            return HANDLERS[args.command][1](args)
    except CommandInterrupted as stop:
        print(f"{args.command}: {stop}", file=sys.stderr)
        return stop.exit_code
    except UserError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
