"""The experiment runner: a grid of settings x comparators x seeds, run, evaluated and summarised.

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
import multiprocessing
import os
import shutil
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.devices import resolve_device
from ..core.errors import SiteConfigError
from ..core.head import backbone_digest
from ..core.methods import COMPARATORS, POOLED_COMPARATORS, SiteMethod, controller_arguments
from ..core.strategies import strategy
from ..data.storage import CACHE_ENV, default_cache_root
from ..evaluation.inference import (
    EvaluationReport,
    ensemble_probabilities,
    evaluate_models,
    evaluate_with_thresholds,
    per_class_report,
)
from ..evaluation.probe import backbone_model, without_augmentation
from ..training.checkpoint import ARCHITECTURE_KEY, PREPROCESSING_KEY, initial_global_state, save_checkpoint
from ..training.config import SiteConfig, site_config_from_dict
from ..training.profiles import Profile
from ..training.site_data import prepare_site_data, resolve_table, split_table
from ..training.trainer import EVALUATION_BATCHES_ON_GPU, SiteTrainer
from .baselines import BaselineResult, pooled_config, train_pooled
from .choices import (
    ABSENT,
    ENGINES,
    FLARE_ENGINE,
    FULL,
    GLYPHS,
    HEAD_FEATURES,
    HEAD_ONLY,
    INPROCESS,
    MISSING,
    VARIANTS,
)
from .grids import DataSources, Setting, dataset_identity, grid_settings
from .head_only import FeatureBank, Features, HeadLearner, HeadModel, HeadRecipe, initial_heads
from .pretraining import InitialModel, Pretraining, pretrained_backbone
from .summary import PER_CLASS_FILE, RESULT_FILE, summarize

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


def _sites_for_run(run: Run, options: RunOptions) -> dict[str, dict[str, Any]]:
    """The run's site configs; the torch threads of each: the machine's cores shared among the simulator's site
    processes, or (one process) the configured ``cpu_threads``."""
    threads = options.cpu_threads
    if threads is None and options.variant == FULL and options.engine == FLARE_ENGINE:
        from ..flare.simulation import cores_per_process  # FLARE only where a federation runs

        threads = cores_per_process(len(run.setting.sites))
    return {
        name: _for_run(config, run, options) | ({"cpu_threads": threads} if threads else {})
        for name, config in run.setting.sites.items()
    }


def _for_run(config: dict[str, Any], run: Run, options: RunOptions) -> dict[str, Any]:
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


def _method_fields(run: Run, options: RunOptions) -> dict[str, Any]:
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
        path = pretrained_backbone(profile, pretraining, options.cache_dir)
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


def _history_curve(history: Sequence[dict[str, Any]]) -> list[dict[str, float]]:
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


def _run_federated(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Build the run's recipe and simulate it (or, ``engine="inprocess"``, run its loop here); returns
    ({selected|last: the models to evaluate, by dataset identity}, the run's record: training settings, per-round
    validation, the two models' rounds)."""
    if options.engine == INPROCESS:
        return _run_inprocess(run, folder, profile, options)
    from ..flare.recipe import SurgicalAggregationRecipe  # FLARE only where a federation runs
    from ..flare.simulation import simulate

    sites = _sites_for_run(run, options)
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
    method = _method_fields(run, options)
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
        "curve": _history_curve(history),
        "rounds": {SELECTED: best[-1] if best else None, LAST: trained[-1] if trained else None},
    }
    if not options.keep_workspaces:
        shutil.rmtree(workspaces, ignore_errors=True)
    return chosen, record


def _run_inprocess(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """The federation's loop in this process (:func:`.federation.federate`), each site a
    :class:`~surgical_aggregation.training.trainer.SiteTrainer`; the selected and last models saved as model files."""
    from .federation import federate

    sites = _sites_for_run(run, options)
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
            _method_fields(run, options),
        ),
        "curve": _history_curve(result.history),
        "rounds": {SELECTED: result.selected.round, LAST: result.last.round},
    }
    return chosen, record


