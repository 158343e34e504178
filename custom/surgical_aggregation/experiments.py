"""The experiment runner: a grid of settings x comparators x seeds, run, evaluated and summarised.

For each run, federated comparators are written as FLARE jobs (``flare.job.write_job``) and run
in ``nvflare simulator``; centralized and individual models are trained by the same site
trainer without FLARE. Every model is then evaluated on the setting's held-out test sets (and
the external set) by class name. Each run's folder gets ``result.json`` and
``per_class_auroc.csv`` when it finishes, so an interrupted grid resumes where it stopped.

Layout of ``<out>``::

    plan.json                              settings: sites, label sets, test sets
    runs/<setting>/<method>/seed<k>/       result.json, per_class_auroc.csv, logs, models/
    per_class_auroc.csv                    every run, every test set, every class
    summary.csv / summary.md               the papers' table: mean AUROC (95% CI), p vs surgical aggregation
    shared_vs_unique.csv                   mean AUROC over classes every site holds vs the others
    plots/                                 mean AUROC vs K / psi / N per method; per-class AUROC per setting
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from .baselines import train_pooled
from .config import SiteConfig, site_config_from_dict
from .data.cache import default_cache_root
from .inference import EvaluationReport, evaluate_models
from .methods import COMPARATOR_LABELS, COMPARATORS, POOLED_COMPARATORS, controller_arguments
from .metrics import paired_t_test
from .plots import plot_metric_vs_factor, plot_per_class_by_method
from .simulation import DataSources, Profile, Setting, dataset_identity, full_dataset_config, grid_settings
from .site import prepare_site_data, resolve_table, split_table

logger = logging.getLogger(__name__)
REFERENCE_METHOD = "surgical"
RESULT_FILE = "result.json"
PER_CLASS_FILE = "per_class_auroc.csv"


@dataclass
class RunOptions:
    """How the runs of a grid are executed (the same for every run)."""

    backbone_strategy: str = "fedbn_plus"  # the papers' (FedBN+): BatchNorm frozen, never averaged
    weighting: str = "uniform"
    pretrained_weights: str | None = None  # local ImageNet DenseNet121 checkpoint for every model
    bootstrap: int = 1000
    keep_workspaces: bool = False
    simulator_timeout: int = 24 * 3600
    cpu_threads: int | None = None  # torch threads per site; default: the machine's cores / sites
    cache_dir: str | None = None


@dataclass
class Run:
    setting: Setting
    method: str
    seed: int

    def folder(self, out: Path) -> Path:
        return out / "runs" / self.setting.name / self.method / f"seed{self.seed}"

    @property
    def title(self) -> str:
        return f"{self.setting.name} / {self.method} / seed {self.seed}"


def _sites_for_run(run: Run, options: RunOptions) -> dict[str, dict[str, Any]]:
    threads = options.cpu_threads or max(1, (os.cpu_count() or 1) // len(run.setting.sites))
    return {
        name: _for_run(config, run, options) | {"cpu_threads": threads} for name, config in run.setting.sites.items()
    }


def _for_run(config: dict[str, Any], run: Run, options: RunOptions) -> dict[str, Any]:
    """A site's or test set's config for this run: its seed, new partitions when the setting asks, the cache."""
    values = {**config, "seed": run.seed}
    if run.setting.repartition:
        values["data"] = {**config["data"], "split_seed": run.seed}
    if options.cache_dir:
        values["cache_dir"] = options.cache_dir
    return values


def _nvflare() -> str:
    beside_python = Path(sys.executable).parent / "nvflare"
    return str(beside_python) if beside_python.is_file() else "nvflare"


def _run_federated(run: Run, folder: Path, profile: Profile, options: RunOptions) -> dict[str, list[Path]]:
    """Write and simulate the run's FLARE job; returns the models to evaluate, by dataset identity."""
    from .flare.controller import PERSONAL_MODELS_DIR  # FLARE only where a federation runs
    from .flare.job import JobSpec, write_job

    sites = _sites_for_run(run, options)
    controller = {
        "num_rounds": profile.rounds,
        "min_clients": len(sites),
        "patience": profile.patience,
        **controller_arguments(run.method, options.backbone_strategy, options.weighting),
    }
    architecture = site_config_from_dict(next(iter(sites.values())), run.title).architecture
    persistor = {"in_channels": 1, "seed": run.seed, "architecture": architecture}
    if architecture == "densenet121":
        persistor["pretrained_weights"] = options.pretrained_weights
    spec = JobSpec(f"{run.setting.name}-{run.method}", sites, controller, persistor, cross_site_evaluation=False)
    job = write_job(spec, folder / "job")
    workspace = folder / "workspace"
    shutil.rmtree(workspace, ignore_errors=True)
    command = [_nvflare(), "simulator", str(job), "-w", str(workspace), "-t", str(len(sites))]
    logger.info("running %s", " ".join(command))
    with open(folder / "simulator.log", "w") as log:
        result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, timeout=options.simulator_timeout)
    if result.returncode != 0:
        raise RuntimeError(f"{run.title}: the simulator failed (exit {result.returncode}); see {folder}/simulator.log")
    app = workspace / "server" / "simulate_job" / "app_server"
    models = folder / "models"
    models.mkdir(exist_ok=True)
    for name in ("round_history.json", "training_curves.png"):
        if (app / name).is_file():
            shutil.copy2(app / name, folder / name)
    chosen: dict[str, list[Path]] = {}
    if controller["method"] == "personal":
        for site, config in sites.items():
            source = app / PERSONAL_MODELS_DIR / f"best_{site}.pt"
            target = models / f"{site}.pt"
            shutil.copy2(source if source.is_file() else app / PERSONAL_MODELS_DIR / f"{site}.pt", target)
            chosen.setdefault(dataset_identity(config), []).append(target)
    else:
        source = app / "best_FL_global_model.pt"
        target = models / "global.pt"
        shutil.copy2(source if source.is_file() else app / "FL_global_model.pt", target)
        chosen["*"] = [target]
    if not options.keep_workspaces:
        shutil.rmtree(workspace, ignore_errors=True)
    return chosen


