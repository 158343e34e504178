"""Command line: ``surgical-aggregation <command>`` (also ``python -m surgical_aggregation``).

* ``prepare``   decode and resize a dataset's images once into the preprocessing cache;
* ``generate``  write the embedded (generated) datasets in the real NIH / CheXpert / MIMIC layouts;
* ``predict``   score a folder or CSV of images with a model: per-class probabilities by class name;
* ``evaluate``  per-class AUROC of a model on a labelled set (the classes both have), table + plot;
* ``write-job`` (re)write a FLARE job folder of this bundle (e.g. ``jobs/nih_chexpert``);
* ``experiment`` run (or resume) a grid of the papers' comparisons and write tables and plots;
* ``poc``       rehearse a deployment locally: prepare, start, submit (wait, download), stop, run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from .data.cache import ON_ERROR_POLICIES, default_cache_root
from .data.images import ImageLoadError
from .data.sources import DATASET_KINDS, load_table
from .data.synthetic import GENERATORS, ensure_generated
from .data.table import UNCERTAINTY_POLICIES, DatasetFormatError
from .labels import UnknownLabelError
from .reports.data import REPORT_KINDS, load_reports
from .reports.embeddings import MINILM

USER_ERRORS = (
    FileNotFoundError,
    DatasetFormatError,
    UnknownLabelError,
    ImageLoadError,
    ValueError,
    KeyError,
    TypeError,
)


def _add_prepare(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "prepare",
        help="build the preprocessing cache of a dataset (decode + resize every image, or embed every report, once)",
        description="Decode and resize every image of a dataset (or embed every report) once into the on-disk "
        "cache that training reads.",
    )
    parser.add_argument(
        "--kind", required=True, choices=DATASET_KINDS + REPORT_KINDS, help="on-disk layout of the dataset"
    )
    parser.add_argument(
        "--data",
        type=Path,
        default=None,
        help="dataset folder (the CSV file for csv and report_csv; iu_reports: default torchxrayvision's archive)",
    )
    parser.add_argument("--size", type=int, default=224, help="side of the cached square images (default 224)")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"cache root (default {default_cache_root()})")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="decoding threads")
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
        description="Write small generated datasets in the exact NIH, CheXpert and MIMIC-CXR-JPG folder layouts.",
    )
    parser.add_argument("--kind", choices=[*GENERATORS, "all"], default="all")
    parser.add_argument("--out", required=True, type=Path, help="parent folder; each kind goes to <out>/<kind>")
    parser.add_argument("--patients", type=int, default=200, help="patients per dataset")
    parser.add_argument("--size", type=int, default=64, help="image side in pixels")
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
        help="score images with a model: one probability column per class name",
        description="Score a folder (recursively) or a CSV of images with a saved model.",
    )
    parser.add_argument("--model", required=True, type=Path, help="e.g. .../app_server/best_FL_global_model.pt")
    parser.add_argument("--images", required=True, type=Path, help="a folder of images, or a CSV with an image column")
    parser.add_argument("--image-column", default="path", help="the CSV's image path column (default: path)")
    parser.add_argument("--out", required=True, type=Path, help="CSV to write: path + one column per class")
    _add_model_options(parser)


def _add_evaluate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "evaluate",
        help="per-class AUROC of a model on a labelled set (only the classes the set has)",
        description="Evaluate a saved model on labelled data: per-class AUROC by class name, mean AUROC with a "
        "bootstrap 95%% CI; writes per_class_auroc.csv/.png and summary.txt.",
    )
    parser.add_argument("--model", required=True, type=Path)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--site-config", type=Path, help="use a site's data exactly as its config defines it")
    source.add_argument("--kind", choices=DATASET_KINDS, help="on-disk layout of the labelled set (with --data)")
    parser.add_argument("--data", type=Path, help="dataset folder (or CSV file for --kind csv)")
    parser.add_argument("--uncertainty", choices=UNCERTAINTY_POLICIES, default=None)
    parser.add_argument(
        "--split",
        choices=("all", "train", "val", "test"),
        default="test",
        help="which patient-level split to evaluate on (default test; 'all' for an external set)",
    )
    parser.add_argument("--out", required=True, type=Path, help="folder for the table, plot and summary")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CI")
    _add_model_options(parser)


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--image-size", type=int, default=None, help="override the size stored with the model")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"cache root (default {default_cache_root()})")
    parser.add_argument("--on-error", choices=ON_ERROR_POLICIES, default="skip", help="unreadable images")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")


def _add_write_job(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("write-job", help="(re)write a FLARE job folder of this bundle")
    parser.add_argument("--name", default="nih_chexpert", help="which of the bundle's jobs (default nih_chexpert)")
    parser.add_argument("--out", required=True, type=Path, help="job folder to write (replaced if present)")
    parser.add_argument(
        "--code",
        choices=("byoc", "preinstalled"),
        default="byoc",
        help="byoc (default): the job has app/custom/ and needs the submitter's byoc right; preinstalled: no "
        "custom/, the package is installed at every participant and allow-listed in local/resources.json",
    )
    parser.add_argument(
        "--ship-library", action="store_true", help="byoc: also copy the surgical_aggregation package into app/custom/"
    )


POC_STEPS = ("prepare", "start", "submit", "stop", "run")
POC_DEFAULT_JOB = Path("jobs/nih_chexpert")


def _add_poc(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "poc",
        help="rehearse a deployment with nvflare poc, isolated in its own workspace and config home",
        description="prepare: a POC with the job's site names; start: server and sites; submit: nvflare job "
        "submit, wait, download; stop: shut down and end every process start recorded (--clean: delete the "
        "workspace); run: all of these, stopping even on failure.",
    )
    parser.add_argument("step", choices=POC_STEPS)
    parser.add_argument("--job", type=Path, default=POC_DEFAULT_JOB, help=f"job folder (default {POC_DEFAULT_JOB})")
    parser.add_argument(
        "--workspace", type=Path, default=Path("poc/workspace"), help="POC workspace (default poc/workspace)"
    )
    parser.add_argument(
        "--code", choices=("byoc", "preinstalled"), default="byoc", help="prepare/run: the sites' code policy"
    )
    parser.add_argument(
        "--as",
        dest="user",
        default="project_admin",
        help="submit/run: submit as this role (project_admin, lead, org_admin, member) or user name",
    )
    parser.add_argument("--out", type=Path, default=Path("results/poc"), help="submit/run: download folder")
    parser.add_argument("--timeout", type=float, default=3600, help="submit/run: seconds to wait for the job")
    parser.add_argument(
        "--clean", action="store_true", help="stop: also delete the workspace (run: deletes it when the job completes)"
    )


def _add_experiment(commands: argparse._SubParsersAction) -> None:
    from .methods import COMPARATORS
    from .simulation import GRIDS, PROFILES

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
    parser.add_argument("--rounds", type=int, default=None, help="override the profile's number of rounds")
    parser.add_argument("--out", required=True, type=Path, help="results folder (resumes when it exists)")
    parser.add_argument("--nih", default=None, help="NIH ChestX-ray14 folder (default: embedded data)")
    parser.add_argument("--chexpert", default=None, help="CheXpert folder (default: embedded data)")
    parser.add_argument("--mimic", default=None, help="MIMIC-CXR-JPG folder, the external test set (default: embedded)")
    parser.add_argument("--embedded-patients", type=int, default=400, help="patients per embedded dataset")
    parser.add_argument(
        "--backbone",
        choices=("fedavg", "fedbn_plus"),
        default="fedbn_plus",
        help="backbone strategy of every federated method that does not fix its own (default fedbn_plus, the papers')",
    )
    parser.add_argument("--weighting", choices=("uniform", "samples"), default="uniform", help="aggregation weights")
    parser.add_argument("--pretrained", default=None, help="local ImageNet DenseNet121 weights for every model")
    parser.add_argument("--only", nargs="+", default=[], help="run only settings whose name contains one of these")
    parser.add_argument("--cache-dir", default=None, help=f"cache root (default {default_cache_root()})")
    parser.add_argument("--keep-workspaces", action="store_true", help="keep the FLARE simulator workspaces")
    parser.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the CIs")
    parser.add_argument(
        "--dry-run", action="store_true", help="write plan.json and each site's label counts (from the NIH label "
        "file: the real one when torchxrayvision's data is installed), train nothing"
    )  # fmt: skip
    parser.add_argument("--summarize-only", action="store_true", help="only redo tables and plots of finished runs")


def _experiment(args: argparse.Namespace) -> int:
    import dataclasses

    import pandas as pd

    from .experiments import RunOptions, run_grid, summarize
    from .simulation import PROFILES, DataSources, grid_settings, nih_label_table, site_label_counts

    if args.summarize_only:
        print(f"wrote {summarize(args.out)}")
        return 0
    profile = PROFILES[args.profile]
    if args.rounds is not None:
        profile = dataclasses.replace(profile, rounds=args.rounds)
    sources = DataSources(args.nih, args.chexpert, args.mimic, embedded_patients=args.embedded_patients)
    if args.dry_run:
        table, origin = nih_label_table(sources)
        settings = [s for s in grid_settings(args.grid, sources, profile) if s.factor != "labels"]
        if not settings:
            raise ValueError(f"grid {args.grid!r} has no simulated NIH setting to plan")
        counts = pd.concat([site_label_counts(setting, table) for setting in settings], ignore_index=True)
        args.out.mkdir(parents=True, exist_ok=True)
        counts.to_csv(args.out / "site_label_counts.csv", index=False)
        for setting in settings:
            print(f"{setting.name}: shared {setting.shared_classes}")
            for site, labels in setting.label_sets.items():
                train = counts[(counts.setting == setting.name) & (counts.site == site) & (counts.split == "train")]
                print(f"  {site}: {len(labels)} labels, {train['images'].iloc[0]} training images: {labels}")
        print(f"label counts from {origin} -> {args.out / 'site_label_counts.csv'}")
        return 0
    options = RunOptions(
        backbone_strategy=args.backbone,
        weighting=args.weighting,
        pretrained_weights=args.pretrained,
        bootstrap=args.bootstrap,
        keep_workspaces=args.keep_workspaces,
        cache_dir=args.cache_dir,
    )
    summary = run_grid(args.grid, args.methods, args.seeds, sources, profile, args.out, options, args.only)
    print(summary.read_text())
    print(f"wrote {summary} (tables, plots/ and per-run folders under {args.out})")
    return 0


def _predict(args: argparse.Namespace) -> int:
    from .inference import list_images, score_images

    paths = list_images(args.images, args.image_column)
    scores, failures = score_images(
        args.model, paths, args.image_size, args.cache_dir, args.on_error, device=args.device
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    scores.to_csv(args.out, index=False)
    print(f"scored {len(scores)} image(s) for {len(scores.columns) - 1} classes -> {args.out}")
    for path, reason in failures[:20]:
        print(f"  skipped {path}: {reason}")
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from .data.splits import patient_split
    from .inference import evaluate_on_table, write_evaluation

    if args.site_config is not None:
        from .config import load_site_config
        from .site import resolve_table, split_table

        config = load_site_config(args.site_config)
        table = resolve_table(config)
        table = table if args.split == "all" else split_table(table, config)[args.split]
        title = f"{args.site_config.stem} ({args.split})"
    else:
        if args.data is None:
            raise ValueError("--kind needs --data (the dataset folder, or the CSV for --kind csv)")
        options = {} if args.uncertainty is None else {"uncertainty": args.uncertainty}
        table = load_table(args.kind, args.data, **options)
        table = table if args.split == "all" else patient_split(table)[args.split]
        title = f"{args.kind} {args.data.name} ({args.split})"
    report = evaluate_on_table(
        args.model,
        table,
        image_size=args.image_size,
        cache_dir=args.cache_dir,
        on_error=args.on_error,
        device=args.device,
        bootstrap=args.bootstrap,
    )
    print(f"{title}: {report.n_images} images")
    print(report.text())
    for path in write_evaluation(report, args.out, title):
        print(f"wrote {path}")
    return 0


def _write_job(args: argparse.Namespace) -> int:
    from .flare.job import JOB_SPECS, write_job  # imports FLARE: only for this command

    if args.name not in JOB_SPECS:
        raise ValueError(f"unknown job {args.name!r}; the bundle's jobs are {sorted(JOB_SPECS)}")
    spec = JOB_SPECS[args.name]()
    spec.code, spec.ship_library = args.code, args.ship_library
    if args.code == "preinstalled":
        spec.client_execution = "external_process"  # FLARE runs in-process scripts only from custom/
    folder = write_job(spec, args.out)
    print(f"wrote job {args.name!r} ({args.code}) to {folder}")
    return 0


def _poc(args: argparse.Namespace) -> int:
    from .flare.poc import PocError

    try:
        return _poc_step(args)
    except PocError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _poc_step(args: argparse.Namespace) -> int:
    from .flare.poc import COMPLETED, USERS, PocWorkspace  # imports FLARE: only for this command

    poc = PocWorkspace(args.workspace)
    user = USERS.get(args.user, args.user)

    def submit() -> int:
        job_id = poc.submit(args.job, user)
        state = poc.wait(job_id, args.timeout)
        downloaded = poc.download(job_id, args.out)
        print(f"job {job_id}: {state}; downloaded to {downloaded} (models: workspace/app_server/)")
        if state != COMPLETED:
            print(f"the participants' logs: {poc.prod_dir}/<participant>/{job_id}/log.txt", file=sys.stderr)
        return 0 if state == COMPLETED else 1

    if args.step == "prepare":
        sites = poc.prepare(args.job, args.code)
        print(f"POC prepared in {poc.root} for {', '.join(sites)} ({args.code}); next: surgical-aggregation poc start")
    elif args.step == "start":
        record = poc.start()
        print(f"POC started (process group {record['process_group']}); logs: {poc.prod_dir}/<participant>/log.txt")
    elif args.step == "submit":
        return submit()
    elif args.step == "stop":
        poc.stop()
        if args.clean:
            poc.clean()
        print("POC stopped" + (" and its workspace deleted" if args.clean else ""))
    else:
        poc.prepare(args.job, args.code)
        status = 1
        try:
            poc.start()
            status = submit()
        finally:
            poc.stop()
        if status == 0:  # kept otherwise, for its logs
            poc.clean()
        return status
    return 0


def _prepare(args: argparse.Namespace) -> int:
    from .data.dataset import cache_table

    if args.kind in REPORT_KINDS:
        return _prepare_reports(args)
    if args.data is None:
        raise ValueError(f"--data is required for --kind {args.kind}")
    options = {} if args.uncertainty is None else {"uncertainty": args.uncertainty}
    table = load_table(args.kind, args.data, **options)
    print(f"{args.kind} data at {args.data}: {len(table)} images of {table.n_patients} patients")
    kept, _, report = cache_table(
        table,
        args.cache_dir or default_cache_root(),
        args.size,
        on_error=args.on_error,
        workers=args.workers,
        progress=not args.no_progress,
    )
    print(report.summary())
    for path, reason in report.failures[:20]:
        print(f"  skipped {path}: {reason}")
    if len(report.failures) > 20:
        print(f"  ... and {len(report.failures) - 20} more")
    print(f"{len(kept)} images ready for training")
    return 0


def _prepare_reports(args: argparse.Namespace) -> int:
    from .reports.dataset import embed_table

    table, summary = load_reports(args.kind, args.data)
    print(summary.describe())
    embed_table(table, args.cache_dir or default_cache_root(), MINILM, progress=not args.no_progress)
    print(f"{len(table)} reports embedded ({MINILM}) and ready for training")
    return 0


def _generate(args: argparse.Namespace) -> int:
    kinds = list(GENERATORS) if args.kind == "all" else [args.kind]
    for kind in kinds:
        dataset, created = ensure_generated(
            kind,
            args.out / kind,
            n_patients=args.patients,
            image_size=args.size,
            seed=args.seed,
            label_source=args.labels,
        )
        print(("generated " if created else "already present: ") + dataset.describe())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="surgical-aggregation", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_prepare(commands)
    _add_generate(commands)
    _add_predict(commands)
    _add_evaluate(commands)
    _add_write_job(commands)
    _add_experiment(commands)
    _add_poc(commands)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    handlers = {
        "prepare": _prepare,
        "generate": _generate,
        "predict": _predict,
        "evaluate": _evaluate,
        "write-job": _write_job,
        "experiment": _experiment,
        "poc": _poc,
    }
    try:
        return handlers[args.command](args)
    except USER_ERRORS as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
