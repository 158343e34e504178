"""The head-only variant of a run: heads trained on the frozen initial backbone's features (:mod:`.head_only`),
federated in process (:mod:`.federation`), and scored on each test set's features."""

from __future__ import annotations

import logging
from dataclasses import asdict

import pandas as pd

from ..core.devices import resolve_device
from ..core.methods import POOLED_COMPARATORS, controller_arguments
from ..evaluation.inference import (
    ensemble_probabilities,
    per_class_report,
)
from ..evaluation.probe import backbone_model, without_augmentation
from ..training.checkpoint import initial_global_state
from ..training.config import SiteConfig, site_config_from_dict
from ..training.profiles import Profile
from ..training.site_data import prepare_site_data, resolve_table, split_table
from .choices import (
    GLYPHS,
)
from .grids import dataset_identity
from .head_only import FeatureBank, Features, HeadLearner, HeadModel, HeadRecipe, initial_heads
from .runner import (
    LAST,
    SELECTED,
    Run,
    RunOptions,
    for_run,
    history_curve,
    method_fields,
    models_for,
    sites_for_run,
    test_summary,
)

logger = logging.getLogger(__name__)


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


def run_head_only(run: Run, profile: Profile, options: RunOptions) -> tuple[dict, dict]:
    """Heads trained on the frozen initial backbone's features: the federated methods in process
    (:func:`.federation.federate`), the baselines as one-site federations on pooled (or their own) features."""
    from .federation import federate

    sites = sites_for_run(run, options)
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
            **method_fields(run, options),
        },
        "curve": history_curve(first.history),
        "rounds": {SELECTED: first.selected.round, LAST: first.last.round},
    }
    return chosen, record


def evaluate_heads(run: Run, models: dict[str, list[HeadModel]], options: RunOptions) -> tuple[pd.DataFrame, dict]:
    """:func:`.runner.evaluate_run` for heads: each test set's features through the frozen backbone, then the same
    report."""
    rows, summary = [], {}
    for test in run.setting.test_sets:
        config = without_augmentation(site_config_from_dict(for_run(test.config, run, options), f"test {test.name}"))
        bank = _feature_bank(options, config)
        table = resolve_table(config)
        part = table if test.split == "all" else split_table(table, config)[test.split]
        materialised = config.modality.materialise(config, part, logger, False)
        features = bank.of(materialised.dataset(materialised.table, False))
        heads = models_for(dataset_identity(test.config), models)
        predicted = list(dict.fromkeys(name for head in heads for name in head.class_names))
        values = features.values
        probabilities = ensemble_probabilities(heads, predicted, lambda head, values=values: head.probabilities(values))
        report = per_class_report(probabilities, predicted, materialised.table, options.bootstrap)
        rows.append(report.per_class.assign(test_set=test.name))
        summary[test.name] = test_summary(report, rows[-1])
    return pd.concat(rows, ignore_index=True), summary