def _run_pooled(run: Run, folder: Path, profile: Profile, options: RunOptions) -> dict[str, list[Path]]:
    """Centralized (all sites pooled) or individual (one model per dataset), trained without FLARE."""
    sites = _sites_for_run(run, options)
    models = folder / "models"
    if run.method in ("centralized", "centralized_full"):
        if run.method == "centralized_full":  # every site labels the whole union (its dataset labels it all)
            union = list(dict.fromkeys(name for labels in run.setting.label_sets.values() for name in labels))
            sites = {site: {**config, "data": {**config["data"], "labels": union}} for site, config in sites.items()}
        configs = {site: site_config_from_dict(config, f"{run.title} {site}") for site, config in sites.items()}
        path = models / f"{run.method}.pt"
        train_pooled(configs, profile.rounds, path, profile.patience, name=run.method)
        return {"*": [path]}
    chosen: dict[str, list[Path]] = {}
    by_dataset = {dataset_identity(config): config for config in sites.values()}
    for index, (identity, config) in enumerate(sorted(by_dataset.items())):
        widened = site_config_from_dict(full_dataset_config(config), f"{run.title} dataset {identity}")
        path = models / f"individual-{index}.pt"
        train_pooled({identity: widened}, profile.rounds, path, profile.patience, name=f"individual {identity}")
        chosen[identity] = [path]
    return chosen


def _models_for(test_identity: str, models: dict[str, list[Path]]) -> list[Path]:
    """A test set drawn from a dataset is scored by that dataset's own models when there are some
    (PFL's personal models, the individual model); otherwise by all of them, averaged per class."""
    if "*" in models:
        return models["*"]
    if test_identity in models:
        return models[test_identity]
    return [path for paths in models.values() for path in paths]


