"""The experiment runner: one run of a grid (a setting, a comparator, a seed) trained and evaluated; the grid's
runs in parallel and the summary are :mod:`.grid_run`'s, the head-only variant :mod:`.head_only_run`'s.

Federated comparators run as :class:`~surgical_aggregation.flare.recipe.SurgicalAggregationRecipe` jobs in
FLARE's simulator (``SimEnv``, through ``flare.simulation``), or with ``engine="inprocess"`` as the same loop in this
process (:mod:`.federation`: no process per site and job, what a GPU grid of hundreds of federations needs);
centralized and individual models are trained by the same site trainer without FLARE. The ``head_only`` variant
trains only the heads, on features of the frozen initial backbone (:mod:`.head_only`). Every model is then evaluated
on the setting's held-out test sets (and the external set) by class name. Each run's folder gets ``result.json`` and
``per_class_auroc.csv`` when it finishes, so an interrupted grid resumes where it stopped.

Every method of a setting trains like-for-like: the same initial model (:class:`~.pretraining.InitialModel`), the
same BatchNorm handling (the grid's backbone strategy, applied to the centralized and individual models too), the
same site-config training fields, budget and selection rule; each run records what it trained with in its
``result.json`` (``training``), and two models of every run are evaluated: the selected one (lowest validation loss)
and the last round's.

Layout of ``<out>``::

    plan.json                              settings: sites, label sets, test sets; the initial model
    runs/<setting>/<method>/seed<k>/       result.json, per_class_auroc.csv, simulator.log, models/
    per_class_auroc.csv                    every run, both models, every test set, every class
    summary.csv / summary.md               the papers' table for the selected and the last models, per-round
                                           validation, flags
    shared_vs_unique.csv                   mean AUROC over classes every site holds vs the others
    plots/                                 mean AUROC vs K / psi / N per method; per-class AUROC per setting;
                                           per-round validation per setting and seed
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..core.devices import resolve_device
from ..core.errors import SiteConfigError
from ..core.head import backbone_digest
from ..core.methods import POOLED_COMPARATORS, SiteMethod, controller_arguments
from ..core.strategies import strategy
from ..data.table import LabelTable
from ..evaluation.inference import (
    EvaluationReport,
    evaluate_models,
    evaluate_with_thresholds,
    model_specificity,
)
from ..training.checkpoint import ARCHITECTURE_KEY, PREPROCESSING_KEY, initial_global_state, save_checkpoint
from ..training.config import SiteConfig, site_config_from_dict
from ..training.profiles import Profile
from ..training.site_data import prepare_site_data, resolve_table, split_table
from ..training.trainer import EVALUATION_BATCHES_ON_GPU, SiteTrainer
from .baselines import BaselineResult, pooled_config, train_pooled
from .choices import (
    ENGINES,
    FLARE_ENGINE,
    FULL,
    GLYPHS,
    HEAD_FEATURES,
    HEAD_ONLY,
    INPROCESS,
    VARIANTS,
)
from .grids import Setting, dataset_identity
from .pretraining import InitialModel, Pretraining, pretrained_backbone

logger = logging.getLogger(__name__)


PRETRAIN_CHOICES = ("auto", "always", "never")  # the embedded stand-in for ImageNet weights (experiments.pretraining)
SELECTED, LAST = "selected", "last"  # the two models of every run that are evaluated
# The fields of a run's training record that are the method's own; every other field is the same for every method
# of a setting (tests/test_experiments.py checks it).
METHOD_FIELDS = ("method", "federated", "head", "missing_labels", "aggregation", "data")


@dataclass
class RunOptions:
    """How the runs of a grid are executed (the same for every run)."""

    backbone_strategy: str = "fedbn_plus"  # the papers' (FedBN+): BatchNorm frozen, never averaged
    weighting: str = "uniform"
    pretrained_weights: str | None = None  # local ImageNet DenseNet121 checkpoint for every model
    # without weights: train the embedded stand-in first (always), never, or when FedBN+ needs statistics and the data
    # is embedded (auto; FedBN+ on real data without weights is refused)
    pretrain: str = "auto"
    initial_model: str = ""  # what every model starts from (set by the runner)
    bootstrap: int = 1000
    keep_workspaces: bool = False
    tracking: str = "tensorboard"  # or "mlflow": FLARE's MLflow receiver; its store is kept in the run's folder
    cpu_threads: int | None = None  # torch threads per site; default: the machine's cores / sites
    loader_workers: int | None = None  # each site's loader worker processes (None: the site config's, auto)
    cache_dir: str | None = None
    variant: str = FULL
    engine: str = FLARE_ENGINE
    head_features: str = GLYPHS  # head_only: the embedded images' glyph detectors, or the initial model's backbone

    def __post_init__(self) -> None:
        choices_of = (
            ("variant", self.variant, VARIANTS),
            ("engine", self.engine, ENGINES),
            ("head_features", self.head_features, HEAD_FEATURES),
        )
        for name, value, choices in choices_of:
            if value not in choices:
                raise SiteConfigError(f"{name} must be one of {choices}, got {value!r}")


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


def sites_for_run(run: Run, options: RunOptions) -> dict[str, dict[str, Any]]:
    """The run's site configs; the torch threads of each: the machine's cores shared among the simulator's site
    processes, or (one process) the configured ``cpu_threads``."""
    threads = options.cpu_threads
    if threads is None and options.variant == FULL and options.engine == FLARE_ENGINE:
        from ..flare.simulation import cores_per_process  # FLARE only where a federation runs

        threads = cores_per_process(len(run.setting.sites))
    return {
        name: for_run(config, run, options) | ({"cpu_threads": threads} if threads else {})
        for name, config in run.setting.sites.items()
    }


def for_run(config: dict[str, Any], run: Run, options: RunOptions) -> dict[str, Any]:
    """A site's or test set's config for this run (the setting is the seed's: :meth:`Setting.for_seed`): its seed
    and the cache; no exchange records (a grid runs dozens of federations; the audit matters at hospitals)."""
    values = {**config, "seed": run.seed, "record_exchanges": "off"}
    if options.cache_dir:
        values["cache_dir"] = options.cache_dir
    if options.loader_workers is not None:
        values["workers"] = options.loader_workers
    return values


# What each method changes (the fields of :data:`METHOD_FIELDS`), by the federated method the controller runs ...
_AVERAGED = "the backbone averaged"
FEDERATED_METHOD_FIELDS: dict[str, dict[str, Any]] = {
    "surgical": {
        "head": "each site its own classes",
        "missing_labels": "not in the site's head",
        "aggregation": f"{_AVERAGED}; head rows averaged by class name over the sites that label them",
    },
    "vanilla": {
        "head": "the union at every site",
        "missing_labels": "negative",
        "aggregation": f"{_AVERAGED}; the union head averaged (FedAvg)",
    },
    "partial_loss": {
        "head": "the union at every site",
        "missing_labels": "left out of the loss",
        "aggregation": f"{_AVERAGED}; the union head averaged (FedAvg)",
    },
    "personal": {
        "head": "each site its own classes, kept at the site",
        "missing_labels": "not in the site's head",
        "aggregation": f"{_AVERAGED}; heads stay at the sites",
    },
}
# ... and by pooled comparator
POOLED_METHOD_FIELDS: dict[str, dict[str, Any]] = {
    "centralized": {
        "head": "the union",
        "missing_labels": "negative",
        "aggregation": "none: one model on the sites' data pooled",
    },
    "centralized_full": {
        "head": "the union",
        "missing_labels": "none: every class labelled",
        "aggregation": "none: one model on the sites' data pooled",
    },
    "individual": {
        "head": "each site its own classes",
        "missing_labels": "not in the site's head",
        "aggregation": "none: one model per site, on its own data alone (the floor)",
    },
}


def method_fields(run: Run, options: RunOptions) -> dict[str, Any]:
    if run.method in POOLED_COMPARATORS:
        return {"method": run.method, "federated": False, "data": "pooled", **POOLED_METHOD_FIELDS[run.method]}
    arguments = controller_arguments(run.method, options.backbone_strategy, options.weighting)
    described = FEDERATED_METHOD_FIELDS[arguments["method"]]
    extras = [f"{name} {arguments[name]}" for name in ("label_prior", "proximal_mu", "weighting") if name in arguments]
    aggregation = described["aggregation"] + (f" ({', '.join(extras)})" if extras else "")
    return {
        "method": run.method,
        "federated": True,
        "data": "each site trains on its own data",
        **described,
        "aggregation": aggregation,
    }


def _freezes_batchnorm(methods: Sequence[str], options: RunOptions) -> bool:
    """Whether a method of the grid trains with BatchNorm frozen (FedBN+), pooled baselines following the grid."""
    for method in methods:
        name = (
            options.backbone_strategy
            if method in POOLED_COMPARATORS
            else controller_arguments(method, options.backbone_strategy, options.weighting)["backbone_strategy"]
        )
        if strategy(name).freezes_batchnorm:
            return True
    return False


def with_initial_model(
    settings: Sequence[Setting], methods: Sequence[str], profile: Profile, options: RunOptions
) -> RunOptions:
    """``options`` with the grid's initial model decided (and, for the embedded stand-in, trained or found in the
    cache): given weights; else the stand-in when asked, or when FedBN+ needs statistics and the data is embedded;
    else from scratch. FedBN+ on real data without weights is refused here, before anything trains."""
    if options.pretrain not in PRETRAIN_CHOICES:
        raise SiteConfigError(f"pretrain must be one of {PRETRAIN_CHOICES}, got {options.pretrain!r}")
    if options.variant == HEAD_ONLY and options.head_features == GLYPHS:
        return replace(options, initial_model="no backbone: the heads read the images with the glyph detectors")
    if options.pretrained_weights:
        initial = InitialModel.from_weights(options.pretrained_weights)
        return replace(options, initial_model=initial.description)
    needed = _freezes_batchnorm(methods, options)
    embedded = all(config["data"].get("location") is None for s in settings for config in s.sites.values())
    if options.pretrain == "always" or (options.pretrain == "auto" and needed and embedded):
        pretraining = Pretraining.for_profile(profile)
        path = pretrained_backbone(pretraining, options.cache_dir)
        initial = InitialModel.from_weights(path, pretraining.describe())
        return replace(options, pretrained_weights=str(path), initial_model=initial.description)
    if needed and options.pretrain == "auto":
        raise SiteConfigError(
            "FedBN+ freezes BatchNorm at the initial model's statistics, and a model from scratch has none: pass "
            "--pretrained with local ImageNet DenseNet121 weights, --pretrain for the embedded stand-in (trained on "
            "generated images, not real X-rays), or --backbone fedavg"
        )
    return replace(options, initial_model=InitialModel().description)


def _initial(options: RunOptions) -> InitialModel:
    return InitialModel(options.pretrained_weights, options.initial_model)


def training_record(
    config: SiteConfig,
    parallel: int,
    profile: Profile,
    options: RunOptions,
    batchnorm: str,
    initial_backbone: str,
    method: dict[str, Any],
) -> dict[str, Any]:
    """What a run trained with, read from the config a trainer of it ran (``parallel`` of them side by side: the
    federation's sites), how it handled BatchNorm, the digest of the backbone it started from and its settings;
    ``method``: the method's own fields (:data:`METHOD_FIELDS`)."""
    cap = config.max_batches_per_epoch
    values = config.to_dict()  # the general fields and the modality's, flat
    return {
        **{name: values[name] for name in TRAINED_FIELDS if name in values},
        "images_per_round_cap": None if cap is None else cap * config.batch_size * parallel,
        "rounds": profile.rounds,
        "selection": f"the lowest validation loss over the sites' validation images; patience {profile.patience}, "
        f"min delta {profile.min_delta:g}",
        "initial_model": options.initial_model,
        "initial_backbone_sha256": initial_backbone[:16],
        "batchnorm": batchnorm,
        **method,
    }


# the site-config fields every method of a setting trains with (the record's shared part; the first four: images')
TRAINED_FIELDS = (
    "image_size",
    "in_channels",
    "imagenet_normalize",
    "augment",
    "batch_size",
    "optimizer",
    "learning_rate",
    "weight_decay",
    "local_epochs",
    "warmup_epochs",
    "warmup_learning_rate",
    "amp",
    "seed",
)


def history_curve(history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
    """The per-round validation of a federation's global models (round -1: before training)."""
    curve = []
    for entry in history:
        validation = entry.get("validation") or {}
        if "mean_val_loss" in validation:
            curve.append(
                {
                    "round": entry["round"],
                    "val_loss": validation.get("judged_val_loss", validation["mean_val_loss"]),
                    "val_mean_auroc": validation["mean_val_auroc"],
                }
            )
    return curve


def _federation_start(recipe: Any) -> str:
    """The backbone digest of the initial global model the recipe's persistor builds (the same call, the same
    arguments)."""
    arguments = recipe.persistor_args
    state = initial_global_state(
        arguments["architecture"],
        arguments["preprocessing"],
        arguments.get("seed", 0),
        arguments.get("pretrained_weights"),
    )
    return backbone_digest(state)


def run_federated(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Build the run's recipe and simulate it (or, ``engine="inprocess"``, run its loop here); returns
    ({selected|last: the models to evaluate, by dataset identity}, the run's record: training settings, per-round
    validation, the two models' rounds)."""
    if options.engine == INPROCESS:
        return _run_inprocess(run, folder, profile, options)
    from ..flare.recipe import SurgicalAggregationRecipe  # FLARE only where a federation runs
    from ..flare.simulation import simulate

    sites = sites_for_run(run, options)
    controller = {
        "num_rounds": profile.rounds,
        "patience": profile.patience,
        "min_delta": profile.min_delta,
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
    chosen: dict[str, dict[str, list[Path]]] = {SELECTED: {}, LAST: {}}
    if controller["method"] == "personal":
        for site, config in sites.items():
            for kind, source in (
                (SELECTED, result.personal_model(site)),
                (LAST, result.personal_model(site, last=True)),
            ):
                target = models / f"{site}{'' if kind == SELECTED else '-last'}.pt"
                shutil.copy2(source, target)
                chosen[kind].setdefault(dataset_identity(config), []).append(target)
    else:
        for kind, source, name in (
            (SELECTED, result.best_global_model, "global.pt"),
            (LAST, result.final_global_model, "global-last.pt"),
        ):
            shutil.copy2(source, models / name)
            chosen[kind]["*"] = [models / name]
    history = json.loads(result.history.read_text()) if result.history.is_file() else []
    best = [entry["round"] for entry in history if entry.get("validation", {}).get("best")]
    trained = [entry["round"] for entry in history if entry.get("aggregation")]
    method = method_fields(run, options)
    record = {
        "training": training_record(
            site_config_from_dict(next(iter(sites.values()))),
            len(sites),
            profile,
            options,
            strategy(controller["backbone_strategy"]).batchnorm,
            _federation_start(recipe),
            method,
        ),
        "curve": history_curve(history),
        "rounds": {SELECTED: best[-1] if best else None, LAST: trained[-1] if trained else None},
    }
    if not options.keep_workspaces:
        shutil.rmtree(workspaces, ignore_errors=True)
    return chosen, record


def _run_inprocess(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """The federation's loop in this process (:func:`.federation.federate`), each site a
    :class:`~surgical_aggregation.training.trainer.SiteTrainer`; the selected and last models saved as model files."""
    from .federation import federate

    sites = sites_for_run(run, options)
    configs = {site: site_config_from_dict(values, f"{run.title} {site}") for site, values in sites.items()}
    trainers = {site: SiteTrainer(config, prepare_site_data(config), site) for site, config in configs.items()}
    union = sorted({name for trainer in trainers.values() for name in trainer.class_names})
    first = next(iter(configs.values()))
    architecture, preprocessing = first.modality.architecture, first.modality.preprocessing(first)
    initial = _initial(options).state(architecture, preprocessing, run.seed, union)
    controller = controller_arguments(run.method, options.backbone_strategy, options.weighting)
    result = federate(trainers, initial, union, controller, profile.rounds, profile.patience, profile.min_delta)
    models = folder / "models"
    chosen: dict[str, dict[str, list[Path]]] = {SELECTED: {}, LAST: {}}
    meta = {ARCHITECTURE_KEY: architecture, PREPROCESSING_KEY: preprocessing}
    for kind, version, name in ((SELECTED, result.selected, "global.pt"), (LAST, result.last, "global-last.pt")):
        save_checkpoint(models / name, version.state, version.class_names, round=version.round, **meta)
        chosen[kind]["*"] = [models / name]
    record = {
        "training": training_record(
            first,
            len(sites),
            profile,
            options,
            strategy(controller["backbone_strategy"]).batchnorm,
            backbone_digest(initial),
            method_fields(run, options),
        ),
        "curve": history_curve(result.history),
        "rounds": {SELECTED: result.selected.round, LAST: result.last.round},
    }
    return chosen, record


def run_pooled(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Centralized (all sites pooled), centralized_full (pooled, every class labelled) or individual (one model per
    site, on its own data and labels), trained without FLARE like the federations of the grid (initial model,
    BatchNorm handling, budget, selection)."""
    sites = sites_for_run(run, options)
    models = folder / "models"
    site_method = SiteMethod(backbone_strategy=options.backbone_strategy)
    initial = _initial(options)
    first = site_config_from_dict(next(iter(sites.values())))
    architecture, preprocessing = first.modality.architecture, first.modality.preprocessing(first)

    def initial_state(classes: list[str]) -> dict[str, Any]:
        return initial.state(architecture, preprocessing, run.seed, classes)

    def train(configs, path: Path, name: str) -> BaselineResult:
        return train_pooled(
            configs,
            profile.rounds,
            path,
            profile.patience,
            profile.min_delta,
            name,
            site_method=site_method,
            initial_state=initial_state,
        )

    chosen: dict[str, dict[str, list[Path]]] = {SELECTED: {}, LAST: {}}
    if run.method in ("centralized", "centralized_full"):
        if run.method == "centralized_full":  # every site labels the whole union (its dataset labels it all)
            union = list(dict.fromkeys(name for labels in run.setting.label_sets.values() for name in labels))
            sites = {site: {**config, "data": {**config["data"], "labels": union}} for site, config in sites.items()}
        configs = {site: site_config_from_dict(config, f"{run.title} {site}") for site, config in sites.items()}
        results = [train(configs, models / f"{run.method}.pt", run.method)]
        chosen[SELECTED]["*"], chosen[LAST]["*"] = [results[0].checkpoint], [results[0].last_checkpoint]
        trained = pooled_config(configs)
    else:  # individual: the floor, no collaboration
        results = []
        for site, config in sorted(sites.items()):
            configs = {site: site_config_from_dict(config, f"{run.title} {site}")}
            results.append(train(configs, models / f"individual-{site}.pt", f"individual {site}"))
            identity = dataset_identity(config)  # a test set of its dataset is scored by its sites' models
            chosen[SELECTED].setdefault(identity, []).append(results[-1].checkpoint)
            chosen[LAST].setdefault(identity, []).append(results[-1].last_checkpoint)
            trained = configs[site]
    curve = [
        {"round": entry["round"], "val_loss": entry["val_loss"], "val_mean_auroc": entry["val_mean_auroc"]}
        for entry in results[0].history
    ]
    last = results[0].history[-1]["round"] if results[0].history else None
    record = {
        "training": training_record(
            trained,
            1,
            profile,
            options,
            results[0].batchnorm,
            results[0].initial_backbone,
            method_fields(run, options),
        ),
        "curve": curve,
        "rounds": {SELECTED: results[0].best_epoch, LAST: last},
    }
    return chosen, record


def models_for(test_identity: str, models: dict[str, list[Any]]) -> list[Any]:
    """A test set drawn from a dataset is scored by that dataset's own models when there are some
    (PFL's personal models, the individual models); otherwise by all of them, averaged per class."""
    if "*" in models:
        return models["*"]
    if test_identity in models:
        return models[test_identity]
    return [path for paths in models.values() for path in paths]


def evaluate_run(run: Run, models: dict[str, list[Path]], options: RunOptions) -> tuple[pd.DataFrame, dict]:
    """Per-class AUROC on every test set of the setting, and the mean AUROC with its bootstrap CI."""
    rows, summary = [], {}
    for test in run.setting.test_sets:
        config = site_config_from_dict(for_run(test.config, run, options), f"test set {test.name}")
        paths = models_for(dataset_identity(test.config), models)
        if config.modality.threshold_metrics:  # Youden thresholds from the validation split the sites used
            data = prepare_site_data(config)
            report = evaluate_with_thresholds(paths, data.val, data.test, options.bootstrap, config.device)
        else:
            table, specificity = resolve_table(config), None
            if test.split != "all":
                splits = split_table(table, config)
                table, specificity = splits[test.split], run_specificity(paths, splits["val"], config.cache_dir)
            on_gpu = resolve_device(config.device).type == "cuda"
            batch = config.batch_size * (EVALUATION_BATCHES_ON_GPU if on_gpu else 1)
            report = evaluate_models(
                paths,
                table,
                cache_dir=config.cache_dir,
                bootstrap=options.bootstrap,
                batch_size=batch,
                workers=config.workers,  # the sites' (a grid of many runs on a GPU asks for none)
            )
        rows.append(report.per_class.assign(test_set=test.name))
        summary[test.name] = test_summary(report, rows[-1])
        if specificity is not None:
            summary[test.name][FINDING_SPECIFICITY] = specificity
    return pd.concat(rows, ignore_index=True), summary


FINDING_SPECIFICITY = "finding_specificity"  # a test set's entry in result.json: one score per finding, or one for all


def run_specificity(paths: Sequence[Path], validation: LabelTable, cache_dir: str | None) -> dict[str, float]:
    """How finding-specific the run's model(s) are on a test set's dataset's validation images
    (:func:`~surgical_aggregation.evaluation.inference.model_specificity`; a run of several models, their mean)."""
    measured = [model_specificity(path, validation, cache_dir=cache_dir) for path in paths]
    return {
        "logit_correlation": float(np.mean([one.logit_correlation for one in measured])),
        "shared_score_auroc_loss": float(np.mean([one.shared_score_auroc_loss for one in measured])),
    }


def test_summary(report: EvaluationReport, frame: pd.DataFrame) -> dict[str, Any]:
    """A test set's line of ``result.json``: the mean AUROC with its bootstrap CI, classes and images (and the mean
    threshold metrics of a report labeller)."""
    summary = {
        "mean_auroc": report.mean_auroc.estimate,
        "ci_low": report.mean_auroc.low,
        "ci_high": report.mean_auroc.high,
        "classes": int(frame["auroc"].notna().sum()),
        "images": report.n_images,
    }
    for column in ("accuracy", "sensitivity", "specificity"):
        if column in frame:
            summary[f"mean_{column}"] = float(frame[column].mean())
    return summary
