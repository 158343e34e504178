"""The experiment runner: a grid of settings x comparators x seeds, run, evaluated and summarised.

Federated comparators run as :class:`~surgical_aggregation.flare.recipe.SurgicalAggregationRecipe` jobs in
FLARE's simulator (``SimEnv``, through ``flare.simulation``); centralized and individual models are trained
by the same site trainer without FLARE. Every model is then evaluated on the setting's held-out test sets
(and the external set) by class name. Each run's folder gets ``result.json`` and ``per_class_auroc.csv``
when it finishes, so an interrupted grid resumes where it stopped.

Layout of ``<out>``::

    plan.json                              settings: sites, label sets, test sets
    runs/<setting>/<method>/seed<k>/       result.json, per_class_auroc.csv, simulator.log, models/
    per_class_auroc.csv                    every run, every test set, every class
    summary.csv / summary.md               the papers' table: mean AUROC (95% CI), p vs surgical aggregation
    shared_vs_unique.csv                   mean AUROC over classes every site holds vs the others
    plots/                                 mean AUROC vs K / psi / N per method; per-class AUROC per setting
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..config import site_config_from_dict
from ..core.errors import SiteConfigError
from ..core.methods import COMPARATORS, POOLED_COMPARATORS, controller_arguments
from ..data.storage import CACHE_ENV, default_cache_root
from ..inference import evaluate_models, evaluate_with_thresholds
from ..profiles import Profile
from ..site_data import prepare_site_data, resolve_table, split_table
from .baselines import train_pooled
from .grids import DataSources, Setting, dataset_identity, full_dataset_config, grid_settings
from .summary import PER_CLASS_FILE, RESULT_FILE, summarize

logger = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How the runs of a grid are executed (the same for every run)."""

    backbone_strategy: str = "fedbn_plus"  # the papers' (FedBN+): BatchNorm frozen, never averaged
    weighting: str = "uniform"
    pretrained_weights: str | None = None  # local ImageNet DenseNet121 checkpoint for every model
    bootstrap: int = 1000
    keep_workspaces: bool = False
    tracking: str = "tensorboard"  # or "mlflow": FLARE's MLflow receiver; its store is kept in the run's folder
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
    from ..flare.simulation import cores_per_process  # FLARE only where a federation runs

    threads = options.cpu_threads or cores_per_process(len(run.setting.sites))
    return {
        name: _for_run(config, run, options) | {"cpu_threads": threads} for name, config in run.setting.sites.items()
    }


def _for_run(config: dict[str, Any], run: Run, options: RunOptions) -> dict[str, Any]:
    """A site's or test set's config for this run: its seed, new partitions when the setting asks, the cache;
    no exchange records (a grid runs dozens of federations; the audit matters at hospitals)."""
    values = {**config, "seed": run.seed, "record_exchanges": "off"}
    if run.setting.repartition:
        values["data"] = {**config["data"], "split_seed": run.seed}
    if options.cache_dir:
        values["cache_dir"] = options.cache_dir
    return values