def evaluate_run(run: Run, models: dict[str, list[Path]], options: RunOptions) -> tuple[pd.DataFrame, dict]:
    """Per-class AUROC on every test set of the setting, and the mean AUROC with its bootstrap CI."""
    rows, summary = [], {}
    for test in run.setting.test_sets:
        config = site_config_from_dict(_for_run(test.config, run, options), f"test set {test.name}")
        paths = _models_for(dataset_identity(test.config), models)
        if config.architecture == "report_mlp":
            report = _evaluate_reports(paths, config, options)
        else:
            table = resolve_table(config)
            table = table if test.split == "all" else split_table(table, config)[test.split]
            report = evaluate_models(paths, table, cache_dir=config.cache_dir, bootstrap=options.bootstrap)
        frame = report.per_class.assign(test_set=test.name)
        rows.append(frame)
        summary[test.name] = {
            "mean_auroc": report.mean_auroc.estimate, "ci_low": report.mean_auroc.low,
            "ci_high": report.mean_auroc.high, "classes": int(frame["auroc"].notna().sum()), "images": report.n_images,
        }  # fmt: skip
        for column in ("accuracy", "sensitivity", "specificity"):
            if column in frame:
                summary[test.name][f"mean_{column}"] = float(frame[column].mean())
    return pd.concat(rows, ignore_index=True), summary


def _evaluate_reports(paths: list[Path], config: SiteConfig, options: RunOptions) -> EvaluationReport:
    """Report labellers: AUROC on the test split, Youden thresholds from the validation split."""
    from .reports.evaluation import evaluate_report_models

    data = prepare_site_data(config)  # the same table, embeddings (cached) and splits the sites used
    return evaluate_report_models(paths, data.val, data.test, options.bootstrap, config.device)


def execute(run: Run, out: Path, profile: Profile, options: RunOptions) -> dict:
    """Train (unless finished before) and evaluate one run; returns its result."""
    folder = run.folder(out)
    result_path = folder / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    train = _run_pooled if run.method in POOLED_COMPARATORS else _run_federated
    models = train(run, folder, profile, options)
    trained = time.perf_counter() - started
    per_class, summary = evaluate_run(run, models, options)
    per_class.to_csv(folder / PER_CLASS_FILE, index=False)
    result = {
        "setting": run.setting.name, "factor": run.setting.factor, "value": run.setting.value,
        "method": run.method, "seed": run.seed, "train_seconds": round(trained, 1),
        "seconds": round(time.perf_counter() - started, 1), "test_sets": summary,
    }  # fmt: skip
    result_path.write_text(json.dumps(result, indent=2) + "\n")  # last: its presence marks the run finished
    return result


