"""The benchmark can prove surgical aggregation wrong: on the embedded data, with frozen features and tiny images,
each clause below fails when what it guards is broken (the closing note of the benchmark's issue shows each one fail).

Four simulated NIH sites (K = 4), psi = 12/14 (2 classes every site labels, 12 labelled by one site each), heads on
frozen features (the findings' glyph detectors of ``images.glyph_features``, as the head-only grid reads the images)
trained by the in-process federation (``experiments.federation``, the controller's loop) over 3 seeds that redraw the
label subsets, the patient split and the partition (the README's test command judges the first, the system tier all):

(a) missing findings (the real situation: a site's images show the findings it does not label): vanilla FL, which
    trains them as negatives, is below surgical aggregation by a clear margin on every seed;
(b) the absent control (the federation's findings a site does not label left out of its images): most of vanilla
    FL's deficit goes, so (a)'s deficit is the missing labels' doing; what little is left is vanilla FL's own cost (a
    site that trains a class it has no positive of pulls that class's row towards "never" at every round);
(c) psi = 0 (every site labels every class): surgical aggregation, vanilla FL and partial loss give one model;
(d) a deliberately wrong aggregator loses to the real one: rows matched by position instead of by name lose AUROC;
    head rows averaged over every site, with zeros for the sites that do not label the class, shrink each row by its
    holders' share, which leaves its ranking (AUROC) as it was and ruins its probabilities: they lose on the test
    binary cross-entropy.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction

import numpy as np
import pytest
import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.head import NAMED_HEAD, to_numpy
from surgical_aggregation.core.labels import NIH_LABELS, NIH_RAW_LABELS
from surgical_aggregation.evaluation.metrics import bce_loss, mean_defined
from surgical_aggregation.experiments.federation import federate
from surgical_aggregation.experiments.grids import assign_label_sets
from surgical_aggregation.experiments.head_only import (
    Features,
    HeadLearner,
    HeadModel,
    HeadRecipe,
    aurocs_on,
    initial_heads,
)
from surgical_aggregation.images.glyph_features import glyph_features
from surgical_aggregation.images.synthetic import GENERATED
from surgical_aggregation.images.synthetic_labels import finding_donors, nih_label_rows, shown_findings
from surgical_aggregation.images.synthetic_pixels import render_image

from helpers import built_once

SIZE, PATIENTS, SITES, SEEDS, ROUNDS = 32, 800, 4, (0, 1, 2), 60
IDENTITY_ROUNDS = 10  # (c): methods that differ at psi = 0 differ from the first aggregation on
RECIPE = HeadRecipe(learning_rate=1e-2)
HETEROGENEOUS = Fraction(12, 14)
MISSING_MARGIN = 0.04  # (a): vanilla FL's deficit on every seed
ABSENT_SHARE = 0.3  # (b): under the absent control, at most this share of (a)'s mean deficit is left ...
LABELS_SHARE = 0.05  # ... and the missing labels' share of it is at least this
WRONG_MARGIN = 0.03  # (d): rows matched by position: the AUROC deficit, mean over seeds
BCE_MARGIN = 0.05  # (d): zero rows averaged in: how much higher the test BCE is, mean over seeds
# CI judges the first seed (every clause holds on each seed alone, with room: (a) 0.094-0.113, (b) at most 0.23 of (a),
# (d) 0.195-0.209 and 0.318-0.363); the system tier each other seed alone and all three, as the clauses are written
SEED_SETS = [
    pytest.param(SEEDS[:1], id=f"seed-{SEEDS[0]}"),
    *(pytest.param((seed,), id=f"seed-{seed}", marks=pytest.mark.system) for seed in SEEDS[1:]),
    pytest.param(SEEDS, id="every-seed", marks=pytest.mark.system),
]


class Images:
    """NIH-layout label rows (real ones when torchxrayvision's files are installed) and what each image shows."""

    def __init__(self) -> None:
        rows, _ = nih_label_rows(PATIENTS, seed=0)
        donors = finding_donors(True)
        rng = np.random.default_rng(7)
        tokens = rows["Finding Labels"].str.split("|")
        self.labels = np.array([[float(raw in found) for raw in NIH_RAW_LABELS] for found in tokens], np.float32)
        self.shown = [
            shown_findings(dict(zip(NIH_LABELS, row.tolist(), strict=True)), NIH_LABELS, donors, rng)
            for row in self.labels
        ]
        self.patients = rows["Patient ID"].to_numpy()
        self.style = GENERATED["nih"].style
        self.missing = self._detected(np.arange(len(rows)), ())

    def _detected(self, rows: np.ndarray, absent: Sequence[str]) -> torch.Tensor:
        images = [
            render_image(
                {name: s for name, s in self.shown[row].items() if name not in absent},
                SIZE,
                self.style,
                np.random.default_rng([1, int(row)]),
            )
            for row in rows
        ]
        return glyph_features(torch.from_numpy(np.stack(images)).unsqueeze(1))

    def features(self, rows: np.ndarray, absent: Sequence[str] = ()) -> torch.Tensor:
        """The rows' images as drawn (the same draws each time), ``absent`` findings left out."""
        return self.missing[rows] if not absent else self._detected(rows, absent)

    def split(self, seed: int) -> dict[str, np.ndarray]:
        """Rows of train (50%), validation (10%) and test (40%) patients."""
        patients = np.random.default_rng(seed).permutation(np.unique(self.patients))
        cut = np.cumsum([int(0.5 * len(patients)), int(0.1 * len(patients))])
        parts = dict(zip(("train", "val", "test"), np.split(patients, cut), strict=True))
        return {name: np.flatnonzero(np.isin(self.patients, part)) for name, part in parts.items()}


@pytest.fixture(scope="module")
def images() -> Images:
    return Images()


def _features(images: Images, rows: np.ndarray, classes: list[str], absent: Sequence[str] = ()) -> Features:
    columns = [list(NIH_LABELS).index(name) for name in classes]
    labels = torch.from_numpy(images.labels[rows][:, columns])
    return Features(images.features(rows, absent), labels, torch.ones_like(labels), list(classes))


def run(
    images: Images,
    seed: int,
    method: str,
    psi: Fraction = HETEROGENEOUS,
    absent: bool = False,
    aggregator=None,
    rounds: int = ROUNDS,
):
    """One federation of ``rounds`` (no early stop): (test mean AUROC of the selected model, its test BCE, the
    selected model)."""
    label_sets = assign_label_sets(NIH_LABELS, SITES, psi, seed)
    split = images.split(seed)
    test = _features(images, split["test"], list(NIH_LABELS))
    order = np.random.default_rng(seed + 1)
    union = sorted(NIH_LABELS)
    sites = {}
    for index, labels in enumerate(label_sets):
        hidden = sorted(set(NIH_LABELS) - set(labels)) if absent else ()  # the federation's classes it lacks
        sites[f"site-{index + 1}"] = [
            _features(images, np.array_split(order.permutation(split[name]), SITES)[index], labels, hidden)
            for name in ("train", "val")
        ]
    learners = {site: HeadLearner(train, val, RECIPE, seed) for site, (train, val) in sites.items()}
    heads = initial_heads(union, test.values.shape[1])
    extra = {} if aggregator is None else {"aggregator": aggregator}
    result = federate(learners, heads, union, {"method": method}, rounds, rounds, 1e-4, **extra)
    selected = HeadModel(result.selected.state, result.selected.class_names)
    probabilities = selected.probabilities(test.values)[:, [union.index(name) for name in test.class_names]]
    loss = bce_loss(test.labels.numpy(), probabilities)
    return mean_defined(aurocs_on([selected], test)), loss, result.selected


class ZeroFilledMean(SurgicalAggregator):
    """Wrong: every site's rows placed in a zero union head and averaged over all sites (a site that does not label
    a class counts as a zero row)."""

    def __init__(self, state, classes, backbone, weighting) -> None:
        super().__init__(state, classes, backbone, weighting)
        self.union = list(classes)

    def add(self, contribution: Contribution) -> None:
        weight = to_numpy(contribution.state[NAMED_HEAD.weight_key])
        bias = to_numpy(contribution.state[NAMED_HEAD.bias_key])
        full_weight = np.zeros((len(self.union), weight.shape[1]), weight.dtype)
        full_bias = np.zeros(len(self.union), bias.dtype)
        for position, name in enumerate(contribution.class_names):
            full_weight[self.union.index(name)], full_bias[self.union.index(name)] = weight[position], bias[position]
        state = {NAMED_HEAD.weight_key: full_weight, NAMED_HEAD.bias_key: full_bias}
        super().add(Contribution(contribution.client, state, self.union, contribution.num_samples))


class ByPosition(SurgicalAggregator):
    """Wrong: a site's k-th row taken for the union's k-th class, whatever its name."""

    def __init__(self, state, classes, backbone, weighting) -> None:
        super().__init__(state, classes, backbone, weighting)
        self.union = list(classes)

    def add(self, contribution: Contribution) -> None:
        renamed = self.union[: len(contribution.class_names)]
        super().add(Contribution(contribution.client, contribution.state, renamed, contribution.num_samples))


@pytest.fixture(scope="module", params=SEED_SETS)
def heterogeneous(images: Images, tmp_path_factory, request) -> dict[str, list[tuple[float, float]]]:
    per_seed = [
        built_once(tmp_path_factory, f"falsification-seed-{seed}", lambda _, seed=seed: _heterogeneous(images, seed))
        for seed in request.param
    ]
    return {name: [scores[name] for scores in per_seed] for name in per_seed[0]}


def _heterogeneous(images: Images, seed: int) -> dict[str, tuple[float, float]]:
    """(test mean AUROC, test BCE) of ``seed`` at psi = 12/14: each method, missing and absent, wrong aggregators."""
    runs = {
        "surgical": lambda: run(images, seed, "surgical"),
        "vanilla": lambda: run(images, seed, "vanilla"),
        "surgical absent": lambda: run(images, seed, "surgical", absent=True),
        "vanilla absent": lambda: run(images, seed, "vanilla", absent=True),
        "zero-filled": lambda: run(images, seed, "surgical", aggregator=ZeroFilledMean),
        "by position": lambda: run(images, seed, "surgical", aggregator=ByPosition),
    }
    return {name: each()[:2] for name, each in runs.items()}


def _deficit(scores: dict[str, list[tuple[float, float]]], ours: str, theirs: str) -> np.ndarray:
    """Per seed, how much lower ``theirs`` scores than ``ours`` in test mean AUROC."""
    return np.array([score[0] for score in scores[ours]]) - np.array([score[0] for score in scores[theirs]])


@pytest.mark.slow
def test_a_vanilla_fl_loses_when_unlabelled_findings_are_in_the_images(heterogeneous):
    deficit = _deficit(heterogeneous, "surgical", "vanilla")
    assert deficit.min() > MISSING_MARGIN, heterogeneous


@pytest.mark.slow
def test_b_the_absent_control_takes_the_missing_labels_share_of_vanilla_fls_deficit_away(heterogeneous):
    missing = _deficit(heterogeneous, "surgical", "vanilla").mean()
    absent = _deficit(heterogeneous, "surgical absent", "vanilla absent").mean()
    assert absent < ABSENT_SHARE * missing and missing - absent > LABELS_SHARE, heterogeneous


@pytest.mark.slow
def test_c_with_every_class_at_every_site_the_methods_give_one_model(images):
    models = {
        method: run(images, 0, method, psi=Fraction(0), rounds=IDENTITY_ROUNDS)[2]
        for method in ("surgical", "vanilla", "partial_loss")
    }
    reference = models["surgical"]
    for method, model in models.items():
        assert model.class_names == reference.class_names, method
        for key in NAMED_HEAD.keys:
            np.testing.assert_allclose(np.asarray(model.state[key]), np.asarray(reference.state[key]), atol=1e-6)


@pytest.mark.slow
def test_d_a_wrong_aggregator_loses_to_surgical_aggregation(heterogeneous):
    assert _deficit(heterogeneous, "surgical", "by position").mean() > WRONG_MARGIN, heterogeneous
    ours, zero_filled = ([score[1] for score in heterogeneous[name]] for name in ("surgical", "zero-filled"))
    assert np.mean(zero_filled) - np.mean(ours) > BCE_MARGIN, heterogeneous