def _run_federated(run: Run, folder: Path, profile: Profile, options: RunOptions) -> dict[str, list[Path]]:
    """Build the run's recipe and simulate it; returns the models to evaluate, by dataset identity."""
    from ..flare.recipe import SurgicalAggregationRecipe  # FLARE only where a federation runs
    from ..flare.simulation import simulate

    sites = _sites_for_run(run, options)
    controller = {
        "num_rounds": profile.rounds,
        "patience": profile.patience,
        **controller_arguments(run.method, options.backbone_strategy, options.weighting),
    }
    persistor = {"seed": run.seed}
    if options.pretrained_weights:
        persistor["pretrained_weights"] = options.pretrained_weights
    name = f"{run.setting.name}-{run.method}"
    recipe = SurgicalAggregationRecipe(
        name, sites, controller, persistor, publish_global_model=False, tracking=options.tracking
    )
    workspaces = folder / "workspace"
    shutil.rmtree(workspaces, ignore_errors=True)
    logger.info("%s: simulating %d sites (log: %s)", run.title, len(sites), folder / "simulator.log")
    result = simulate(recipe, workspaces, folder / "simulator.log")
    models = folder / "models"
    models.mkdir(exist_ok=True)
    for source in (result.history, result.curves):
        if source.is_file():
            shutil.copy2(source, folder / source.name)
    if result.mlflow_store.is_file():
        shutil.copy2(result.mlflow_store, folder / result.mlflow_store.name)
    chosen: dict[str, list[Path]] = {}
    if controller["method"] == "personal":
        for site, config in sites.items():
            target = models / f"{site}.pt"
            shutil.copy2(result.personal_model(site), target)
            chosen.setdefault(dataset_identity(config), []).append(target)
    else:
        target = models / "global.pt"
        shutil.copy2(result.best_global_model, target)
        chosen["*"] = [target]
    if not options.keep_workspaces:
        shutil.rmtree(workspaces, ignore_errors=True)
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
        if config.modality.threshold_metrics:  # Youden thresholds from the validation split the sites used
            data = prepare_site_data(config)
            report = evaluate_with_thresholds(paths, data.val, data.test, options.bootstrap, config.device)
        else:
            table = resolve_table(config)
            table = table if test.split == "all" else split_table(table, config)[test.split]
            report = evaluate_models(paths, table, cache_dir=config.cache_dir, bootstrap=options.bootstrap)
        frame = report.per_class.assign(test_set=test.name)
        rows.append(frame)
        summary[test.name] = {
            "mean_auroc": report.mean_auroc.estimate,
            "ci_low": report.mean_auroc.low,
            "ci_high": report.mean_auroc.high,
            "classes": int(frame["auroc"].notna().sum()),
            "images": report.n_images,
        }
        for column in ("accuracy", "sensitivity", "specificity"):
            if column in frame:
                summary[test.name][f"mean_{column}"] = float(frame[column].mean())
    return pd.concat(rows, ignore_index=True), summary


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
        "setting": run.setting.name,
        "factor": run.setting.factor,
        "value": run.setting.value,
        "method": run.method,
        "seed": run.seed,
        "train_seconds": round(trained, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "test_sets": summary,
    }
    result_path.write_text(json.dumps(result, indent=2) + "\n")  # last: its presence marks the run finished
    return result


def plan(settings: Sequence[Setting], methods: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    unknown = [method for method in methods if method not in COMPARATORS]
    if unknown:
        raise SiteConfigError(f"unknown method(s) {unknown}; choose from {list(COMPARATORS)}")
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
            raise SiteConfigError(f"no setting of grid {grid!r} matches {list(only)}")
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
            {
                **(description or {}),
                "profile": asdict(profile),
                "methods": list(methods),
                "seeds": list(seeds),
                "options": asdict(options),
                "settings": [
                    {
                        "name": s.name,
                        "factor": s.factor,
                        "value": s.value,
                        "label_sets": s.label_sets,
                        "shared_classes": s.shared_classes,
                        "sites": s.sites,
                        "test_sets": [asdict(t) for t in s.test_sets],
                    }
                    for s in settings
                ],
            },
            indent=2,
        )
        + "\n"
    )
    os.environ.setdefault(CACHE_ENV, str(options.cache_dir or default_cache_root()))
    started = time.perf_counter()
    for index, run in enumerate(runs, start=1):
        done = (run.folder(out) / RESULT_FILE).is_file()
        logger.info("[%d/%d] %s%s", index, len(runs), run.title, " (finished before: skipped)" if done else "")
        result = execute(run, out, profile, options)
        means = ", ".join(f"{name} {values['mean_auroc']:.3f}" for name, values in result["test_sets"].items())
        logger.info(
            "[%d/%d] %s: mean AUROC %s (%.0f s; %.0f s elapsed)",
            index,
            len(runs),
            run.title,
            means,
            result["seconds"],
            time.perf_counter() - started,
        )
    return summarize(out)
