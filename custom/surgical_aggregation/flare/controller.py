"""``SurgicalAggregatorShareable``: the FLARE 2.9 server workflow of surgical aggregation, as a readable loop.

What it decides lives beside it: the handshake's checks in :mod:`.handshake`, a round's checks and aggregation in
:mod:`.rounds` (with the server's rules of :mod:`surgical_aggregation.core.checks`), best-model selection, early
stopping and the persisted state in :mod:`.state`, saving, evaluating and publishing models in :mod:`.publication`,
sending each site its own task in :mod:`.tasks`, the files a run leaves in :mod:`.results`.

1. handshake: every site reports its class names; the union head grows by the new ones, in name order (the order
   says nothing of who brought what), each new row identical at every site;
2. each round every site receives the backbone plus only its own head rows, in its own order and spelling; each
   result is checked as it arrives and held (the whole model state of each site) until the round ends; then the
   updates are bounded, the valid results summed into the global model, and that candidate checked before it
   replaces the last good one. A rejected result is logged with its reason, which the site is told with its next
   task;
3. every site validates the round's candidate on its slice; the candidate is screened for harm to a site, and a
   contribution it harms with is left out (the shared loop, :mod:`.loop`, and :mod:`surgical_aggregation.core.judging`);
4. the latest global model is saved every round, the best one chosen by the sites' validation loss, with early
   stopping; the state is persisted, so a job of the same name submitted after a server crash continues from the last
   completed round;
5. at the end the sites' validation of the last and the best global model go to FLARE's ``cross_val_results.json``,
   and the best one is published to every site (``publish_global_model``). Before that no site receives a row or a
   name of a class it does not label.

The papers' comparators run through this same loop with ``method`` (:mod:`surgical_aggregation.core.methods`):
``vanilla`` and ``partial_loss`` send every site the whole union head, ``personal`` (PFL) lets each site keep its
head (one personal model per site under ``personal_models/``); ``label_prior`` adds FedSLD, ``proximal_mu`` FedProx.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nvflare.apis.fl_constant import FLContextKey
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.fuel.utils.log_utils import center_message

from ..core.aggregation import AggregationResult, Contribution
from ..core.checks.handshake import DEFAULT_MAX_CLASS_NAME_LENGTH, DEFAULT_MAX_CLASSES_PER_SITE
from ..core.checks.metrics import check_metrics
from ..core.checks.model import ModelOutputs, model_problems
from ..core.checks.update import DEFAULT_UPDATE_BOUND, UpdateReference
from ..core.head import NAMED_HEAD, to_numpy
from ..core.labels import job_vocabulary
from ..core.methods import (
    IdentityBatchNormError,
    SiteMethod,
    check_batchnorm,
    federation_label_prior,
    head_classes_for_site,
    method_meta,
)
from ..core.robust import DEFAULT_RULE, RobustRule
from ..core.strategies import strategy
from ..evaluation.plots import validated_models
from ..evaluation.run_summary import INITIAL_ROUND, model_label, summary_lines
from ..modalities import DEFAULT_ARCHITECTURE
from ..training.checkpoint import ARCHITECTURE_KEY, probe_outputs
from .handshake import HandshakeRules, SiteInfo, admit
from .loop import FederationCannotProceed, RoundResults
from .protocol import (
    META_CLASS_NAMES,
    META_INITIAL_MODEL,
    META_METHOD,
    META_MODEL_KEY,
    META_NUM_SAMPLES,
    META_OUTCOME,
    META_PRIVACY,
    META_ROUND,
    META_WANT_LABEL_COUNTS,
    META_WARMUP,
    RESUME_LATEST,
    TASK_DESCRIBE,
    TASK_REFUSED,
    TASK_TRAIN,
)
from .publication import ServerModels
from .results import CURVES_REDRAW_SECONDS, result_files, write_history, write_union
from .rounds import Round, RoundRules
from .settings import ALWAYS_WRITTEN, checked_arguments
from .state import (
    FederationState,
    SavedVersion,
    continue_or_start,
    grow_union,
    history_entry,
    load_state,
    save_state,
    state_path,
)


class SurgicalAggregatorShareable(ServerModels):
    _always_serialize_args = ALWAYS_WRITTEN  # in the job's config even at their defaults

    def __init__(
        self,
        num_rounds: int = 10,
        min_clients: int = 2,
        method: str = "surgical",
        backbone_strategy: str = "fedavg",
        weighting: str = "uniform",
        label_prior: bool = False,
        proximal_mu: float = 0.0,
        patience: int = 25,
        min_delta: float = 1e-4,
        handshake_timeout: int = 600,
        train_timeout: int = 3600,
        validate_timeout: int = 1800,
        final_validation: bool = True,
        publish_global_model: bool = True,
        export_bundle: bool = False,
        min_sites_per_published_class: int = 1,
        resume: str | bool = RESUME_LATEST,
        update_bound: float | None = DEFAULT_UPDATE_BOUND,
        clip_updates: bool = True,
        reject_opposed_updates: bool | str = True,
        robust_aggregation: str | Mapping[str, str] = DEFAULT_RULE,
        byzantine_sites: int | None = None,
        update_noise: float = 0.0,
        robust_learning_rate: int = 0,
        validation_guard: bool = True,
        judging_sites: list | None = None,
        identity_batchnorm: bool = False,
        max_classes_per_site: int = DEFAULT_MAX_CLASSES_PER_SITE,
        max_class_name_length: int = DEFAULT_MAX_CLASS_NAME_LENGTH,
        preprocessing: dict | None = None,
        label_aliases: dict | None = None,
        accepted_classes: list | None = None,
        head_seed: int = 0,
        persistor_id: str = AppConstants.DEFAULT_PERSISTOR_ID,
    ) -> None:
        """The job config's ``args`` of this workflow; each is described, with its check, in :mod:`.settings`."""
        arguments = {name: value for name, value in locals().items() if name in _ARGUMENTS}
        super().__init__(persistor_id)
        vars(self).update(checked_arguments(arguments))  # FLARE's Job API writes the job's config from these
        # how the server reads class names: the built-in vocabulary, the job's aliases, its accepted classes
        self.vocabulary = job_vocabulary(label_aliases, accepted_classes)
        self.head = NAMED_HEAD

        self._sites: dict[str, SiteInfo] = {}
        self._prior: dict[str, float] = {}
        self._federation: FederationState | None = None
        self._state_file: Path | None = None
        self._curves_drawn = -math.inf  # when the training curves were last drawn (time.monotonic())
        self._architecture = DEFAULT_ARCHITECTURE
        self._federation_preprocessing: dict[str, Any] = {}
        self._outputs: ModelOutputs | None = None
        self._reference = UpdateReference()
        self._round: Round | None = None  # the round in progress (its candidates are made from it)
        self._candidates: dict[frozenset[str], SavedVersion | None] = {}  # left out -> the round's candidate

    # --- the loop's hooks (flare.loop) -----------------------------------------------------------------------

    def _open(self) -> FederationState:
        self.info(center_message("Start surgical aggregation"))
        initial = self.load_model()
        self._architecture = str((initial.meta or {}).get(ARCHITECTURE_KEY, DEFAULT_ARCHITECTURE))
        self._sites = self._handshake(list((initial.meta or {}).get(META_CLASS_NAMES, [])))
        self._outputs = self._probe()
        if self.label_prior:
            self._prior = federation_label_prior({site: info.label_counts for site, info in self._sites.items()})
            self.info(f"federation label prior (FedSLD): { {k: round(v, 4) for k, v in self._prior.items()} }")
        return self._start(initial)

    def _site_names(self) -> list[str]:
        return list(self._sites)

    def _validation_sizes(self) -> dict[str, int | None]:
        return {site: info.validation_size for site, info in self._sites.items()}

    def _tolerated(self, contributors: int) -> int:
        return self._robust_rule().tolerated(contributors)

    def _train(self, round_number: int, latest: SavedVersion) -> RoundResults | None:
        self._set_round(round_number)
        self.event(AppEventType.ROUND_STARTED)
        gathered = self._train_round(round_number, latest)
        if gathered is None:  # aborted
            return None
        self.event(AppEventType.BEFORE_AGGREGATION)
        aggregated = self._aggregate(gathered, latest)
        self._round, self._candidates = gathered, {}
        self._federation.typical_updates = list(self._reference.rounds)
        missing = sorted(set(self._sites) - gathered.answered())
        return RoundResults(
            accepted=list(aggregated.accepted),
            contributors=[site for site in aggregated.accepted if site not in gathered.free_riders],
            record=gathered.record(aggregated.accepted, missing),
            outcomes=gathered.outcomes(list(self._sites), aggregated.accepted),
            received_validation={
                site: gathered.metrics[site] for site in aggregated.accepted if site in gathered.metrics
            },
            trained=sorted(set(gathered.arrivals) | set(gathered.rejected)),
            two_sites_apart=list(gathered.two_sites_apart),
        )

    def _candidate(self, round_number: int, leave_out: frozenset[str] = frozenset()) -> SavedVersion | None:
        if leave_out not in self._candidates:
            result = self._round.candidate(leave_out)
            self._candidates[leave_out] = (
                None
                if result is None
                else SavedVersion(
                    round_number, result.state, result.class_names, self._personal_models(result.state), True
                )
            )
        return self._candidates[leave_out]

    def _model_for(self, version: SavedVersion, site: str) -> FLModel:
        return self._slice(version, site)

    def _check_validation(self, site: str, metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        info = self._sites[site]
        return check_metrics(metrics, [*info.classes, *info.reported])

    def _adopt(self, latest: SavedVersion) -> None:
        self._make_global(latest, AppEventType.AFTER_AGGREGATION)
        self.save_model(self._as_flmodel(latest))
        self._save_personal(latest)

    def _became_best(self, version: SavedVersion) -> None:
        self._make_global(version, AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)
        self._save_personal(version, best=True)

    def _finish(self, latest: SavedVersion) -> None:
        federation = self._federation
        if self.final_validation and latest.round > INITIAL_ROUND:
            self._evaluate_server_models(latest)
        self._refuse_unusable(federation.best or latest, "the best global model")
        if self.publish_global_model:
            self._publish_best()
        else:
            self.info("the global model is not published to the sites (publish_global_model is off)")
        if self.export_bundle:
            self._export_monai_bundle()
        self.info(center_message("Finished surgical aggregation"))

    def _summarise(self) -> None:
        for line in summary_lines(self._federation.history, result_files(Path(self.get_app_dir()))):
            self.info(line)

    # --- the federation's state ------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        return {"method": self.method, "backbone_strategy": self.backbone_strategy, "weighting": self.weighting}

    def _start(self, initial: FLModel) -> FederationState:
        """A fresh federation from the initial model, or the unfinished one this job continues."""
        self._state_file = self._state_location()
        classes = self.vocabulary.canonical_list(initial.meta.get(META_CLASS_NAMES, []), "initial model")
        saved = load_state(self._state_file, self.resume)
        federation, continued = continue_or_start(
            saved, self._settings(), dict(initial.params), classes, self._state_file
        )
        if continued:
            self.info(
                f"resuming the federation saved by job {federation.job_id} after round {federation.latest.round} "
                f"({self._state_file}): union of {len(federation.latest.class_names)} classes, "
                f"{len(federation.history)} model(s) in the history"
            )
        else:
            if classes:
                self.info(f"starting from an earlier global model with {len(classes)} classes")
            history_entry(federation.history, INITIAL_ROUND)["initial_model"] = {
                "origin": initial.meta.get(META_INITIAL_MODEL, "given by the job's persistor"),
                "backbone_strategy": self.backbone_strategy,
            }
        self._federation = federation
        self._started_trained = bool(classes)
        self._reference = UpdateReference(list(federation.typical_updates))
        handshake_classes = {name for info in self._sites.values() for name in info.classes}
        new = grow_union(federation, handshake_classes, self.head, self.head_seed)
        fresh = f" ({len(new)} new: their rows start from scratch)" if new else ""
        self.info(f"union head: {len(federation.latest.class_names)} classes{fresh}")
        self._refuse_unusable(federation.latest, "the global model this job starts from")
        try:
            check_batchnorm(self._site_method(None), federation.latest.state, "the global model this job starts from")
        except IdentityBatchNormError as error:
            raise FederationCannotProceed(str(error)) from None
        self._write_union_table()
        if federation.best is not None:  # the new job's folder gets the best model too
            self._make_global(federation.best, AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)
        self._checkpoint()
        return federation

    def _probe(self) -> ModelOutputs:
        """The model check's forward pass: the federation's model on its modality's probe input."""
        return probe_outputs(self._architecture, self._federation_preprocessing)

    def _refuse_unusable(self, version: SavedVersion, what: str) -> None:
        """A model that fails the model check cannot start, continue or end a federation: the job fails."""
        problems = model_problems(version.state, version.class_names, self._outputs)
        if problems:
            raise FederationCannotProceed(
                f"{what} ({model_label(version.round)}) cannot be used: {'; '.join(problems[:3])}"
            )

    def _write_union_table(self) -> None:
        """Which sites label which class of this job (the handshake's), logged (its head) and saved as CSV."""
        path, lines = write_union({site: info.classes for site, info in self._sites.items()}, Path(self.get_app_dir()))
        for line in lines:
            self.info(line)
        self.info(f"the union table: {path}")

    def _state_location(self) -> Path:
        """``<server workspace>/surgical_aggregation/<job name>/federation.pt``: shared by the jobs of one name."""
        job_meta = self.fl_ctx.get_prop(FLContextKey.JOB_META) or {}
        workspace = self.fl_ctx.get_engine().get_workspace()
        return state_path(workspace.get_root_dir(), str(job_meta.get("name", "job")))

    def _checkpoint(self) -> None:
        self._federation.job_id = self.fl_ctx.get_job_id() or ""
        save_state(self._state_file, self._federation)
        now = time.monotonic()
        draw = self._federation.finished or now - self._curves_drawn >= CURVES_REDRAW_SECONDS
        if problem := write_history(self._federation.history, Path(self.get_app_dir()), draw_curves=draw):
            self.warning(problem)
        if draw and validated_models(self._federation.history):
            self._curves_drawn = now

    # --- steps ------------------------------------------------------------------------------------

    def _handshake(self, initial_classes: list[str]) -> dict[str, SiteInfo]:
        """Ask every site for its class names; at least ``min_clients`` must pass the handshake's checks (a class
        must not look like one of ``initial_classes``, the model's, either)."""
        results = self.ask_every_site(
            TASK_DESCRIBE, FLModel(params={}, meta={META_WANT_LABEL_COUNTS: self.label_prior}), self.handshake_timeout
        )
        rules = HandshakeRules(self.vocabulary, self.max_classes_per_site, self.max_class_name_length, self.label_prior)
        answers = {result.meta.get("client_name", "?"): result.meta or {} for result in results}
        admission = admit(answers, rules, self.preprocessing, initial_classes)
        for site, reason in admission.unreadable.items():
            self.error(f"handshake with {site} failed, leaving it out: {reason}")
        for site, info in admission.sites.items():
            self.info(f"{site}: {len(info.classes)} classes, {info.num_samples} training samples ({info.data})")
        for site, reason in admission.refused.items():
            self.error(f"handshake with {site} refused: {reason}")
        self._federation_preprocessing = admission.preprocessing
        refused = {**admission.unreadable, **admission.refused}
        if refused:  # each is told why (its log says it, in one line), then sent nothing more
            self.to_each_site(
                TASK_REFUSED,
                sorted(refused),
                lambda site: FLModel(params={}, meta={META_OUTCOME: refusal(refused[site])}),
                self.handshake_timeout,
                lambda result: None,
            )
        if len(admission.sites) < self.min_clients:
            raise FederationCannotProceed(
                f"only {len(admission.sites)} site(s) answered the handshake ({sorted(admission.sites)}); "
                f"{self.min_clients} needed. See the sites' logs for their errors."
            )
        return admission.sites

    def _site_method(self, info: SiteInfo | None) -> SiteMethod:
        """The method's site-side settings for a site (None: those that are the same for every site)."""
        classes = info.classes if info is not None else []
        prior = {name: self._prior[name] for name in classes if name in self._prior} or None
        return SiteMethod(self.method, self.backbone_strategy, self.proximal_mu, prior, self.identity_batchnorm)

    def _personal_models(self, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """PFL: each site's model = the global backbone with the entries that site keeps (head, FedBN's BN)."""
        return {site: {**state, **parts} for site, parts in self._federation.personal_parts.items()}

    def _keep_personal(self, site: str, result_state: dict[str, Any]) -> None:
        keys = set(self.head.keys) | strategy(self.backbone_strategy).kept_at_site(result_state)
        self._federation.personal_parts[site] = {key: to_numpy(result_state[key]) for key in keys}

    def _train_round(self, round_number: int, latest: SavedVersion) -> Round | None:
        """Send each site its slice; check each result as it arrives (structure, declared rows, values, metrics).
        Returns what was gathered (None when aborted)."""
        checker = self._rules().aggregator(latest.state, latest.class_names)
        gathered = Round(round_number)
        federation = self._federation
        sent: dict[str, tuple[dict, dict]] = {}  # site -> the params and meta of its task

        def accept(result: FLModel) -> None:
            site = result.meta.get("client_name", "?")
            info, meta = self._sites[site], result.meta or {}
            if META_PRIVACY in meta and gathered.receive_privacy(site, meta[META_PRIVACY]):
                self.warning(f"round {round_number}: {site} sent no update: {gathered.budget_spent[site]}")
                return
            contribution = Contribution(
                client=site,
                state=result.params or {},
                class_names=meta.get(META_CLASS_NAMES) or [],
                num_samples=meta.get(META_NUM_SAMPLES, 0),
                expected_classes=head_classes_for_site(self.method, info.classes, latest.class_names),
                declared_samples=info.num_samples,
            )
            reason = gathered.receive(contribution, result.metrics or {}, info, sent[site], checker)
            if gathered.metric_problems.get(site):
                problems = "; ".join(gathered.metric_problems[site])
                self.error(f"round {round_number}: rejected metric(s) of {site}: {problems}")
            if reason is None:
                self.info(f"round {round_number}: received a valid contribution from {site}")
            else:
                self.error(f"round {round_number}: contribution from {site!r} rejected: {reason}")

        def train_data(site: str) -> FLModel:
            info = self._sites[site]
            # a site warms its head up once, when any of its classes starts from a fresh row
            warmup = site not in federation.warmed_up and bool(set(info.classes) & set(federation.fresh_classes))
            if site not in federation.warmed_up:
                federation.warmed_up.append(site)
            model = self._slice(
                latest,
                site,
                **{
                    META_METHOD: method_meta(self._site_method(info)),
                    META_ROUND: latest.round,
                    META_MODEL_KEY: self._model_key(latest),
                },
            )
            sent[site] = (model.params, model.meta)
            model.meta[META_WARMUP] = warmup
            model.current_round, model.total_rounds = round_number, self.num_rounds
            return model

        if not self.to_each_site(TASK_TRAIN, list(self._sites), train_data, self.train_timeout, accept):
            return None
        gathered.failed = self.failed_answers()
        for site, code in gathered.failed.items():
            self.error(f"round {round_number}: the training task of {site} failed ({code}); its log names the cause")
        missing = sorted(set(self._sites) - gathered.answered())
        if missing:
            self.warning(f"round {round_number}: no result from {missing} (late or disconnected)")
        return gathered

    def _robust_rule(self) -> RobustRule:
        return RobustRule.parse(self.robust_aggregation, self.byzantine_sites)

    def _rules(self) -> RoundRules:
        normalize = self.vocabulary.canonical
        return RoundRules(
            self.backbone_strategy,
            self.weighting,
            self.head,
            normalize,
            self.update_bound,
            self._outputs,
            self.clip_updates,
            self.reject_opposed_updates,
            self._robust_rule(),
            self.update_noise,
            self.robust_learning_rate,
        )

    def _aggregate(self, gathered: Round, latest: SavedVersion) -> AggregationResult:
        """The round's aggregation after its update bounds and the candidate model's check (see ``rounds``)."""
        on_arrival = list(gathered.rejected)
        excluded = self._excluded_since(gathered.number)  # left out of an earlier round: out for the rest of the job
        aggregated = gathered.aggregate(
            latest.state,
            latest.class_names,
            self._rules(),
            self._reference,
            excluded,
            self._from_untrained_heads(),
            self._judged_by_direction(gathered.number),
        )
        for level, line in gathered.report(aggregated, on_arrival):
            getattr(self, level)(line)
        if self.method == "personal":
            for site in aggregated.accepted:
                self._keep_personal(site, gathered.arrivals[site].contribution.state)
        return aggregated

    # --- FLARE plumbing ------------------------------------------------------------------------------

    def _set_round(self, round_number: int) -> None:
        self.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, round_number, private=True, sticky=True)
        self.fl_ctx.set_prop(AppConstants.NUM_ROUNDS, self.num_rounds, private=True, sticky=True)


# the arguments a job's config gives the controller (all but FLARE's persistor_id), kept as attributes of their names
_ARGUMENTS = frozenset(inspect.signature(SurgicalAggregatorShareable.__init__).parameters) - {"self", "persistor_id"}


def refusal(reason: str) -> dict[str, str]:
    """What a site refused at the handshake is told (its log says it, in one line)."""
    return {"task": TASK_DESCRIBE, "status": "refused", "reason": reason}
