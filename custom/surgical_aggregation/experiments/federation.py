"""A federation in one process, without FLARE: the controller's loop over learners that live side by side.

For grids of many federations on one machine (a GPU runs them far faster than a simulator that starts a process per
site and per job) and for the benchmark's head-only variant, whose learners train a head on frozen features.

It is the controller's computation (:mod:`surgical_aggregation.flare.controller`): every round each site, in name
order, receives the backbone and its own head rows (the union under vanilla FL and partial loss), validates the model
it received, warms its head up in the first round, trains its local epochs and sends its model, which goes into
:class:`~surgical_aggregation.core.aggregation.SurgicalAggregator`; the sites' validation losses judge each global
model and select the best with early stopping (:func:`surgical_aggregation.flare.state.judge`, the controller's own),
and at the end every site validates the last model. What it leaves out is FLARE's and the server's defences:
messaging, the checks of hostile results, persistence, publication. ``tests/test_federation.py`` checks that it
gives the FLARE simulator's global models.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..core.aggregation import Contribution, SurgicalAggregator
from ..core.head import StateDict, slice_for_client
from ..core.methods import SiteMethod, head_classes_for_site
from ..core.robust import RobustRule
from ..evaluation.run_summary import INITIAL_ROUND
from ..flare.state import FederationState, SavedVersion, history_entry, judge
from ..training.loops import Evaluation
from ..training.trainer import FitReport, evaluation_metrics

logger = logging.getLogger(__name__)


class Learner(Protocol):
    """What a federation asks of a site (:class:`~surgical_aggregation.training.trainer.SiteTrainer` is one)."""

    @property
    def class_names(self) -> list[str]: ...

    head_classes: list[str]

    def set_method(self, site_method: SiteMethod) -> None: ...

    def load_global(self, state: Mapping[str, Any], class_names: Sequence[str]) -> None: ...

    def validate(self) -> Evaluation: ...

    def evaluate_state(self, state: Mapping[str, Any], class_names: Sequence[str]) -> Evaluation: ...

    def fit(self, round_number: int, warmup: bool) -> FitReport: ...

    def state_dict(self) -> dict[str, Any]: ...


# (global state, its classes, backbone strategy, weighting) -> the round's aggregator; a test passes wrong ones
AggregatorFactory = Callable[[StateDict, Sequence[str], str, str], SurgicalAggregator]


def surgical_aggregator(state: StateDict, classes: Sequence[str], backbone: str, weighting: str) -> SurgicalAggregator:
    return SurgicalAggregator(state, classes, backbone, weighting)


@dataclass
class FederationResult:
    history: list[dict[str, Any]]  # the controller's round history: each global model's aggregation and validation
    best: SavedVersion | None  # the lowest judged validation loss (None: no trained model was ever judged)
    last: SavedVersion
    seconds: float

    @property
    def selected(self) -> SavedVersion:
        return self.best or self.last


def federate(
    learners: Mapping[str, Learner],
    initial_state: StateDict,
    initial_classes: Sequence[str],
    controller: Mapping[str, Any],
    rounds: int,
    patience: int,
    min_delta: float,
    aggregator: AggregatorFactory = surgical_aggregator,
    log: logging.Logger = logger,
) -> FederationResult:
    """Run a federation of ``learners`` (site name -> learner) from ``initial_state`` (head rows for
    ``initial_classes``, which cover every site's classes) under ``controller``'s method, backbone strategy and
    weighting (:func:`surgical_aggregation.core.methods.controller_arguments`)."""
    started = time.perf_counter()
    method = controller.get("method", "surgical")
    backbone = controller.get("backbone_strategy", "fedavg")
    weighting = controller.get("weighting", "uniform")
    if controller.get("label_prior") or controller.get("proximal_mu"):
        raise ValueError("the in-process federation runs surgical aggregation, vanilla FL and partial loss only")
    defences = ("clip_updates", "reject_opposed_updates", "validation_guard")  # the FLARE job's, on by default
    robust = RobustRule.parse(controller.get("robust_aggregation", "mean"))
    if any(controller.get(name) is True for name in defences) or not robust.is_mean:
        raise ValueError("the in-process federation aggregates plain means and selects by the judged loss alone")
    sites = sorted(learners)
    missing = {site: sorted(set(learners[site].class_names) - set(initial_classes)) for site in sites}
    if any(missing.values()):
        raise ValueError(f"the initial model has no head rows for {missing}")
    latest = SavedVersion(INITIAL_ROUND, dict(initial_state), list(initial_classes))
    federation = FederationState(
        settings={"method": method, "backbone_strategy": backbone, "weighting": weighting},
        latest=latest,
        best=None,
        best_loss=math.inf,
        rounds_without_improvement=0,
        warmed_up=[],
        fresh_classes=list(initial_classes),
        personal_parts={},
        history=[],
    )
    site_method = SiteMethod(method, backbone)
    for learner in learners.values():
        learner.set_method(site_method)

    def slice_of(version: SavedVersion, site: str) -> tuple[dict[str, Any], list[str]]:
        head = head_classes_for_site(method, learners[site].class_names, version.class_names)
        return slice_for_client(version.state, version.class_names, head), head

    for round_number in range(rounds):
        if federation.rounds_without_improvement >= patience:
            log.info("early stop: %d validated rounds without improvement beyond %g", patience, min_delta)
            break
        round_started = time.perf_counter()
        contributions, validation = [], {}
        for site in sites:
            learner = learners[site]
            learner.load_global(*slice_of(latest, site))
            validation[site] = evaluation_metrics(learner.validate(), "val")
            report = learner.fit(round_number, warmup=round_number == 0)
            if round_number == 0:  # its own model of the first round: whether it may veto the initial model's bar
                validation[site]["local_val_loss"] = float(learner.validate().loss)
            contributions.append(Contribution(site, learner.state_dict(), list(learner.head_classes), report.samples))
        aggregating = aggregator(latest.state, latest.class_names, backbone, weighting)
        for contribution in contributions:
            aggregating.add(contribution)
        result = aggregating.finalize()
        verdict = judge(federation, latest, validation, None, min_delta)
        latest = SavedVersion(round_number, result.state, result.class_names, trained=True)
        federation.latest = latest
        history_entry(federation.history, round_number)["aggregation"] = {
            "accepted": result.accepted,
            "rejected": result.rejected,
            "seconds": round(time.perf_counter() - round_started, 3),
        }
        log.info(
            "round %d/%d: aggregated %d sites; the model they received: judged validation loss %.4f, mean AUROC %.4f "
            "(%.1f s)",
            round_number + 1,
            rounds,
            len(result.accepted),
            verdict.judged_loss,
            verdict.mean_auroc,
            time.perf_counter() - round_started,
        )
    final = {site: evaluation_metrics(learners[site].evaluate_state(*slice_of(latest, site)), "val") for site in sites}
    verdict = judge(federation, latest, final, None, min_delta)
    log.info("final validation of round %d: judged loss %.4f", latest.round, verdict.judged_loss)
    return FederationResult(federation.history, federation.best, latest, time.perf_counter() - started)
