"""One training round on the server: each result checked as it arrives, then the round's aggregation.

What the controller holds during a round is every structurally valid result (the site's full model state)
until the round ends: the update bound needs the round's results and the earlier rounds' history, and a
candidate global model that fails the model check is taken apart by leaving each result out. The server's
memory therefore grows with the number of sites in a round (one model per site), not with the number of
rounds. No FLARE here: the controller sends the tasks and hands each answer's parts to :meth:`Round.receive`.

The order of the checks, each from :mod:`surgical_aggregation.core.checks`:

1. on arrival: the result's structure and values (:func:`~surgical_aggregation.core.checks.result.check_result`) and
   its metrics (:func:`~surgical_aggregation.core.checks.metrics.check_metrics`);
2. at the end of the round: the size of each result's update, per part of the model, against caps relative to
   the global model and the typical accepted update of earlier rounds (``update_problems``); free-riders are
   recorded;
3. the candidate global model of the accepted results (``model_problems``): when it fails, the results
   responsible are found by leaving each out and rejected, and the rest aggregate; when none can be singled out,
   the round's aggregation is discarded and the last good global model stays.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from ..core.aggregation import AggregationResult, Contribution, ContributionRejected, SurgicalAggregator
from ..core.checks.metrics import check_metrics
from ..core.checks.model import ModelOutputs, blame_for_failing_model, model_problems
from ..core.checks.result import CheckedResult
from ..core.checks.update import (
    MIN_SITES_FOR_DIRECTION,
    UpdateReference,
    capped_weights,
    clip_factors,
    clipped_state,
    consensus_cosines,
    consensus_is_no_ones,
    free_riders,
    opposed_updates,
    persistently_opposed,
    update_problems,
    update_sizes,
    weight_change,
)
from ..core.head import HeadSpec
from ..core.noise import noise_seed, noised_state
from ..core.robust import (
    RobustOutcome,
    RobustRule,
    SharedRows,
    SiteResult,
    duplicates_and_closest,
    merged_rows,
    peeled_opposed_at_warmup,
    robust_state,
    shared_rows_against_consensus,
    two_site_agreement,
    two_sites_apart,
)
from ..core.robust_lr import voted_state
from ..training.privacy import UNITS as PRIVACY_UNITS
from .handshake import SiteInfo
from .protocol import META_CLASS_NAMES, META_WARMUP, TASK_TRAIN


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
    clip_updates: bool = True  # each part of an update at most the round's median (three or more sites)
    # a backbone update against the others' median direction is rejected: every round (True), or only in the first
    # round that judges each site's direction (OPPOSED_FIRST_ROUND)
    reject_opposed_updates: bool | str = False
    robust: RobustRule = field(default_factory=lambda: RobustRule("mean"))  # parts three or more sites moved
    update_noise: float = 0.0  # FLAME's lambda: noise of lambda x the median update norm on the aggregate (0: none)
    robust_learning_rate: int = 0  # RLR's theta: a value is turned back where fewer site signs agree (0: off)

    def consensus(self, changes: np.ndarray) -> np.ndarray:
        """The round's consensus of the backbone updates (one row per site), and of each shared head row in the
        warm-up round's check: the backbone's robust rule's aggregate, or the coordinate-wise median where that rule
        is the mean (which one site can move anywhere)."""
        backbone = self.robust.backbone
        return (RobustRule("median") if backbone.is_mean else backbone)(changes)

    def aggregator(self, state: Mapping[str, Any], classes: Sequence[str]) -> SurgicalAggregator:
        """An aggregator over the global model ``state`` (head rows ``classes``): it checks each arriving result,
        and (a fresh one per candidate) sums the accepted ones."""
        return SurgicalAggregator(state, classes, self.backbone_strategy, self.weighting, self.head, self.normalize)


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
    clipped: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> part -> the factor it was scaled by
    excluded: list[str] = field(default_factory=list)  # sites the screening left out for the rest of the job
    weights: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> claimed and used weight, when capped
    model_check: list[str] = field(default_factory=list)  # why the first candidate failed (empty: it passed)
    robust_parts: dict[str, int] = field(default_factory=dict)  # part -> sites its robust rule aggregated
    noise: dict[str, float] = field(default_factory=dict)  # part -> the standard deviation of the noise it took
    turned_back: dict[str, float] = field(default_factory=dict)  # part -> the share of values RLR turned back
    row_agreement: dict[str, float] = field(default_factory=dict)  # site -> its shared rows' cosine with theirs
    shared_rows: dict[str, SharedRows] = field(default_factory=dict)  # as sent, before clipping
    opposed_at_warmup: list[str] = field(default_factory=list)  # rejected for their warm-up rows: out for the job
    row_turns: dict[str, dict[str, float]] = field(default_factory=dict)  # site -> class -> its row's turn
    contributors: list[str] = field(default_factory=list)  # the accepted results the mean is made of
    directions: dict[str, float] = field(default_factory=dict)  # site -> cosine of its update with the consensus
    direction_judged: list[str] = field(default_factory=list)  # sites the direction check judged (could reject) now
    opposition: dict[str, float] = field(default_factory=dict)  # judged before: site -> its running opposition (CUSUM)
    duplicates: list[list[str]] = field(default_factory=list)  # sites whose backbone updates are one update (robust)
    closest_updates: float | None = None  # the smallest relative distance between two sites' backbone updates
    two_sites: dict[str, Any] = field(default_factory=dict)  # a round of two: how their updates compare
    two_sites_apart: list[str] = field(default_factory=list)  # why the two are further apart than honest pairs come
    privacy: dict[str, dict[str, Any]] = field(default_factory=dict)  # DP-SGD sites: their checked privacy report
    budget_spent: dict[str, str] = field(default_factory=dict)  # site -> why it did not train (its budget)

    def answered(self) -> set[str]:
        return set(self.arrivals) | set(self.rejected) | set(self.failed) | set(self.budget_spent)

    def receive_privacy(self, site: str, report: Any) -> bool:
        """A DP-SGD site's privacy report (``META_PRIVACY``), kept for the history when its numbers are numbers;
        True when the site stopped training (its budget is spent: it sent no update)."""
        numbers = ("epsilon", "delta", "budget")
        valid = isinstance(report, Mapping) and all(
            isinstance(report.get(key), (int, float)) and not isinstance(report.get(key), bool)
            and math.isfinite(report[key]) and report[key] >= 0
            for key in numbers
        ) and isinstance(report.get("stopped"), bool) and report.get("unit") in PRIVACY_UNITS  # fmt: skip
        if not valid:
            self.metric_problems.setdefault(site, []).append(f"privacy report {report!r}: not numbers")
            return False
        self.privacy[site] = {key: float(report[key]) for key in numbers} | {
            "unit": report["unit"],
            "stopped": report["stopped"],
        }
        if report["stopped"]:
            self.budget_spent[site] = (
                f"its differential-privacy budget is spent (epsilon {report['epsilon']:.3f} per {report['unit']} of "
                f"{report['budget']:.3f} at delta {report['delta']:g}): it no longer trains"
            )
        return report["stopped"]

    def receive(
        self,
        contribution: Contribution,
        metrics: Any,
        info: SiteInfo,
        sent: tuple[Mapping[str, Any], Mapping[str, Any]],
        checker: SurgicalAggregator,
    ) -> str | None:
        """Check one arriving result and its metrics (``info``: the site's handshake, ``sent``: the params and meta of
        the task it answers); keep it when valid. Returns the rejection reason, if any."""
        site = contribution.client
        valid, problems = check_metrics(metrics, [*info.classes, *info.reported])
        if problems:
            self.metric_problems[site] = problems
        if "val_loss" in valid:
            self.metrics[site] = valid
        try:
            checked = checker.check(contribution, others=list(self.arrivals))
        except ContributionRejected as rejection:
            self.rejected[site] = rejection.reason
            return rejection.reason
        params, meta = sent
        self.arrivals[site] = Arrival(contribution, checked, params, meta[META_CLASS_NAMES], bool(meta[META_WARMUP]))
        return None

    def aggregate(
        self,
        state: Mapping[str, Any],
        classes: Sequence[str],
        rules: RoundRules,
        reference: UpdateReference,
        excluded: Collection[str] = (),
        warmup_round: bool = False,
        judged_by_direction: Mapping[str, float] | None = None,
    ) -> AggregationResult:
        """The round's global model from its valid results (see the module's docstring for the order of the
        checks); ``reference`` learns the accepted updates' sizes. The results of ``excluded`` sites (left out of an
        earlier round by the screening, for the rest of the job) take no part: not in the consensus, the clipping,
        the typical update or the mean. ``warmup_round``: the job's first round from untrained heads, the one in which
        the sites' shared head rows are judged (``opposed_at_warmup``) and a round of two by its directions
        (``two_sites_apart``). ``judged_by_direction``: the sites an earlier round's direction check judged, each
        with its running opposition; under ``OPPOSED_FIRST_ROUND`` it judges the others only, so each site once, in
        the first round that measures its update's direction and judges it (a site that misses the job's first round
        is judged when it comes; a round in which half or more of the updates point against the consensus judges
        nobody), and holds the sites judged before to their running opposition (``persistently_opposed``)."""
        judged_by_direction = judged_by_direction or {}
        self.excluded = sorted(set(excluded) & set(self.arrivals))

        averaged = rules.aggregator(state, classes).averaged_keys
        sizes = {}
        for site, arrival in sorted(self.arrivals.items()):
            if site in self.excluded:
                continue
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
            sizes[site].samples = float(contribution.num_samples)
            self.update_sizes[site] = sizes[site].summary()
            if sizes[site].row_turns:
                self.row_turns[site] = dict(sizes[site].row_turns)
            told, details = update_problems(sizes[site], reference, rules.update_bound, arrival.warmup)
            if told:
                self.rejected[site] = "; ".join(told)
                self.rejection_details[site] = details
        candidates = [site for site in sorted(self.arrivals) if site not in self.rejected and site not in self.excluded]
        changes = {}  # each backbone update, taken once: the direction checks and a round of two read them
        if len(candidates) >= 2:
            for site in candidates:
                arrival = self.arrivals[site]
                changes[site] = weight_change(arrival.contribution.state, arrival.received, averaged, rules.head)
        if len(candidates) >= MIN_SITES_FOR_DIRECTION:
            stacked = np.stack([changes[site] for site in candidates])
            groups, self.closest_updates = duplicates_and_closest(stacked)
            self.duplicates = [[candidates[index] for index in group] for group in groups]
            # a copy counted once here too: counted twice, it is the consensus of three, and an honest update
            # nearly orthogonal to it (another label set) reads as opposed and is rejected (the suite's mimic)
            consensus = rules.consensus(merged_rows(stacked, groups))
            self.directions = consensus_cosines(changes, consensus)
            if rules.reject_opposed_updates:
                opposed = opposed_updates(changes, consensus)
                pointing_against = [site for site, cosine in self.directions.items() if cosine <= 0]
                spared = consensus_is_no_ones(pointing_against, len(changes))
                self.direction_judged = [] if spared else sorted(self.directions)
                if rules.reject_opposed_updates is not True:  # first round only: each site's first judged one
                    opposed = {site: why for site, why in opposed.items() if site not in judged_by_direction}
                    self.direction_judged = [site for site in self.direction_judged if site not in judged_by_direction]
                    # after it, an opposition that persists (a round that is no one's carries it)
                    self.opposition, persistent = persistently_opposed(
                        self.directions, judged_by_direction, consensus_is_someones=not spared
                    )
                    opposed.update(persistent)
                self.rejected.update(opposed)
                candidates = [site for site in candidates if site not in self.rejected]
            rows = {site: sizes[site].row_changes for site in candidates}
            if rules.reject_opposed_updates and warmup_round:  # judged then only: later, honest rows pull apart
                warming = [site for site in candidates if self.arrivals[site].warmup]
                opposed, self.shared_rows = peeled_opposed_at_warmup(rows, rules.consensus, warming)
                self.rejected.update(opposed)
                self.opposed_at_warmup = sorted(opposed)
                candidates = [site for site in candidates if site not in self.rejected]
            else:
                self.shared_rows = shared_rows_against_consensus(rows, rules.consensus)
        if len(candidates) == 2:  # the two left (the rest rejected above), their updates already taken
            pair = {site: changes[site] for site in candidates}
            self.two_sites = two_site_agreement(pair, {site: sizes[site] for site in candidates})
            if rules.reject_opposed_updates:  # the loop stops the job on it
                self.two_sites_apart = two_sites_apart(self.two_sites, warmup_round=warmup_round)
        if rules.clip_updates:  # free-riders' near-zero updates would pull the median down: left out of it
            riders = set(free_riders({site: sizes[site] for site in candidates}))
            self.clipped = clip_factors(
                {site: sizes[site] for site in candidates if site not in riders}, rules.normalize
            )
        aggregates: dict[tuple[str, ...], AggregationResult] = {}
        robust_parts: dict[tuple[str, ...], RobustOutcome] = {}
        noise_parts: dict[tuple[str, ...], dict[str, float]] = {}
        vote_parts: dict[tuple[str, ...], dict[str, float]] = {}

        def contribution_of(site: str) -> Contribution:
            arrival, factors = self.arrivals[site], self.clipped.get(site)
            if not factors:
                return arrival.contribution
            sent = arrival.contribution
            clipped = clipped_state(
                sent.state,
                sent.class_names,
                arrival.received,
                arrival.received_classes,
                factors,
                averaged,
                rules.head,
                rules.normalize,
            )
            return replace(sent, state=clipped)

        def aggregate_of(sites: Sequence[str]) -> AggregationResult:
            key = tuple(sites)
            if key not in aggregates:
                combined = rules.aggregator(state, classes)
                weights = capped_weights({site: self.arrivals[site].checked.weight for site in sites})
                clipped = {site: contribution_of(site) for site in sites}  # once: the mean, the rule and the noise
                for site in sites:  # name order: the same sums on every run
                    checked = replace(self.arrivals[site].checked, weight=weights[site])
                    combined.add_checked(clipped[site], checked)
                result = combined.finalize()
                if not rules.robust.is_mean:
                    sent = [SiteResult(clipped[site].state, self.arrivals[site].contribution.class_names, site)
                            for site in sites]  # fmt: skip
                    robust = robust_state(
                        result.state, state, classes, sent, averaged, rules.robust, rules.head, rules.normalize
                    )
                    result = replace(result, state=robust.state)
                    robust_parts[key] = robust
                sent_rows = [(clipped[site].state, self.arrivals[site].contribution.class_names)
                             for site in sites]  # fmt: skip
                if rules.robust_learning_rate:
                    voted, vote_parts[key] = voted_state(
                        result.state,
                        state,
                        classes,
                        sent_rows,
                        averaged,
                        rules.robust_learning_rate,
                        rules.head,
                        rules.normalize,
                    )
                    result = replace(result, state=voted)
                if rules.update_noise > 0:
                    noised, noise_parts[key] = noised_state(
                        result.state,
                        state,
                        classes,
                        sent_rows,
                        averaged,
                        rules.update_noise,
                        noise_seed(self.number, sites),
                        rules.head,
                        rules.normalize,
                    )
                    result = replace(result, state=noised)
                aggregates[key] = result
            return aggregates[key]

        def problems_of(sites: Sequence[str]) -> list[str]:
            candidate = aggregate_of(sites)
            return model_problems(candidate.state, candidate.class_names, rules.outputs)

        kept, blamed, self.model_check = (
            blame_for_failing_model(candidates, problems_of) if candidates else ([], {}, [])
        )
        self._aggregate_of, self._problems_of = aggregate_of, problems_of
        self.rejected.update(blamed)
        self.free_riders = free_riders({site: sizes[site] for site in kept})
        typical = [site for site in kept if site not in self.free_riders]
        reference.record([sizes[site] for site in typical], [self.arrivals[site].warmup for site in typical])
        # a free-rider's zero update would only shrink the others' step (by a share its claimed count buys): valid,
        # recorded, and left out of the mean, unless nothing else is left
        contributors = typical or kept
        result = replace(aggregate_of(contributors), accepted=list(kept))
        robust = robust_parts.get(tuple(contributors))
        if robust is not None:
            self.robust_parts, self.row_agreement = robust.parts, robust.agreement
        self.noise = noise_parts.get(tuple(contributors), {})
        self.turned_back = vote_parts.get(tuple(contributors), {})
        self.contributors = list(contributors)
        result.rejected = dict(self.rejected)
        claimed = {site: self.arrivals[site].checked.weight for site in contributors}
        self.weights = {
            site: {"claimed": claimed[site], "used": used}
            for site, used in capped_weights(claimed).items()
            if used < claimed[site]
        }
        self.clipped = {site: factors for site, factors in self.clipped.items() if site in kept}
        return result

    def candidate(self, leave_out: Collection[str]) -> AggregationResult | None:
        """The round's aggregate of its contributors but ``leave_out`` (after :meth:`aggregate`, with its clipping and
        weights); None when none is left or the model check fails it."""
        sites = [site for site in self.contributors if site not in leave_out]
        if not sites or self._problems_of(sites):
            return None
        return replace(self._aggregate_of(sites), accepted=sites)

    def report(self, result: AggregationResult, rejected_on_arrival: Sequence[str]) -> list[tuple[str, str]]:
        """What the server's log says of the round's aggregation: (level, line), level ``error``, ``warning`` or
        ``info`` (results rejected on arrival were logged then)."""
        lines = []
        for site, reason in sorted(result.rejected.items()):
            if site not in rejected_on_arrival:
                lines.append(("error", f"round {self.number}: contribution from {site!r} rejected: {reason}"))
            for detail in self.rejection_details.get(site, []):
                lines.append(("info", f"round {self.number}: {site}'s update, against the typical one: {detail}"))
        if self.model_check:
            left_out = sorted(set(result.rejected) - set(rejected_on_arrival))
            then = (
                f"aggregated without {left_out}"
                if result.accepted
                else "the round's aggregation is discarded and the last good global model stays"
            )
            failed = "; ".join(self.model_check[:3])
            lines.append(
                ("error", f"round {self.number}: the candidate global model failed the model check ({failed}); {then}")
            )
        for group in self.duplicates:
            lines.append(
                ("warning", f"round {self.number}: {group} sent the same backbone update: a robust rule counts it once")
            )
        if self.free_riders:
            riders = f"free-rider(s) {self.free_riders}: their updates barely moved the model; left out of the mean"
            lines.append(("warning", f"round {self.number}: {riders}"))
        for site, factors in sorted(self.clipped.items()):
            parts = ", ".join(f"{part} x{factor:.3g}" for part, factor in sorted(factors.items()))
            lines.append(("info", f"round {self.number}: {site}'s update clipped to the round's median: {parts}"))
        for site, weight in sorted(self.weights.items()):
            lines.append(
                (
                    "warning",
                    f"round {self.number}: {site} claims {weight['claimed']:g} training samples, more than all the "
                    f"other sites together: it weighs {weight['used']:g}",
                )
            )
        return lines

    def outcomes(self, sites: Sequence[str], accepted: Sequence[str]) -> dict[str, dict[str, Any]]:
        """How each site's result fared (told to the site with its next task; its log and audit record it)."""
        told = {}
        for site in sites:
            if site in accepted:
                outcome: dict[str, Any] = {"status": "aggregated"}
                if site in self.free_riders:
                    outcome["note"] = "its update barely moved the model (a free-rider: left out of the mean)"
            elif site in self.excluded:  # the loop says since when and why
                outcome = {"status": "excluded"}
            elif site in self.rejected:
                outcome = {"status": "rejected", "reason": self.rejected[site]}
            elif site in self.failed:
                outcome = {"status": "failed", "reason": f"its training task failed ({self.failed[site]})"}
            elif site in self.budget_spent:
                outcome = {"status": "budget_spent", "reason": self.budget_spent[site]}
            else:
                outcome = {"status": "not_received", "reason": "no result arrived in time; a late result is dropped"}
            if self.metric_problems.get(site):
                outcome["rejected_metrics"] = self.metric_problems[site]
            told[site] = {"task": TASK_TRAIN, "round": self.number, **outcome}
        return told

    def record(self, accepted: Sequence[str], missing: Sequence[str]) -> dict[str, Any]:
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
        if self.clipped:
            entry["clipped"] = {
                site: {part: float(f"{factor:.4g}") for part, factor in factors.items()}
                for site, factors in self.clipped.items()
            }
        if self.weights:
            entry["capped_weights"] = dict(self.weights)
        if self.privacy:  # each DP-SGD site's epsilon spent so far, by round
            entry["privacy"] = dict(self.privacy)
        if self.budget_spent:
            entry["budget_spent"] = dict(self.budget_spent)
        if self.model_check:
            entry["model_check"] = list(self.model_check)
        if self.directions:  # each backbone update's cosine with the round's consensus (its robust aggregate)
            entry["directions"] = {site: round(value, 4) for site, value in self.directions.items()}
        if self.direction_judged:  # judged by direction: under "first_round", not again (the loop reads it back)
            entry["direction_judged"] = list(self.direction_judged)
        if self.opposition:  # the sites judged before: each one's running opposition (the loop reads it back)
            entry["opposition"] = {site: round(value, 4) for site, value in self.opposition.items()}
        if self.closest_updates is not None:  # how near two sites' backbone updates came (duplicates: within 1e-3)
            entry["closest_updates"] = float(f"{self.closest_updates:.4g}")
        if self.two_sites:  # a round of two sites: their backbone cosine, size ratios and shared rows' cosine
            entry["two_sites"] = {
                name: (round(value, 4) if isinstance(value, float) else value) for name, value in self.two_sites.items()
            }
        if self.two_sites_apart:  # the loop stops the job: two sites, and the server cannot tell which
            entry["two_sites_apart"] = list(self.two_sites_apart)
        if self.duplicates:
            entry["duplicates"] = [list(group) for group in self.duplicates]
        if self.robust_parts:  # the parts a robust rule aggregated: how many sites each
            entry["robust"] = dict(self.robust_parts)
        if self.noise:  # the standard deviation of the noise each part took (update_noise)
            entry["noise"] = {part: float(f"{deviation:.4g}") for part, deviation in self.noise.items()}
        if self.turned_back:  # the share of each part's values the robust learning rate turned back
            entry["robust_learning_rate"] = {part: round(share, 4) for part, share in self.turned_back.items()}
        if self.shared_rows:  # each site's shared head rows (three or more holders) as sent, against their consensus
            entry["shared_rows"] = {
                site: {
                    "cosine": round(shared.cosine, 4),
                    "rows": shared.rows,
                    "scale": round(shared.scale, 4),
                    "mean_cosine": round(shared.mean_cosine, 4),
                    **({"split": shared.split} if shared.split else {}),
                }
                for site, shared in sorted(self.shared_rows.items())
            }
        if self.row_turns:  # each site's head-row updates against the rows it received: a record, not a rule
            entry["row_turns"] = {
                site: {
                    "mean_cosine": round(float(np.mean(list(turns.values()))), 4),
                    "rows": len(turns),
                    "lowest": round(min(turns.values()), 4),
                    "below_zero": sum(turn < 0 for turn in turns.values()),
                }
                for site, turns in sorted(self.row_turns.items())
            }
        if self.opposed_at_warmup:  # the loop leaves them out for the rest of the job
            entry["opposed_at_warmup"] = list(self.opposed_at_warmup)
        if self.row_agreement:  # each site's shared head rows (three or more holders) against theirs: a record
            entry["row_agreement"] = {site: round(value, 4) for site, value in sorted(self.row_agreement.items())}
        return entry
