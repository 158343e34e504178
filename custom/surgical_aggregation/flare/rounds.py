"""One training round on the server: each result checked as it arrives, then the round's aggregation.

What the controller holds during a round is every structurally valid result (the site's full model state)
until the round ends: the update bound needs the round's results and the earlier rounds' history, and a
candidate global model that fails the model check is taken apart by leaving each result out. The server's
memory therefore grows with the number of sites in a round (one model per site), not with the number of
rounds. No FLARE here: the controller sends the tasks and hands each answer's parts to :meth:`Round.receive`.

The order of the checks, each from :mod:`surgical_aggregation.core.checks`:

1. on arrival: the result's structure and values (:func:`~surgical_aggregation.core.checks.check_result`) and
   its metrics (:func:`~surgical_aggregation.core.checks.check_metrics`);
2. at the end of the round: the size of each result's update, per part of the model, against caps relative to
   the global model and the typical accepted update of earlier rounds (``update_problems``); free-riders are
   recorded;
3. the candidate global model of the accepted results (``model_problems``): when it fails, the results
   responsible are found by leaving each out and rejected, and the rest aggregate; when none can be singled out,
   the round's aggregation is discarded and the last good global model stays.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..core.aggregation import AggregationResult, Contribution, ContributionRejected, SurgicalAggregator
from ..core.checks import (
    CheckedResult,
    ModelOutputs,
    UpdateReference,
    blame_for_failing_model,
    check_metrics,
    free_riders,
    model_problems,
    update_problems,
    update_sizes,
)
from ..core.head import HeadSpec


@dataclass
class Arrival:
    """A training result that passed the result checks, and the slice of the global model it started from."""

    contribution: Contribution
    checked: CheckedResult
    received: Mapping[str, Any]  # the params the site was sent
    received_classes: Sequence[str]  # their head rows' names, as the site was sent them
    warmup: bool  # the site warmed its head up this round


@dataclass
class RoundRules:
    """How the server aggregates and bounds a round (the job's settings)."""

    backbone_strategy: str
    weighting: str
    head: HeadSpec
    normalize: Callable[[str], str]
    update_bound: float | None
    outputs: ModelOutputs | None  # the model's outputs on the probe input (the model check)


@dataclass
class Round:
    """Everything one round gathered and decided, for the history and for telling each site how it fared."""

    number: int
    arrivals: dict[str, Arrival] = field(default_factory=dict)
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> its checked validation metrics
    rejected: dict[str, str] = field(default_factory=dict)  # site -> why its result was rejected (told to it)
    rejection_details: dict[str, list[str]] = field(default_factory=dict)  # site -> figures for the server log only
    failed: dict[str, str] = field(default_factory=dict)  # site -> the return code of its failed task
    metric_problems: dict[str, list[str]] = field(default_factory=dict)  # site -> metrics it sent that were dropped
    update_sizes: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> part -> relative update
    free_riders: list[str] = field(default_factory=list)
    model_check: list[str] = field(default_factory=list)  # why the first candidate failed (empty: it passed)

    def answered(self) -> set[str]:
        return set(self.arrivals) | set(self.rejected) | set(self.failed)

    def receive(
        self,
        contribution: Contribution,
        metrics: Any,
        site_classes: Sequence[str],
        received: Mapping[str, Any],
        received_classes: Sequence[str],
        warmup: bool,
        checker: SurgicalAggregator,
    ) -> str | None:
        """Check one arriving result and its metrics; keep it when valid. Returns the rejection reason, if any."""
        site = contribution.client
        valid, problems = check_metrics(metrics, site_classes)
        if problems:
            self.metric_problems[site] = problems
        if "val_loss" in valid:
            self.metrics[site] = valid
        try:
            checked = checker.check(contribution, others=list(self.arrivals))
        except ContributionRejected as rejection:
            self.rejected[site] = rejection.reason
            return rejection.reason
        self.arrivals[site] = Arrival(contribution, checked, received, received_classes, warmup)
        return None

    def aggregate(
        self, state: Mapping[str, Any], classes: Sequence[str], rules: RoundRules, reference: UpdateReference
    ) -> AggregationResult:
        """The round's global model from its valid results (see the module's docstring for the order of the
        checks); ``reference`` learns the accepted updates' sizes."""

        def aggregator() -> SurgicalAggregator:
            return SurgicalAggregator(
                state, classes, rules.backbone_strategy, rules.weighting, rules.head, rules.normalize
            )

        averaged = aggregator().averaged_keys
        sizes = {}
        for site, arrival in sorted(self.arrivals.items()):
            contribution = arrival.contribution
            sizes[site] = update_sizes(
                contribution.state,
                contribution.class_names,
                arrival.received,
                arrival.received_classes,
                averaged,
                rules.head,
                rules.normalize,
            )
            self.update_sizes[site] = sizes[site].summary()
            told, details = update_problems(sizes[site], reference, rules.update_bound, arrival.warmup)
            if told:
                self.rejected[site] = "; ".join(told)
                self.rejection_details[site] = details
        candidates = [site for site in sorted(self.arrivals) if site not in self.rejected]
        aggregates: dict[tuple[str, ...], AggregationResult] = {}

        def aggregate_of(sites: Sequence[str]) -> AggregationResult:
            key = tuple(sites)
            if key not in aggregates:
                combined = aggregator()
                for site in sites:  # name order: the same sums on every run
                    combined.add_checked(self.arrivals[site].contribution, self.arrivals[site].checked)
                aggregates[key] = combined.finalize()
            return aggregates[key]

        def problems_of(sites: Sequence[str]) -> list[str]:
            candidate = aggregate_of(sites)
            return model_problems(candidate.state, candidate.class_names, rules.outputs)

        kept, blamed, self.model_check = (
            blame_for_failing_model(candidates, problems_of) if candidates else ([], {}, [])
        )
        self.rejected.update(blamed)
        self.free_riders = free_riders({site: sizes[site] for site in kept})
        typical = [site for site in kept if site not in self.free_riders]
        reference.record([sizes[site] for site in typical], [self.arrivals[site].warmup for site in typical])
        result = aggregate_of(kept)
        result.rejected = dict(self.rejected)
        return result

    def record(self, accepted: Sequence[str], missing: Sequence[str], seconds: float) -> dict[str, Any]:
        """The round's ``aggregation`` entry of the history."""
        entry: dict[str, Any] = {
            "accepted": list(accepted),
            "rejected": dict(self.rejected),
            "failed": dict(self.failed),
            "missing": list(missing),
            "rejected_metrics": dict(self.metric_problems),
            "update_sizes": dict(self.update_sizes),
            "free_riders": list(self.free_riders),
        }
        if self.model_check:
            entry["model_check"] = list(self.model_check)
        entry["seconds"] = round(seconds, 2)
        return entry
