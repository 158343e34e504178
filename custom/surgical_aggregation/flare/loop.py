"""The round loop both server workflows share (plain and blind): train, aggregate a candidate, have the sites validate
it, screen it for harm, leave out what harms, judge, keep, and at the end publish.

Each round:

1. every site is sent the last good model and trains (``_train``: how the model travels and which checks the server
   can run on an update are the workflow's own: tensors and every check of ``core.checks`` in the plain workflow,
   ciphertexts in the blind one);
2. the valid results make a candidate (``_candidate``); every site validates it on its own validation images and
   reports, paired over those images, how much worse it is than the model the site trained itself this round;
3. the candidate is screened (``core.judging``): a site whose harm test is rejected at the job's false-alarm rate
   flags it. With three or more contributions the round is recomputed without each contribution in turn and a
   contribution whose leave-one-out candidate clears the harm is left out (``excluded`` in the round's history, the
   log, the summary); with two the server cannot decide and the job stops; a harm no single exclusion clears is kept
   on record when one site raises it and stops the job when several do;
4. the chosen model is judged (the best model by the judging sites' validation loss, early stopping) and kept.

Whatever the workflow, a rule written here holds in both modes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.fuel.utils.log_utils import center_message

from ..core.checks.metrics import check_metrics
from ..core.errors import UserError
from ..core.judging import (
    Decision,
    after_exclusion,
    batchnorm_apart,
    decide,
    flagged,
    improvement_of,
    recalibrated_improvement_of,
    round_level,
    verdict_of,
)
from ..evaluation.run_summary import INITIAL_ROUND, model_label
from .protocol import JOB_FAILED, META_COMPARE_TO, META_MODEL_KEY, META_ROUND, TASK_VALIDATE
from .state import FederationState, SavedVersion, history_entry, initial_bar, judge
from .tasks import SiteTasks

EXCLUDED = (
    "left out of the round: more than half of the other sites' validation found the model made without its result "
    "materially better"
)
FIRST = "the round's candidate"  # the key of a round's first candidate (leave-one-out ones: "without <site>")


TWO_SITES_APART = (
    "further apart than any honest pair of the clean sweep's two-site federations: with two sites the server cannot "
    "tell which result is hostile"
)


# the end of every message of a job the server stops: what is kept, and the operator's way out
NOTHING_PUBLISHED = (
    "Nothing is published; the last good global model stays on disk. Compare the sites' logs and data; write-job "
    "--leave-out names a site the next job runs without"
)


class FederationCannotProceed(RuntimeError):
    """Why a job stops early (too few sites at the handshake, no progress, an unusable model, a saved federation
    that cannot be continued, a full disk, sites whose validation the server cannot reconcile)."""


@dataclass
class RoundResults:
    """What a round's training gathered, as the loop needs it (the workflow keeps the rest)."""

    accepted: list[str]  # sites whose results are valid
    contributors: list[str]  # those whose results go into the mean (free-riders left out)
    record: dict[str, Any] = field(default_factory=dict)  # the round's ``aggregation`` entry of the history
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)  # site -> how its result fared (told later)
    received_validation: dict[str, dict[str, float]] = field(default_factory=dict)  # of the model they trained from
    trained: list[str] = field(default_factory=list)  # every site that sent a trained result, valid or rejected
    two_sites_apart: list[str] = field(default_factory=list)  # a round of two further apart than honest pairs