def _run_pooled(run: Run, folder: Path, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Centralized (all sites pooled), centralized_full (pooled, every class labelled) or individual (one model per
    site, on its own data and labels), trained without FLARE like the federations of the grid (initial model,
    BatchNorm handling, budget, selection)."""
    sites = _sites_for_run(run, options)
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
            _method_fields(run, options),
        ),
        "curve": curve,
        "rounds": {SELECTED: results[0].best_epoch, LAST: last},
    }
    return chosen, record


# --- the head-only variant ---------------------------------------------------------------------------------------

_BANKS: dict[str, FeatureBank] = {}  # the frozen backbone's features, per backbone: a grid's runs share them


def _feature_bank(options: RunOptions, config: SiteConfig) -> FeatureBank:
    """The head-only variant's frozen features, computed once per image: the embedded images' glyph detectors, or the
    initial model's backbone (the grid's pretrained weights, or seed 0's)."""
    key = GLYPHS if options.head_features == GLYPHS else options.pretrained_weights or "seed 0"
    if key not in _BANKS:
        if options.head_features == GLYPHS:
            _BANKS[key] = FeatureBank.of_glyphs()
        else:
            architecture, preprocessing = config.modality.architecture, config.modality.preprocessing(config)
            state = initial_global_state(architecture, preprocessing, 0, options.pretrained_weights)
            model = backbone_model(config, ["placeholder"], state, 0)
            description = f"the initial model's backbone, frozen ({options.initial_model})"
            _BANKS[key] = FeatureBank.of_backbone(model, resolve_device(config.device), description)
    return _BANKS[key]


def _site_features(config: SiteConfig, bank: FeatureBank) -> tuple[Features, Features]:
    data = prepare_site_data(without_augmentation(config))
    return bank.of(data.train), bank.of(data.val)


def _run_head_only(run: Run, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Heads trained on the frozen initial backbone's features: the federated methods in process
    (:func:`.federation.federate`), the baselines as one-site federations on pooled (or their own) features."""
    from .federation import federate

    sites = _sites_for_run(run, options)
    configs = {site: site_config_from_dict(values, f"{run.title} {site}") for site, values in sites.items()}
    bank = _feature_bank(options, next(iter(configs.values())))
    features = {site: _site_features(config, bank) for site, config in configs.items()}
    union = sorted({name for train, _ in features.values() for name in train.class_names})
    recipe = HeadRecipe(**profile.head_only)
    initial = initial_heads(union, bank.feature_dim)
    federations: dict[str, dict[str, HeadLearner]] = {}  # dataset identity ("*": the one global model) -> learners
    if run.method == "individual":  # each site alone: the floor
        for site, (train, val) in features.items():
            federations[site] = {site: HeadLearner(train, val, recipe, run.seed, site)}
        controller = {"method": "surgical"}
    elif run.method in POOLED_COMPARATORS:
        if run.method == "centralized_full":  # every site's data labelled with the whole union
            widened = {site: {**config, "data": {**config["data"], "labels": union}} for site, config in sites.items()}
            full = {site: site_config_from_dict(values, f"{run.title} {site}") for site, values in widened.items()}
            trains = [_site_features(config, bank)[0] for config in full.values()]
        else:  # the papers' centralized baseline: a class a site does not label is negative there
            trains = [train.relabelled(union, "negative") for train, _ in features.values()]
        val = Features.pooled([val.relabelled(union, "unlabelled") for _, val in features.values()])
        federations["*"] = {run.method: HeadLearner(Features.pooled(trains), val, recipe, run.seed, run.method)}
        controller = {"method": "surgical"}
    else:
        federations["*"] = {site: HeadLearner(*parts, recipe, run.seed, site) for site, parts in features.items()}
        controller = controller_arguments(run.method, options.backbone_strategy, options.weighting)
    chosen: dict[str, dict[str, list[HeadModel]]] = {SELECTED: {}, LAST: {}}
    results = {}
    for key, learners in federations.items():
        result = federate(learners, initial, union, controller, profile.rounds, profile.patience, profile.min_delta)
        results[key] = result
        identity = "*" if key == "*" else dataset_identity(sites[key])
        for kind, version in ((SELECTED, result.selected), (LAST, result.last)):
            chosen[kind].setdefault(identity, []).append(HeadModel(version.state, version.class_names))
    first = next(iter(results.values()))
    record = {
        "training": {
            "variant": f"head only: heads trained on frozen features, {bank.description}",
            "head_recipe": asdict(recipe),
            "rounds": profile.rounds,
            "selection": f"the lowest validation loss; patience {profile.patience}, min delta {profile.min_delta:g}",
            "initial_model": options.initial_model,
            "seed": run.seed,
            **_method_fields(run, options),
        },
        "curve": _history_curve(first.history),
        "rounds": {SELECTED: first.selected.round, LAST: first.last.round},
    }
    return chosen, record


def _evaluate_heads(run: Run, models: dict[str, list[HeadModel]], options: RunOptions) -> tuple[pd.DataFrame, dict]:
    """:func:`evaluate_run` for heads: each test set's features through the frozen backbone, then the same report."""
    rows, summary = [], {}
    for test in run.setting.test_sets:
        config = without_augmentation(site_config_from_dict(_for_run(test.config, run, options), f"test {test.name}"))
        bank = _feature_bank(options, config)
        table = resolve_table(config)
        part = table if test.split == "all" else split_table(table, config)[test.split]
        materialised = config.modality.materialise(config, part, logger, False)
        features = bank.of(materialised.dataset(materialised.table, False))
        heads = _models_for(dataset_identity(test.config), models)
        predicted = list(dict.fromkeys(name for head in heads for name in head.class_names))
        values = features.values
        probabilities = ensemble_probabilities(heads, predicted, lambda head, values=values: head.probabilities(values))
        report = per_class_report(probabilities, predicted, materialised.table, options.bootstrap)
        rows.append(report.per_class.assign(test_set=test.name))
        summary[test.name] = _test_summary(report, rows[-1])
    return pd.concat(rows, ignore_index=True), summary


def _models_for(test_identity: str, models: dict[str, list[Any]]) -> list[Any]:
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
        config = site_config_from_dict(_for_run(test.config, run, options), f"test set {test.name}")
        paths = _models_for(dataset_identity(test.config), models)
        if config.modality.threshold_metrics:  # Youden thresholds from the validation split the sites used
            data = prepare_site_data(config)
            report = evaluate_with_thresholds(paths, data.val, data.test, options.bootstrap, config.device)
        else:
            table = resolve_table(config)
            table = table if test.split == "all" else split_table(table, config)[test.split]
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
        summary[test.name] = _test_summary(report, rows[-1])
    return pd.concat(rows, ignore_index=True), summary


def _test_summary(report: EvaluationReport, frame: pd.DataFrame) -> dict[str, Any]:
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


def execute(run: Run, out: Path, profile: Profile, options: RunOptions) -> dict:
    """Train (unless finished before) and evaluate one run's selected and last models; returns its result."""
    folder = run.folder(out)
    result_path = folder / RESULT_FILE
    if result_path.is_file():
        return json.loads(result_path.read_text())
    folder.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if options.variant == HEAD_ONLY:
        models, record = _run_head_only(run, profile, options)
        evaluate = _evaluate_heads
    else:
        train = _run_pooled if run.method in POOLED_COMPARATORS else _run_federated
        models, record = train(run, folder, profile, options)
        evaluate = evaluate_run
    trained = time.perf_counter() - started
    validation = {entry["round"]: entry for entry in record["curve"]}
    evaluated, frames = {}, []
    for kind in (SELECTED, LAST):
        per_class, summary = evaluate(run, models[kind], options)
        frames.append(per_class.assign(model=kind))
        round_number = record["rounds"][kind]
        evaluated[kind] = {"round": round_number, "validation": validation.get(round_number), "test_sets": summary}
    pd.concat(frames, ignore_index=True).to_csv(folder / PER_CLASS_FILE, index=False)
    result = {
        "setting": run.setting.name,
        "factor": run.setting.factor,
        "value": run.setting.value,
        "control": run.setting.control,
        "variant": options.variant,
        "method": run.method,
        "seed": run.seed,
        "label_sets": run.setting.label_sets,
        "shared_classes": run.setting.shared_classes,
        "train_seconds": round(trained, 1),
        "seconds": round(time.perf_counter() - started, 1),
        "test_sets": evaluated[SELECTED]["test_sets"],  # the selected model's, as the papers report
        "models": evaluated,
        "curve": record["curve"],
        "training": record["training"],
    }
    result_path.write_text(json.dumps(result, indent=2) + "\n")  # last: its presence marks the run finished
    return result


def plan(settings: Sequence[Setting], methods: Sequence[str], seeds: Sequence[int]) -> list[Run]:
    unknown = [method for method in methods if method not in COMPARATORS]
    if unknown:
        raise SiteConfigError(f"unknown method(s) {unknown}; choose from {list(COMPARATORS)}")
    return [
        Run(setting.for_seed(seed), method, seed)
        for setting in settings
        for seed in seeds
        for method in methods
        if not (setting.control == ABSENT and method == "centralized_full")  # the findings it would label are gone
    ]


def run_grid(
    grid: str,
    methods: Sequence[str],
    seeds: Sequence[int],
    sources: DataSources,
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    only: Sequence[str] = (),
    controls: Sequence[str] = (MISSING,),
    jobs: int = 1,
) -> Path:
    """Run (or resume) a named grid and write its summary; returns the summary's path.

    ``only`` restricts the grid to the settings whose name contains one of the given strings; ``controls``: the
    simulated settings' controls (missing, absent).
    """
    settings = grid_settings(grid, sources, profile, controls)
    if only:
        settings = [s for s in settings if any(part in s.name for part in only)]
        if not settings:
            raise SiteConfigError(f"no setting of grid {grid!r} matches {list(only)}")
    description = {"grid": grid, "data": asdict(sources)}
    return run_settings(settings, methods, seeds, profile, out, options, description, jobs)


PLAN_FILE = "plan.json"


def write_plan(
    out: Path,
    settings: Sequence[Setting],
    methods: Sequence[str],
    seeds: Sequence[int],
    profile: Profile,
    options: RunOptions,
    description: dict[str, Any] | None = None,
) -> Path:
    """``plan.json``: the grid's settings (sites, label sets, test sets), methods, seeds, profile and options."""
    out.mkdir(parents=True, exist_ok=True)
    plan_data = {
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
    }
    path = out / PLAN_FILE
    path.write_text(json.dumps(plan_data, indent=2) + "\n")
    return path


def run_settings(
    settings: Sequence[Setting],
    methods: Sequence[str],
    seeds: Sequence[int],
    profile: Profile,
    out: str | Path,
    options: RunOptions,
    description: dict[str, Any] | None = None,
    jobs: int = 1,
) -> Path:
    """Run every (setting, seed, method) not finished yet, with progress logs, then summarise. ``jobs`` > 1 runs
    that many at once, each in a process of its own (a GPU's launch-bound small models leave it room for several)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    runs = plan(settings, methods, seeds)
    os.environ.setdefault(CACHE_ENV, str(options.cache_dir or default_cache_root()))
    options = with_initial_model(settings, methods, profile, options)
    logger.info("initial model of every method: %s", options.initial_model)
    write_plan(out, settings, methods, seeds, profile, options, description)
    started = time.perf_counter()
    todo = [run for run in runs if not (run.folder(out) / RESULT_FILE).is_file()]
    finished_before = len(runs) - len(todo)
    logger.info("%d runs, %d finished before; %d to run, %d at a time", len(runs), finished_before, len(todo), jobs)
    if jobs > 1:
        context = multiprocessing.get_context("spawn")  # CUDA in the workers: never fork a process that holds it
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_worker_logging) as pool:
            futures = [pool.submit(execute, run, out, profile, options) for run in todo]
            finished = (future.result() for future in as_completed(futures))
            for index, result in enumerate(finished, start=1):
                _log_result(index, len(todo), result, started)
    else:
        for index, run in enumerate(todo, start=1):
            logger.info("[%d/%d] %s", index, len(todo), run.title)
            _log_result(index, len(todo), execute(run, out, profile, options), started)
    return summarize(out)


def _worker_logging() -> None:
    """A worker says what goes wrong, and how each federation's rounds go (its round lines)."""
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    logging.getLogger("surgical_aggregation.experiments.federation").setLevel(logging.INFO)


def _log_result(index: int, total: int, result: dict[str, Any], started: float) -> None:
    means = ", ".join(f"{name} {values['mean_auroc']:.3f}" for name, values in result["test_sets"].items())
    title = f"{result['setting']} / {result['method']} / seed {result['seed']}"
    logger.info(
        "[%d/%d] %s: mean AUROC %s (%.0f s; %.0f s elapsed)",
        index,
        total,
        title,
        means,
        result["seconds"],
        time.perf_counter() - started,
    )