def plan(settings: Sequence[Setting], methods: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    unknown = [method for method in methods if method not in COMPARATORS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; choose from {list(COMPARATORS)}")
    return [Run(setting, method, seed) for setting in settings for seed in seeds for method in methods]


def run_grid(
    grid: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    sources: DataSources,
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    only: Sequence[str] = (),
) -> Path:
    """Run (or resume) a named grid and write its summary; returns the summary's path.

    ``only`` restricts the grid to the settings whose name contains one of the given strings.
    """
    settings = grid_settings(grid, sources, profile)
    if only:
        settings = [s for s in settings if any(part in s.name for part in only)]
        if not settings:
            raise ValueError(f"no setting of grid {grid!r} matches {list(only)}")
    return run_settings(settings, methods, seeds, profile, out, options, {"grid": grid, "data": asdict(sources)})


def run_settings(
    settings: Sequence[Setting],
    methods: Sequence[str],
    seeds: Sequence[int],
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    description: dict[str, Any] | None = None,
) -> Path:
    """Run every (setting, seed, method) not finished yet, with progress logs, then summarise."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(settings, methods, seeds)
    (out / "plan.json").write_text(
        json.dumps(
            {**(description or {}), "profile": asdict(profile), "methods": list(methods), "seeds": list(seeds),
             "options": asdict(options),
             "settings": [{"name": s.name, "factor": s.factor, "value": s.value, "label_sets": s.label_sets,
                           "shared_classes": s.shared_classes, "sites": s.sites,
                           "test_sets": [asdict(t) for t in s.test_sets]} for s in settings]},
            indent=2,
        ) + "\n"
    )  # fmt: skip
    os.environ.setdefault("SURGICAL_AGGREGATION_CACHE", str(options.cache_dir or default_cache_root()))
    started = time.perf_counter()
    for index, run in enumerate(runs, start=1):
        done = (run.folder(out) / RESULT_FILE).is_file()
        logger.info("[%d/%d] %s%s", index, len(runs), run.title, " (finished before: skipped)" if done else "")
        result = execute(run, out, profile, options)
        means = ", ".join(f"{name} {values['mean_auroc']:.3f}" for name, values in result["test_sets"].items())
        logger.info(
            "[%d/%d] %s: mean AUROC %s (%.0f s; %.0f s elapsed)",
            index, len(runs), run.title, means, result["seconds"], time.perf_counter() - started,
        )  # fmt: skip
    return summarize(out)


# --- summary ------------------------------------------------------------------------------------


def collect(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All finished runs: (results, one row per test set; per-class AUROC with a ``shared`` column)."""
    planned = json.loads((out / "plan.json").read_text())
    shared = {s["name"]: set(s["shared_classes"]) for s in planned["settings"]}
    results, per_class = [], []
    for path in sorted((out / "runs").glob(f"*/*/seed*/{RESULT_FILE}")):
        result = json.loads(path.read_text())
        for test_set, values in result["test_sets"].items():
            results.append({key: result[key] for key in ("setting", "factor", "value", "method", "seed")}
                           | {"test_set": test_set, **values})  # fmt: skip
        frame = pd.read_csv(path.parent / PER_CLASS_FILE)
        frame = frame.assign(setting=result["setting"], factor=result["factor"], value=result["value"],
                             method=result["method"], seed=result["seed"])  # fmt: skip
        frame["shared"] = frame["class_name"].isin(shared.get(result["setting"], set()))
        per_class.append(frame)
    if not results:
        raise FileNotFoundError(f"no finished run under {out / 'runs'}")
    order = {method: rank for rank, method in enumerate(planned["methods"])}  # the table follows --methods
    results_frame = pd.DataFrame(results)
    results_frame = results_frame.sort_values(
        ["value", "seed", "method"], key=lambda column: column.map(order) if column.name == "method" else column,
        kind="stable",
    )  # fmt: skip
    return results_frame.reset_index(drop=True), pd.concat(per_class, ignore_index=True)


def _reference(methods: Sequence[str]) -> str | None:
    if REFERENCE_METHOD in methods:
        return REFERENCE_METHOD
    return next((m for m in methods if m.startswith(REFERENCE_METHOD)), None)


def summary_table(results: pd.DataFrame, per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC (95% CI) per setting / test set / method / seed, with paired t-tests across classes
    against surgical aggregation (Shapiro-Wilk on the differences; Wilcoxon alongside)."""
    reference = _reference(list(results["method"].unique()))
    rows = []
    keys = ["setting", "test_set", "seed"]
    for (setting, test_set, seed), group in results.groupby(keys, sort=False):
        classes = per_class[(per_class.setting == setting) & (per_class.test_set == test_set)
                            & (per_class.seed == seed)]  # fmt: skip
        by_method = {m: frame.set_index("class_name")["auroc"] for m, frame in classes.groupby("method")}
        for row in group.itertuples(index=False):
            entry = row._asdict()
            entry["label"] = COMPARATOR_LABELS.get(row.method, row.method)
            entry.update(p_value=math.nan, shapiro_p=math.nan, wilcoxon_p=math.nan, mean_difference=math.nan)
            if reference and row.method != reference and reference in by_method:
                ours, theirs = by_method[reference].align(by_method[row.method], join="inner")
                try:
                    test = paired_t_test(ours.to_numpy(), theirs.to_numpy())
                    entry.update(p_value=test.p_value, shapiro_p=test.shapiro_p, wilcoxon_p=test.wilcoxon_p,
                                 mean_difference=test.mean_difference)  # fmt: skip
                except ValueError as error:  # fewer than two defined pairs
                    logger.warning("%s %s %s: no paired test (%s)", setting, test_set, row.method, error)
            rows.append(entry)
    return pd.DataFrame(rows)


def shared_vs_unique(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC over the classes every site holds, and over the others (held by some sites only)."""
    grouped = per_class.groupby(["setting", "test_set", "method", "seed", "shared"])["auroc"].mean().unstack()
    grouped = grouped.rename(columns={True: "shared_classes", False: "other_classes"}).reset_index()
    for column in ("shared_classes", "other_classes"):
        if column not in grouped:
            grouped[column] = math.nan
    return grouped[["setting", "test_set", "method", "seed", "shared_classes", "other_classes"]]


def _number(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _markdown(table: pd.DataFrame, reference: str | None) -> str:
    lines = []
    thresholded = "mean_accuracy" in table and table["mean_accuracy"].notna().any()  # report labellers
    extra_header = " accuracy / sensitivity / specificity (Youden) |" if thresholded else ""
    for (setting, test_set), group in table.groupby(["setting", "test_set"], sort=False):
        lines += [f"### {setting} — {test_set} test set", "",
                  f"| method | seed | mean AUROC (95% CI) |{extra_header} classes | p vs {reference or '-'} "
                  "| Shapiro-Wilk p |",
                  "| --- | --- | --- |" + (" --- |" if thresholded else "") + " --- | --- | --- |"]  # fmt: skip
        for row in group.itertuples(index=False):
            p = "—" if math.isnan(row.p_value) else f"{row.p_value:.3g}"
            shapiro = "—" if math.isnan(row.shapiro_p) else f"{row.shapiro_p:.3g}"
            extra = (
                f" {row.mean_accuracy:.3f} / {row.mean_sensitivity:.3f} / {row.mean_specificity:.3f} |"
                if thresholded
                else ""
            )
            lines.append(
                f"| {row.label} | {row.seed} | {row.mean_auroc:.3f} ({row.ci_low:.3f}–{row.ci_high:.3f}) |{extra}"
                f" {row.classes} | {p} | {shapiro} |"
            )
        lines.append("")
    return "\n".join(lines)


def summarize(out: str | Path) -> Path:
    """Write the tables and plots of every finished run under ``out``; returns ``summary.md``."""
    out = Path(out)
    results, per_class = collect(out)
    per_class.to_csv(out / PER_CLASS_FILE, index=False)
    table = summary_table(results, per_class)
    table.to_csv(out / "summary.csv", index=False)
    reference = _reference(list(results["method"].unique()))
    text = _markdown(table, reference)
    split = shared_vs_unique(per_class)
    split.to_csv(out / "shared_vs_unique.csv", index=False)
    text += "\n### Classes every site holds vs the others (mean AUROC)\n\n| setting | test set | method | seed | shared | others |\n| --- | --- | --- | --- | --- | --- |\n"  # noqa: E501
    for row in split.itertuples(index=False):
        text += (f"| {row.setting} | {row.test_set} | {COMPARATOR_LABELS.get(row.method, row.method)} | {row.seed} "
                 f"| {_number(row.shared_classes)} | {_number(row.other_classes)} |\n")  # fmt: skip
    path = out / "summary.md"
    path.write_text(text)
    _plots(results, per_class, out / "plots")
    return path


def _plots(results: pd.DataFrame, per_class: pd.DataFrame, folder: Path) -> None:
    """Mean AUROC vs the grid's factor (mean over seeds; band = CI for one seed, seed range otherwise),
    and per-class AUROC per setting and test set (seed mean)."""
    for (factor, test_set), group in results.groupby(["factor", "test_set"]):
        curves: dict[str, list[tuple[float, float, float, float]]] = {}
        for (method, value), points in group.groupby(["method", "value"]):
            if len(points) == 1:
                band = (points["ci_low"].iloc[0], points["ci_high"].iloc[0])
            else:
                band = (points["mean_auroc"].min(), points["mean_auroc"].max())
            curves.setdefault(method, []).append((value, points["mean_auroc"].mean(), *band))
        if group["value"].nunique() > 1:
            plot_metric_vs_factor(curves, folder / f"mean_auroc_vs_{factor}_{test_set}.png", factor,
                                  f"{test_set} test set", COMPARATOR_LABELS)  # fmt: skip
    for (setting, test_set), group in per_class.groupby(["setting", "test_set"]):
        means = group.groupby(["method", "class_name"], sort=False)["auroc"].mean()
        aurocs = {method: means[method].to_dict() for method in group["method"].unique()}
        shared = sorted(set(group.loc[group["shared"], "class_name"]))
        plot_per_class_by_method(aurocs, folder / f"per_class_{setting}_{test_set}.png",
                                 f"{setting}: {test_set} test set", COMPARATOR_LABELS, shared)  # fmt: skip