class FederationLoop(SiteTasks):
    """The loop; a workflow supplies how a round trains and how a candidate is made, sent and kept."""

    num_rounds: int
    min_clients: int
    patience: int
    min_delta: float
    validation_guard: bool
    judging_sites: list[str] | None
    validate_timeout: int
    _federation: FederationState

    def __init__(self, persistor_id: str) -> None:
        super().__init__(persistor_id)
        self._keys: dict[int, str] = {}  # round -> the key its chosen candidate was validated under
        # the job started from a model with trained head rows (an earlier global model): its round 0 is judged as any
        self._started_trained = False

    # --- what a workflow supplies --------------------------------------------------------------------------

    def _open(self) -> FederationState:
        """The handshake, then the federation this job starts or continues."""
        raise NotImplementedError

    def _site_names(self) -> list[str]:
        """The sites admitted at the handshake."""
        raise NotImplementedError

    def _train(self, round_number: int, latest: SavedVersion) -> RoundResults | None:
        """Send each site the last good model, gather and check the results (None: aborted)."""
        raise NotImplementedError

    def _candidate(self, round_number: int, leave_out: frozenset[str] = frozenset()) -> SavedVersion | None:
        """The round's model made of its contributors' results but ``leave_out``'s (None: none can be made)."""
        raise NotImplementedError

    def _model_for(self, version: SavedVersion, site: str) -> FLModel:
        """What ``site`` is sent of ``version`` to validate (its own slice, or its own ciphertexts)."""
        raise NotImplementedError

    def _adopt(self, latest: SavedVersion) -> None:
        """``latest`` is the last good model now: keep it (files, FLARE's events)."""

    def _became_best(self, version: SavedVersion) -> None:
        """``version`` is the best model now."""

    def _checkpoint(self) -> None:
        """Persist what the federation needs to continue and the history."""

    def _finish(self, latest: SavedVersion) -> None:
        """After the last round: evaluate, publish, export."""

    def _summarise(self) -> None:
        """The job's last lines, once its state says it finished."""

    def _model_key(self, version: SavedVersion) -> str | None:
        """The key under which the sites validated ``version`` in its round (a training task names it, so that a site
        does not validate the same model twice); None for a model validated in no round of this job."""
        return self._keys.get(version.round)

    def _validation_sizes(self) -> dict[str, int | None]:
        """site -> the validation images it declared at the handshake (the floor under its standard errors)."""
        return {}

    def _tolerated(self, contributors: int) -> int:
        """How many contributions a round may leave out (the robust rule's tolerated hostile sites)."""
        return (contributors - 1) // 2

    # --- the loop ------------------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except (FederationCannotProceed, UserError) as reason:  # the job's own end, said once (FLARE adds a traceback)
            self.error(f"{JOB_FAILED}{reason}")
            self.panic(str(reason))

    def _run(self) -> None:
        federation = self._open()
        latest = federation.latest
        for round_number in range(latest.round + 1, self.num_rounds):
            if self.abort_signal.triggered:
                return
            if federation.rounds_without_improvement >= self.patience:
                break
            self.info(center_message(f"Round {round_number} started", boarder_str="-"))
            started = time.perf_counter()
            results = self._train(round_number, latest)
            if results is None:  # aborted
                return
            if latest.round == INITIAL_ROUND or "validation" not in history_entry(federation.history, latest.round):
                self._record_received(latest, results)
            decision, chosen = None, None
            entry = history_entry(federation.history, round_number)
            entry["aggregation"] = {**results.record, "trained_from": federation.latest.round}
            if results.two_sites_apart:
                self._checkpoint()
                raise FederationCannotProceed(self._apart_message(round_number, results))
            if len(results.accepted) >= self.min_clients:
                decision, chosen = self._screened(round_number, results)
            if chosen is not None:
                latest = chosen
                federation.aggregated_rounds += 1
                self.info(f"round {round_number}: the global model is {self._made_of(results, decision)}")
            else:
                self.warning(
                    f"round {round_number}: only {len(results.accepted)} valid contribution(s) "
                    f"({results.accepted}), {self.min_clients} needed: keeping the last good global model"
                )
            if decision is not None and decision.excluded:
                entry["aggregation"]["excluded"] = {
                    site: self._exclusion_reason(site, round_number) for site in decision.excluded
                }
            entry["aggregation"]["seconds"] = round(time.perf_counter() - started, 2)
            for site, outcome in results.outcomes.items():
                if decision is not None and site in decision.excluded:
                    outcome = {**outcome, "status": "excluded", "reason": self._exclusion_reason(site, round_number)}
                self.tell_next_time(site, outcome)
            federation.latest = latest
            if chosen is not None:
                self._adopt(latest)
            elif latest.round == INITIAL_ROUND:  # no good model yet: the initial one goes on disk, marked untrained
                self._adopt(replace(latest, round=round_number))
            self._checkpoint()
            if federation.rounds_without_improvement >= self.patience:
                self.info(f"early stop: {self.patience} validated rounds without improvement beyond {self.min_delta}")
        self._end(latest)

    def _end(self, latest: SavedVersion) -> None:
        federation = self._federation
        ran = [entry["round"] for entry in federation.history if "aggregation" in entry]
        if ran and federation.aggregated_rounds == 0:
            self._fail_without_progress(max(ran))
        if federation.best is None and federation.aggregated_rounds:
            federation.finished = True
            self._checkpoint()
            initial = initial_bar(federation, self.min_delta)
            bar = "" if math.isinf(initial) else f" (the initial model's judged loss: {initial:.4f})"
            raise FederationCannotProceed(
                "no trained global model was judged at least as good as the initial model by the sites: for none "
                "was the judging sites' change of validation loss against their own loss of the initial model (the "
                f"median of three or more, the mean of two) at most 0{bar}, or none had a validation loss of a site "
                "whose result made it (a site whose own model of the first round had a loss at least its loss of the "
                "initial model cannot veto: the round history's bar). Nothing is published; the initial model stays. "
                "See the round history and the sites' logs"
            )
        self._finish(latest)
        federation.finished = True
        self._checkpoint()
        self._summarise()

    def _fail_without_progress(self, last_round: int) -> None:
        """No round aggregated ``min_clients`` valid contributions: the job fails, naming the sites and why."""
        federation = self._federation
        federation.finished = True  # nothing to resume: a corrected job starts afresh
        self._checkpoint()
        reasons = no_progress({site: self.last_outcome(site) for site in self._site_names()}, self.min_clients)
        for site, reason in reasons.items():
            self.error(f"{site}: {reason}")
        raise FederationCannotProceed(
            f"the federation made no progress: in {last_round + 1} round(s) none aggregated {self.min_clients} valid "
            f"contribution(s) (min_clients); no global model was trained or published. Per site: {reasons}"
        )

    @staticmethod
    def _made_of(results: RoundResults, decision: Decision | None) -> str:
        left_out = decision.excluded if decision is not None else []
        made = [site for site in results.contributors if site not in left_out]
        said = f"the aggregate of {made}"
        return said + (f", without {left_out} (excluded)" if left_out else "")

    def _from_untrained_heads(self) -> bool:
        """Whether the round now training starts from untrained heads: the job's first, from no earlier model."""
        return self._federation.latest.round == INITIAL_ROUND and not self._started_trained

    def _judged_by_direction(self, round_number: int) -> dict[str, float]:
        """The sites the direction check judged in a round before ``round_number`` (its ``direction_judged``), each
        with its running opposition since (the last round's ``opposition`` that has it; 0 before any), read from the
        history, so a resumed job judges no site twice under the first-round direction check and keeps each one's
        running opposition; rounds run with the check off, or by code before stop 102, judged no one."""
        earlier = sorted(
            (entry for entry in self._federation.history if entry["round"] < round_number),
            key=lambda entry: entry["round"],
        )
        judged: dict[str, float] = {}
        for entry in earlier:
            aggregation = entry.get("aggregation") or {}
            judged.update({site: 0.0 for site in aggregation.get("direction_judged", [])})
            judged.update({site: float(value) for site, value in aggregation.get("opposition", {}).items()})
        return judged

    def _excluded_since(self, round_number: int) -> dict[str, int]:
        """site -> the round its contribution was first left out, for the rounds before ``round_number`` and the
        sites whose warm-up rows the aggregation of ``round_number`` itself rejected (``opposed_at_warmup``): read
        from the history, so a resumed job keeps them."""
        since: dict[str, int] = {}
        for entry in sorted(self._federation.history, key=lambda item: item["round"]):
            left_out = (entry.get("screening") or {}).get("excluded", []) if entry["round"] < round_number else []
            if entry["round"] <= round_number:
                left_out = [*left_out, *(entry.get("aggregation") or {}).get("opposed_at_warmup", [])]
            for site in left_out:
                since.setdefault(site, entry["round"])
        return since

    def _exclusion_reason(self, site: str, round_number: int) -> str:
        first = self._excluded_since(round_number + 1).get(site, round_number)
        if first < round_number:
            return f"left out since round {first}, when its result was first excluded: an excluded site stays out"
        aggregation = history_entry(self._federation.history, round_number).get("aggregation") or {}
        if site in aggregation.get("opposed_at_warmup", []):
            return aggregation["rejected"][site]
        return EXCLUDED

    # --- validation, screening, judging ---------------------------------------------------------------------

    def _validate(
        self, version: SavedVersion, sites: Sequence[str], key: str = FIRST, compare_to: str | None = None
    ) -> dict[str, dict[str, float]]:
        """Each of ``sites`` validates ``version`` (the round's candidate ``key``, compared with the one named
        ``compare_to``); site -> its checked metrics (rejected ones logged and recorded)."""
        validated: dict[str, dict[str, float]] = {}

        def collect(result: FLModel) -> None:
            site = (result.meta or {}).get("client_name", "?")
            self._received(TASK_VALIDATE, site, result, version.round)
            valid, problems = self._check_validation(site, result.metrics or {})
            if problems:
                entry = history_entry(self._federation.history, version.round)
                entry.setdefault("rejected_validation_metrics", {})[site] = problems
                self.error(f"rejected validation metric(s) of {site}: {'; '.join(problems)}")
            validated[site] = valid

        def task(site: str) -> FLModel:
            model = self._model_for(version, site)
            model.meta.update({META_ROUND: version.round, META_MODEL_KEY: key})
            if compare_to is not None:
                model.meta[META_COMPARE_TO] = compare_to
            return model

        self.to_each_site(TASK_VALIDATE, list(sites), task, self.validate_timeout, collect)
        return validated

    def _received(self, task: str, site: str, result: FLModel, round_number: int | None) -> None:
        """Every answer as it arrives, before it is read (the blind workflow records what it saw)."""

    def _check_validation(self, site: str, metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        """A site's validation metrics, checked (``core.checks.metrics.check_metrics``)."""
        return check_metrics(metrics)

    def _screened(self, round_number: int, results: RoundResults) -> tuple[Decision, SavedVersion | None]:
        """The round's candidate, validated by the sites, screened for harm, with a contribution left out where the
        other sites' validation says so; the job stops where the server cannot decide (``core.judging.decide``)."""
        # a contribution left out once stays out for the rest of the job (its site still trains and validates):
        # the evidence that excluded it was significant at the job's rate, and an attacker's later rounds are no
        # less harmful for showing less in a validation of a few images; at most as many as the robust rule tolerates
        earlier = self._excluded_since(round_number)
        standing = [site for site in results.trained if site in earlier]
        contributors = [site for site in (results.contributors or results.accepted) if site not in earlier]
        base = frozenset(standing)  # the plain workflow left them out of its round already; the blind one here
        room = self._tolerated(len(contributors) + len(standing)) - len(earlier)
        candidate = self._candidate(round_number, base)
        if candidate is None:
            return Decision("accept", excluded=standing), None
        validation = self._validate(candidate, self._site_names())
        # judged by the two whose results made it: a third site, rejected, cannot stop the job by its say
        judges = {site: validation[site] for site in contributors if site in validation}
        if self.validation_guard and len(contributors) == 2 and (found := batchnorm_apart(judges)):
            entry = history_entry(self._federation.history, round_number)
            entry["screening"] = {"action": "stop", "batchnorm_apart": found}
            self._checkpoint()
            raise FederationCannotProceed(
                f"round {round_number}: two sites made the candidate ({contributors}) and {'; '.join(found)}; with "
                f"two sites the server cannot tell which. {NOTHING_PUBLISHED}"
            )
        made: dict[str, tuple[SavedVersion, dict[str, dict[str, float]]]] = {FIRST: (candidate, validation)}
        decision, tests = Decision("accept"), {}
        if self.validation_guard:
            level = round_level(self.num_rounds)
            sizes = self._validation_sizes()
            # one Holm family for the round's candidate: its judges and the sites whose results were rejected
            objectors = [site for site in results.trained if site not in contributors and site not in earlier]
            tested = {site: validation[site] for site in [*contributors, *objectors] if site in validation}
            # a round from untrained heads (no round has made a model yet) is judged by the loss alone: near-chance
            # models rank at random
            untrained = self._from_untrained_heads()
            everyone = flagged(tested, sizes, level, ranking=not untrained)
            # a false exclusion needs false rejections among every site's tests of every leave-one-out candidate
            each = level / max(len(contributors) * (len(contributors) - 1), 1)

            def verdicts_without(site: str) -> dict[str, str] | None:
                version = self._candidate(round_number, base | {site})
                if version is None:
                    return None
                judges = [other for other in contributors if other != site]
                key = f"without {site}"
                figures = self._validate(version, judges, key=key, compare_to=FIRST)
                made[key] = (version, figures)
                verdicts = {}
                for judge in judges:
                    verdicts[judge] = verdict_of(figures.get(judge, {}), sizes.get(judge), each, not untrained)
                    recorded = tests.setdefault(key, {}).setdefault(judge, {"verdict": verdicts[judge]})
                    for test in improvement_of(figures.get(judge, {}), sizes.get(judge)):
                        recorded[test.kind] = {"better_by": round(test.difference, 5), "p": test.p}
                    again = recalibrated_improvement_of(figures.get(judge, {}), sizes.get(judge))
                    if again is not None and "loss" in recorded:  # how much of it a base rate is: on record
                        recorded["loss"]["recalibrated"] = {"better_by": round(again.difference, 5), "p": again.p}
                return verdicts

            decision = decide(
                contributors,
                {site: harm for site, harm in everyone.items() if site in contributors},
                verdicts_without if room > 0 else lambda site: None,
                {site: harm for site, harm in everyone.items() if site in objectors},
                untrained_start=untrained,
            )
            if decision.action == "exclude":  # the flags that count are those of the model the round keeps
                kept = made[f"without {decision.excluded[0]}"][1]
                remaining = [site for site in contributors if site not in decision.excluded and site in kept]
                kept_figures = {site: kept[site] for site in remaining}
                decision = after_exclusion(decision, flagged(kept_figures, sizes, level, ranking=not untrained))
        key = f"without {decision.excluded[0]}" if decision.excluded else FIRST
        decision.excluded[:0] = standing
        entry = history_entry(self._federation.history, round_number)
        if self.validation_guard:
            entry["screening"] = {
                "action": decision.action,
                "excluded": list(decision.excluded),
                "flags": dict(decision.flags),
                "why": decision.why,
                "left_out": tests,
            }
        for site, reason in decision.flags.items():
            self.warning(f"global model {model_label(round_number)} harms {site}: {reason}")
        if decision.action == "stop":
            self._checkpoint()
            raise FederationCannotProceed(self._stop_message(round_number, decision))
        if decision.flags and not decision.excluded:
            self.warning(f"round {round_number}: kept on record, not acted on: {decision.why}")
        for site in decision.excluded:
            self.warning(f"round {round_number}: {site} excluded: {self._exclusion_reason(site, round_number)}")
        chosen, figures = made[key]
        self._keys = {round_number: key}  # the sites validated it under this key: their next task names it
        judges = [site for site in contributors if site not in decision.excluded]
        self._judge(chosen, figures, judges)
        return decision, chosen

    def _stop_message(self, round_number: int, decision: Decision) -> str:
        harmed = "; ".join(f"for {site}, {reason}" for site, reason in decision.flags.items())
        left = f" (after leaving out {decision.excluded})" if decision.excluded else ""
        return (
            f"the global model {model_label(round_number)} harms a site{left}: {harmed}. {decision.why[:1].upper()}"
            f"{decision.why[1:]}. {NOTHING_PUBLISHED}"
        )

    @staticmethod
    def _apart_message(round_number: int, results: RoundResults) -> str:
        apart = "; ".join(results.two_sites_apart)
        return (
            f"round {round_number}: two sites made the round ({results.accepted}) and {apart}: {TWO_SITES_APART}. "
            f"{NOTHING_PUBLISHED}"
        )

    def _judge(self, version: SavedVersion, figures: dict[str, dict[str, float]], judges: Sequence[str]) -> None:
        """Best-model selection and early stopping on ``version``'s validation (``state.judge``): by the
        ``judging_sites`` among ``judges`` (the sites whose results made it)."""
        chosen = [site for site in (self.judging_sites or judges) if site in judges]
        verdict = judge(self._federation, version, figures, chosen, self.min_delta, not self._started_trained)
        if math.isnan(verdict.judged_loss):
            self.warning(f"global model {model_label(version.round)}: no validation loss of a judging site")
            return
        self.info(
            f"global model {model_label(version.round)}: {verdict.statistic} validation loss "
            f"{verdict.judged_loss:.4f} of {verdict.judges}, mean validation AUROC {verdict.mean_auroc:.4f} over "
            f"{len(figures)} site(s)"
        )
        against = verdict.against_best
        if against is not None:
            self.info(
                f"global model {model_label(version.round)}: the judging sites' {verdict.statistic} change of "
                f"validation loss against their own loss of the best so far ({model_label(against['round'])}): "
                f"{against['judged_change']:+.4f}"
            )
        if verdict.best:
            self._became_best(version)
            self.info(f"new best global model: {model_label(version.round)}")

    def _record_received(self, version: SavedVersion, results: RoundResults) -> None:
        """The sites' validation of the model they trained from, when nobody validated it before (the initial model,
        or the one a resumed job starts from): recorded, and judged only if trained (a model no aggregation went
        into is never the best)."""
        if results.received_validation:
            judge(
                self._federation,
                version,
                results.received_validation,
                list(results.accepted),
                self.min_delta,
                not self._started_trained,
            )


def no_progress(outcomes: Mapping[str, Mapping[str, Any] | None], min_clients: int) -> dict[str, str]:
    """Why each site (site -> its last outcome) did not make a round aggregate ``min_clients`` valid results."""
    reasons = {}
    for site, outcome in outcomes.items():
        outcome = outcome or {"status": "not_received"}
        if outcome["status"] == "aggregated":
            reasons[site] = f"its result was valid, but no round had {min_clients} valid contributions"
        else:
            reasons[site] = outcome.get("reason", outcome["status"])
    return reasons
