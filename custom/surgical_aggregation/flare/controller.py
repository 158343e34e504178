"""``SurgicalAggregatorShareable``: the FLARE 2.9 server workflow of surgical aggregation.

The federation's loop, in FLARE terms; what it decides lives beside it: the handshake's checks in
:mod:`.handshake`, a round's checks and aggregation in :mod:`.rounds`, the server's rules in
:mod:`surgical_aggregation.core.checks`, best-model selection and the persisted state in :mod:`.state`.

1. handshake: every site reports its class names; the union head is built from them (classes in
   name order, so the union's order says nothing of who brought what), each class's first row
   identical at every site. A job started from an earlier global model (``initial_model``) keeps
   its classes and their learned rows and adds the new ones;
2. each round every site receives the backbone plus only its own head rows, in its own order and
   spelling; each result is checked as it arrives and held until the round ends; then the updates are
   bounded, the valid results aggregated, and the candidate global model checked before it replaces the
   last good one (a failing candidate is taken apart by leaving each result out). A rejected result is
   logged with its reason, which the site is told with its next task;
3. the latest global model is saved every round; the best one is chosen by the sites' validation BCE loss
   of the global model they received (the mean of two sites', the median of three or more, or of the
   job's ``judging_sites``), with early stopping (patience, min delta);
4. at the end every site validates its slice of the last global model, and of the best one (the
   evaluation of the server's models, written to ``cross_site_val/cross_val_results.json`` as
   FLARE's cross-site evaluation would); then, unless ``publish_global_model`` is off, the best
   global model (union head, class names, preprocessing) is published to every site. Before
   publication no site receives a row or a name of a class it does not label;
5. the federation's state is persisted after every round (``flare.state``): a job of the same name
   submitted after a server crash continues from the last completed round.

The comparators of the papers run through this same workflow with ``method`` (see
:mod:`surgical_aggregation.core.methods`): ``vanilla`` and ``partial_loss`` send every site the whole
union head (they need it; they are not private about class sets), ``personal`` (PFL) lets each
site keep its head and saves one personal model per site under ``personal_models/``;
``label_prior`` adds FedSLD's handshake and ``proximal_mu`` FedProx.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from nvflare.apis.dxo import DXO, DataKind
from nvflare.apis.fl_constant import FLContextKey, ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants, DefaultCheckpointFileName
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.workflows.model_controller import ModelController
from nvflare.fuel.utils.log_utils import center_message

from ..checkpoint import ARCHITECTURE_KEY, probe_outputs, save_checkpoint
from ..core.aggregation import WEIGHTINGS, Contribution, SurgicalAggregator
from ..core.checks import (
    DEFAULT_MAX_CLASS_NAME_LENGTH,
    DEFAULT_MAX_CLASSES_PER_SITE,
    DEFAULT_UPDATE_BOUND,
    ModelOutputs,
    UpdateReference,
    check_metrics,
    judged_loss,
    model_problems,
)
from ..core.errors import UserError
from ..core.head import NAMED_HEAD, extend_head, slice_for_client, to_numpy
from ..core.labels import Vocabulary
from ..core.methods import (
    IdentityBatchNormError,
    SiteRecipe,
    check_batchnorm,
    check_method,
    federation_label_prior,
    head_classes_for_site,
    recipe_meta,
)
from ..core.strategies import strategy
from ..data.storage import write_atomically
from ..modalities import DEFAULT_ARCHITECTURE
from ..plots import plot_training_curves
from ..run_summary import INITIAL_ROUND, model_label, summary_lines, union_table, union_table_lines, write_union_table
from .handshake import (
    HandshakeRefused,
    HandshakeRules,
    SiteInfo,
    read_site,
    refuse_look_alikes,
    refuse_other_preprocessing,
)
from .protocol import (
    JOB_FAILED,
    META_CLASS_NAMES,
    META_NUM_SAMPLES,
    META_OUTCOME,
    META_PREPROCESSING,
    META_RECIPE,
    META_ROUND,
    META_WANT_LABEL_COUNTS,
    META_WARMUP,
    RESUME_CHOICES,
    RESUME_LATEST,
    RESUME_NEVER,
    TASK_DESCRIBE,
    TASK_PUBLISH,
    TASK_REFUSED,
    TASK_TRAIN,
    TASK_VALIDATE,
)
from .rounds import Round, RoundRules
from .state import (
    FederationState,
    SavedVersion,
    load_state,
    save_state,
    select,
    state_path,
)

HISTORY_FILE = "round_history.json"
# where FLARE's ValidationJsonGenerator writes the sites' evaluation of the server's models
CROSS_SITE_FOLDER, CROSS_SITE_FILE = "cross_site_val", "cross_val_results.json"
CURVES_FILE = "training_curves.png"
UNION_FILE = "union_classes.csv"  # each class of the union, which sites label it (on the server only)
UNION_LOG_ROWS = 25  # the head of the union table in the server's log; the CSV has every class
PERSONAL_MODELS_DIR = "personal_models"  # PFL: <site>.pt (latest) and best_<site>.pt
SERVER_MODEL_PREFIX = "SRV_"  # how FLARE's cross-site evaluation names the server's models in its results


def result_files(server_app: Path) -> dict[str, Path]:
    """What a finished run leaves in the server's app folder (and its run folder), by what it is."""
    return {
        "best model": server_app / DefaultCheckpointFileName.BEST_GLOBAL_MODEL,
        "final model": server_app / DefaultCheckpointFileName.GLOBAL_MODEL,
        "round history": server_app / HISTORY_FILE,
        "training curves": server_app / CURVES_FILE,
        "per-site evaluation": server_app.parent / CROSS_SITE_FOLDER / CROSS_SITE_FILE,
        "union table": server_app / UNION_FILE,
    }


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


class FederationCannotProceed(RuntimeError):
    """Why a job stops early (too few sites at the handshake, no progress, an unusable model, a saved federation
    that cannot be continued, a full disk)."""


class SurgicalAggregatorShareable(ModelController):
    # written into the job's config even at their defaults, so an operator reading it sees the method
    _always_serialize_args = (
        "num_rounds",
        "min_clients",
        "method",
        "backbone_strategy",
        "weighting",
        "patience",
        "min_delta",
        "handshake_timeout",
        "train_timeout",
        "validate_timeout",
        "publish_global_model",
        "update_bound",
    )

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
        resume: str | bool = RESUME_LATEST,
        update_bound: float | None = DEFAULT_UPDATE_BOUND,
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
        """
        Args:
            num_rounds: maximum number of federated rounds.
            min_clients: sites needed at the handshake and valid contributions needed to update the model.
            method: "surgical" (the default), or a comparator: "vanilla", "partial_loss", "personal" (PFL).
            backbone_strategy: "fedavg" (average everything, BatchNorm statistics included),
                "fedbn_plus" (BatchNorm frozen at the initial statistics on every site, never averaged)
                or "fedbn" (each site keeps and trains its own BatchNorm; PFL only).
            weighting: "uniform" (the papers' unweighted mean) or "samples" (by training images, at most what each
                site declared at the handshake).
            label_prior: FedSLD: sites share per-class training counts once, and re-weight their loss
                by the federation's label prior the server computes from them.
            proximal_mu: FedProx's proximal term weight (0 = off).
            patience: stop after this many validated rounds without improvement of the judged
                validation loss by more than ``min_delta``.
            handshake_timeout / train_timeout / validate_timeout: seconds a site may take per task
                (0 waits forever; a dropped site then hangs the run).
            final_validation: validate the last global model (and the best) after the last round.
            publish_global_model: at the end, send the best global model (the union head and its class
                names) to every site, which keeps it in its workspace. This is when the sites learn the
                union's class names; off, the model stays on the server.
            resume: how a job treats an unfinished federation of its name saved by an earlier job (after a server
                crash): "latest" continues from its last completed round, "backup" from the state saved one
                round earlier (when the latest is damaged), "never" starts afresh.
            update_bound: reject a result whose update of a part of the model (backbone weights, BatchNorm
                statistics, a head row) is more than this many times the typical accepted update of earlier
                rounds; caps relative to the global model apply too. None turns every update bound off (research).
            judging_sites: the sites whose validation losses select the best model and stop early (None: every
                site whose result was accepted; their mean with two, their median with three or more).
            identity_batchnorm: with ``fedbn_plus``, train a model whose BatchNorm holds its default statistics
                (every BatchNorm the identity) on purpose; by default such a job is refused at its start.
            max_classes_per_site / max_class_name_length: what a site may report at the handshake.
            preprocessing: what every site must feed the model (image size, channels, normalisation, or the
                sentence encoder); a site that reports another is refused at the handshake. None: the first
                site's (in name order) decides.
            label_aliases: the consortium's synonyms, ``{"alias": "class name"}``, over the built-in ones; the
                sites read the same mapping from the job (``config/label_aliases.json``).
            accepted_classes: a closed vocabulary: a site bringing any other class is refused at the handshake
                (the run goes on with the others if ``min_clients`` allows). None: any class may join.
            head_seed: seed of the initial head rows (one generator per class name).
        """
        super().__init__(persistor_id=persistor_id, ignore_result_error=True)
        strategy(backbone_strategy)  # a known one (ValueError naming them)
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        check_method(method, backbone_strategy)
        if not proximal_mu >= 0:
            raise ValueError(f"proximal_mu must not be negative, got {proximal_mu!r}")
        for name, value in (
            ("num_rounds", num_rounds),
            ("min_clients", min_clients),
            ("max_classes_per_site", max_classes_per_site),
            ("max_class_name_length", max_class_name_length),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        resume = {True: RESUME_LATEST, False: RESUME_NEVER}.get(resume, resume) if isinstance(resume, bool) else resume
        if resume not in RESUME_CHOICES:
            raise ValueError(f"resume must be one of {RESUME_CHOICES}, got {resume!r}")
        if update_bound is not None and not update_bound > 1:
            raise ValueError(f"update_bound must be above 1 (or None for no bound), got {update_bound!r}")
        if judging_sites is not None and (isinstance(judging_sites, str) or not judging_sites):
            raise ValueError(f"judging_sites must list at least one site name (or be None), got {judging_sites!r}")
        self.num_rounds = num_rounds
        self.min_clients = min_clients
        self.method = method
        self.backbone_strategy = backbone_strategy
        self.weighting = weighting
        self.label_prior = label_prior
        self.proximal_mu = float(proximal_mu)
        self.patience = patience
        self.min_delta = min_delta
        self.handshake_timeout = handshake_timeout
        self.train_timeout = train_timeout
        self.validate_timeout = validate_timeout
        self.final_validation = final_validation
        self.publish_global_model = publish_global_model
        self.resume = resume
        self.update_bound = update_bound
        self.judging_sites = list(judging_sites) if judging_sites is not None else None
        self.identity_batchnorm = identity_batchnorm
        self.max_classes_per_site = max_classes_per_site
        self.max_class_name_length = max_class_name_length
        self.preprocessing = preprocessing
        self.label_aliases = label_aliases  # the job's file is written from these attributes: None stays None
        self.accepted_classes = accepted_classes
        # how the server reads class names: the built-in vocabulary, the job's aliases, its accepted classes
        self.vocabulary = Vocabulary(
            [(label_aliases or {}, "the job's label_aliases")], accepted_classes, "the job's accepted_classes"
        )
        self.head_seed = head_seed
        self.head = NAMED_HEAD

        self._sites: dict[str, SiteInfo] = {}
        self._prior: dict[str, float] = {}
        self._federation: FederationState | None = None
        self._state_file: Path | None = None
        self._architecture = DEFAULT_ARCHITECTURE
        self._federation_preprocessing: dict[str, Any] = {}
        self._outputs: ModelOutputs | None = None
        self._reference = UpdateReference()
        self._outcomes: dict[str, dict[str, Any]] = {}  # site -> how its last result fared, told with its next task
        self._outstanding: set[str] = set()  # sites whose answer to the current task is awaited
        self._failed: dict[str, str] = {}  # site -> return code, for the current task's answers that were errors
        self._lock = threading.Lock()

    # --- the workflow -------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except (FederationCannotProceed, UserError) as reason:  # the job's own end, said once (FLARE adds a traceback)
            self.error(f"{JOB_FAILED}{reason}")
            self.panic(str(reason))

    def _run(self) -> None:
        self.info(center_message("Start surgical aggregation"))
        initial = self.load_model()
        self._architecture = str((initial.meta or {}).get(ARCHITECTURE_KEY, DEFAULT_ARCHITECTURE))
        self._sites = self._handshake(list((initial.meta or {}).get(META_CLASS_NAMES, [])))
        self._outputs = self._probe()
        if self.label_prior:
            self._prior = federation_label_prior({site: info.label_counts for site, info in self._sites.items()})
            self.info(f"federation label prior (FedSLD): { {k: round(v, 4) for k, v in self._prior.items()} }")
        federation = self._start(initial)
        latest = federation.latest
        for round_number in range(latest.round + 1, self.num_rounds):
            if self.abort_signal.triggered:
                return
            if federation.rounds_without_improvement >= self.patience:
                break
            self.info(center_message(f"Round {round_number} started", boarder_str="-"))
            self._set_round(round_number)
            self.event(AppEventType.ROUND_STARTED)
            started = time.perf_counter()
            gathered = self._train_round(round_number, latest)
            if gathered is None:  # aborted
                return
            self.event(AppEventType.BEFORE_AGGREGATION)
            aggregated = self._aggregate(gathered, latest)
            # the sites validated the model they received (the previous one); only accepted sites' checked metrics
            self._judge(
                latest, {site: gathered.metrics[site] for site in aggregated.accepted if site in gathered.metrics}
            )
            state, classes, trained = latest.state, latest.class_names, latest.trained
            if len(aggregated.accepted) >= self.min_clients:
                state, classes, trained = aggregated.state, aggregated.class_names, True
                federation.aggregated_rounds += 1
                self.info(f"round {round_number}: aggregated {aggregated.accepted}; union {len(classes)} classes")
            else:
                self.warning(
                    f"round {round_number}: only {len(aggregated.accepted)} valid contribution(s) "
                    f"({aggregated.accepted}), {self.min_clients} needed: keeping the last good global model"
                )
            latest = SavedVersion(round_number, state, classes, self._personal_models(state), trained)
            missing = sorted(set(self._sites) - gathered.answered())
            self._entry(round_number)["aggregation"] = gathered.record(
                aggregated.accepted, missing, time.perf_counter() - started
            )
            self._tell_outcomes(gathered, aggregated.accepted)
            federation.latest = latest
            federation.typical_updates = list(self._reference.rounds)
            self._make_global(latest, AppEventType.AFTER_AGGREGATION)
            self.save_model(self._as_flmodel(latest))
            self._save_personal(latest)
            self._checkpoint_round()
            if federation.rounds_without_improvement >= self.patience:
                self.info(f"early stop: {self.patience} validated rounds without improvement beyond {self.min_delta}")

        if latest.round > INITIAL_ROUND and federation.aggregated_rounds == 0:
            self._fail_without_progress(latest.round)
        if self.final_validation and latest.round > INITIAL_ROUND:
            self._judge(latest, self._validate(latest))
            self._evaluate_server_models(latest)
        self._refuse_unusable(federation.best or latest, "the best global model")
        if self.publish_global_model:
            self._publish_best()
        else:
            self.info("the global model is not published to the sites (publish_global_model is off)")
        federation.finished = True
        self._checkpoint_round()
        self.info(center_message("Finished surgical aggregation"))
        for line in summary_lines(federation.history, result_files(Path(self.get_app_dir()))):
            self.info(line)

    # --- the federation's state ------------------------------------------------------------------

    def _settings(self) -> dict[str, Any]:
        return {"method": self.method, "backbone_strategy": self.backbone_strategy, "weighting": self.weighting}

    def _start(self, initial: FLModel) -> FederationState:
        """A fresh federation from the initial model, or the unfinished one this job continues."""
        self._state_file = self._state_location()
        saved = load_state(self._state_file, self.resume)
        if saved is not None and not saved.finished:
            if saved.settings != self._settings():
                raise FederationCannotProceed(
                    f"the unfinished federation in {self._state_file} ran with {saved.settings}, this job asks for "
                    f'{self._settings()}; submit the job unchanged, or with resume "never" to start afresh'
                )
            self.info(
                f"resuming the federation saved by job {saved.job_id} after round {saved.latest.round} "
                f"({self._state_file}): union of {len(saved.latest.class_names)} classes, "
                f"{len(saved.history)} model(s) in the history"
            )
            federation = saved
        else:
            state = dict(initial.params)
            classes = self.vocabulary.canonical_list(initial.meta.get(META_CLASS_NAMES, []), "initial model")
            if classes:
                self.info(f"starting from an earlier global model with {len(classes)} classes")
            version = SavedVersion(INITIAL_ROUND, state, classes)
            federation = FederationState(self._settings(), version, None, math.inf, 0, [], [], {}, [])
        self._federation = federation
        self._reference = UpdateReference(list(federation.typical_updates))
        self._grow_union()
        self._refuse_unusable(federation.latest, "the global model this job starts from")
        try:
            check_batchnorm(self._recipe(None), federation.latest.state, "the global model this job starts from")
        except IdentityBatchNormError as error:
            raise FederationCannotProceed(str(error)) from None
        self._write_union_table()
        if federation.best is not None:  # the new job's folder gets the best model too
            self._make_global(federation.best, AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)
        self._checkpoint_round()
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
        rows = union_table({site: info.classes for site, info in self._sites.items()})
        path = write_union_table(rows, Path(self.get_app_dir()) / UNION_FILE)
        for line in union_table_lines(rows, limit=UNION_LOG_ROWS):
            self.info(line)
        self.info(f"the union table: {path}")

    def _grow_union(self) -> None:
        """Append rows, in name order, for the handshake's classes the global model does not have yet."""
        federation = self._federation
        latest = federation.latest
        new = sorted({name for info in self._sites.values() for name in info.classes} - set(latest.class_names))
        if not new:
            self.info(f"union head: {len(latest.class_names)} classes")
            return
        state, classes = extend_head(latest.state, latest.class_names, new, self.head, self.head_seed)
        federation.latest = SavedVersion(latest.round, state, classes, latest.personal)
        federation.fresh_classes = sorted({*federation.fresh_classes, *new})
        self.info(f"union head: {len(classes)} classes ({len(new)} new: their rows start from scratch)")

    def _state_location(self) -> Path:
        """``<server workspace>/surgical_aggregation/<job name>/federation.pt``: shared by the jobs of one name."""
        job_meta = self.fl_ctx.get_prop(FLContextKey.JOB_META) or {}
        workspace = self.fl_ctx.get_engine().get_workspace()
        return state_path(workspace.get_root_dir(), str(job_meta.get("name", "job")))

    def _checkpoint_round(self) -> None:
        self._federation.job_id = self.fl_ctx.get_job_id() or ""
        save_state(self._state_file, self._federation)
        self._write_history()

    # --- steps ------------------------------------------------------------------------------------

    def _handshake(self, initial_classes: list[str]) -> dict[str, SiteInfo]:
        """Ask every site for its class names; at least ``min_clients`` must pass the handshake's checks (a class
        must not look like one of ``initial_classes``, the model's, either)."""
        results = self.send_model_and_wait(
            task_name=TASK_DESCRIBE,
            data=FLModel(params={}, meta={META_WANT_LABEL_COUNTS: self.label_prior}),
            timeout=self.handshake_timeout,
        )
        rules = HandshakeRules(self.vocabulary, self.max_classes_per_site, self.max_class_name_length, self.label_prior)
        sites: dict[str, SiteInfo] = {}
        refused: dict[str, str] = {}
        for result in results:
            site = result.meta.get("client_name", "?")
            try:
                sites[site] = read_site(site, result.meta or {}, rules)
            except HandshakeRefused as refusal:
                self.error(f"handshake with {site} failed, leaving it out: {refusal}")
                refused[site] = str(refusal)
                continue
            info = sites[site]
            self.info(f"{site}: {len(info.classes)} classes, {info.num_samples} training samples ({info.data})")
        sites = dict(sorted(sites.items()))
        federation = self.preprocessing or (next(iter(sites.values())).preprocessing if sites else {})
        self._federation_preprocessing = dict(federation)
        others = {**refuse_look_alikes(sites, initial_classes), **refuse_other_preprocessing(sites, federation)}
        for site, reason in sorted(others.items()):
            self.error(f"handshake with {site} refused: {reason}")
            sites.pop(site, None)
        self._tell_refused({**refused, **others})
        if len(sites) < self.min_clients:
            raise FederationCannotProceed(
                f"only {len(sites)} site(s) answered the handshake ({sorted(sites)}); {self.min_clients} needed. "
                "See the sites' logs for their errors."
            )
        return sites

    def _tell_refused(self, refused: dict[str, str]) -> None:
        """Each site refused at the handshake is told why (its log says it, in one line), then sent nothing more."""
        if not refused:
            return

        def outcome(site: str, info: SiteInfo | None) -> FLModel:
            reason = {"task": TASK_DESCRIBE, "status": "refused", "reason": refused[site]}
            return FLModel(params={}, meta={META_OUTCOME: reason})

        self._to_each_site(TASK_REFUSED, outcome, self.handshake_timeout, lambda result: None, sorted(refused))

    def _recipe(self, info: SiteInfo | None) -> SiteRecipe:
        """The method's site-side settings for a site (None: those that are the same for every site)."""
        classes = info.classes if info is not None else []
        prior = {name: self._prior[name] for name in classes if name in self._prior} or None
        return SiteRecipe(self.method, self.backbone_strategy, self.proximal_mu, prior, self.identity_batchnorm)

    def _personal_models(self, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """PFL: each site's model = the global backbone with the entries that site keeps (head, FedBN's BN)."""
        return {site: {**state, **parts} for site, parts in self._federation.personal_parts.items()}

    def _keep_personal(self, site: str, result_state: dict[str, Any]) -> None:
        keys = set(self.head.keys) | strategy(self.backbone_strategy).kept_at_site(result_state)
        self._federation.personal_parts[site] = {key: to_numpy(result_state[key]) for key in keys}

    def _slice(self, version: SavedVersion, site: str, info: SiteInfo, **meta: Any) -> FLModel:
        """What a site may see of ``version``: the backbone and its own rows in its own spelling (PFL: its
        personal model; union-head comparators: the whole union)."""
        if site in version.personal:
            return FLModel(params=version.personal[site], meta={META_CLASS_NAMES: info.reported, **meta})
        head_classes = head_classes_for_site(self.method, info.classes, version.class_names)
        names = head_classes if head_classes != info.classes else info.reported
        params = slice_for_client(version.state, version.class_names, head_classes, self.head)
        return FLModel(params=params, meta={META_CLASS_NAMES: names, **meta})

    def _alive(self, site: str) -> bool:
        """False while FLARE deems the site disconnected (it may come back; then it is sent tasks again)."""
        return self.get_client_disconnect_time(site) is None

    def _to_each_site(
        self,
        task: str,
        data: Callable[[str, SiteInfo | None], FLModel],
        timeout: int,
        callback,
        sites: list[str] | None = None,
    ) -> bool:
        """One task per live site of the federation (or of ``sites``), each with its own data (and how the site's
        last result fared); False when aborted while waiting."""

        with self._lock:
            self._outstanding, self._failed = set(), {}
        for site in list(self._sites) if sites is None else sites:
            if not self._alive(site):
                self.warning(f"{site} is disconnected: no {task} task for it")
                continue
            model = data(site, self._sites.get(site))
            if site in self._outcomes:
                model.meta[META_OUTCOME] = self._outcomes.pop(site)
            with self._lock:
                self._outstanding.add(site)
            self.send_model(task_name=task, data=model, targets=[site], timeout=timeout, callback=callback)
        return self._wait()

    def _accept_train_result(
        self, client_name: str, result: Shareable, fl_ctx: FLContext, is_unknown_task: bool = False
    ) -> bool:
        """FLARE's first look at every answer (errors included): the site is no longer awaited; a failed task is
        remembered for the round's record and the site's outcome."""
        if not is_unknown_task:  # an unknown task is a late answer to an earlier one: dropped below
            with self._lock:
                self._outstanding.discard(client_name)
                code = result.get_return_code(ReturnCode.OK)
                if code != ReturnCode.OK:
                    self._failed[client_name] = str(code)
        return super()._accept_train_result(client_name, result, fl_ctx, is_unknown_task)

    def _train_round(self, round_number: int, latest: SavedVersion) -> Round | None:
        """Send each site its slice; check each result as it arrives (structure, declared rows, values, metrics).
        Returns what was gathered (None when aborted)."""
        checker = self._aggregator(latest)
        gathered = Round(round_number)
        federation = self._federation
        sent: dict[str, FLModel] = {}

        def accept(result: FLModel) -> None:
            site = result.meta.get("client_name", "?")
            info, meta = self._sites[site], result.meta or {}
            contribution = Contribution(
                client=site,
                state=result.params or {},
                class_names=meta.get(META_CLASS_NAMES) or [],
                num_samples=meta.get(META_NUM_SAMPLES, 0),
                expected_classes=head_classes_for_site(self.method, info.classes, latest.class_names),
                declared_samples=info.num_samples,
            )
            with self._lock:
                reason = gathered.receive(
                    contribution,
                    result.metrics or {},
                    [*info.classes, *info.reported],
                    sent[site].params,
                    sent[site].meta[META_CLASS_NAMES],
                    bool(sent[site].meta[META_WARMUP]),
                    checker,
                )
                if gathered.metric_problems.get(site):
                    problems = "; ".join(gathered.metric_problems[site])
                    self.error(f"round {round_number}: rejected metric(s) of {site}: {problems}")
            if reason is None:
                self.info(f"round {round_number}: received a valid contribution from {site}")
            else:
                self.error(f"round {round_number}: contribution from {site!r} rejected: {reason}")

        def train_data(site: str, info: SiteInfo) -> FLModel:
            # a site warms its head up once, when any of its classes starts from a fresh row
            warmup = site not in federation.warmed_up and bool(set(info.classes) & set(federation.fresh_classes))
            if site not in federation.warmed_up:
                federation.warmed_up.append(site)
            model = self._slice(latest, site, info, **{META_RECIPE: recipe_meta(self._recipe(info))})
            sent[site] = model
            model.meta[META_WARMUP] = warmup
            model.current_round, model.total_rounds = round_number, self.num_rounds
            return model

        if not self._to_each_site(TASK_TRAIN, train_data, self.train_timeout, accept):
            return None
        with self._lock:
            gathered.failed = dict(self._failed)
        for site, code in gathered.failed.items():
            self.error(f"round {round_number}: the training task of {site} failed ({code}); its log names the cause")
        missing = sorted(set(self._sites) - gathered.answered())
        if missing:
            self.warning(f"round {round_number}: no result from {missing} (late or disconnected)")
        return gathered

    def _aggregator(self, latest: SavedVersion) -> SurgicalAggregator:
        return SurgicalAggregator(
            latest.state,
            latest.class_names,
            self.backbone_strategy,
            self.weighting,
            self.head,
            normalize_name=self.vocabulary.canonical,
        )

    def _aggregate(self, gathered: Round, latest: SavedVersion):
        """The round's aggregation after its update bounds and the candidate model's check (see ``rounds``)."""
        rules = RoundRules(
            self.backbone_strategy,
            self.weighting,
            self.head,
            self.vocabulary.canonical,
            self.update_bound,
            self._outputs,
        )
        already = set(gathered.rejected)
        aggregated = gathered.aggregate(latest.state, latest.class_names, rules, self._reference)
        for site, reason in sorted(aggregated.rejected.items()):
            if site not in already:
                self.error(f"round {gathered.number}: contribution from {site!r} rejected: {reason}")
            for detail in gathered.rejection_details.get(site, []):
                self.info(f"round {gathered.number}: {site}'s update, against the typical one: {detail}")
        if gathered.model_check:
            self.error(
                f"round {gathered.number}: the candidate global model failed the model check "
                f"({'; '.join(gathered.model_check[:3])}); "
                + (
                    f"aggregated without {sorted(set(aggregated.rejected) - already)}"
                    if aggregated.accepted
                    else "the round's aggregation is discarded and the last good global model stays"
                )
            )
        if gathered.free_riders:
            self.warning(
                f"round {gathered.number}: free-rider(s) {gathered.free_riders}: their updates barely moved the model"
            )
        if self.method == "personal":
            for site in aggregated.accepted:
                self._keep_personal(site, gathered.arrivals[site].contribution.state)
        return aggregated

    def _tell_outcomes(self, gathered: Round, accepted: list[str]) -> None:
        """How each site's result fared, told to the site with its next task (its log and audit record it)."""
        for site in self._sites:
            if site in accepted:
                outcome = {"status": "aggregated"}
                if site in gathered.free_riders:
                    outcome["note"] = "its update barely moved the model (recorded as a free-rider)"
            elif site in gathered.rejected:
                outcome = {"status": "rejected", "reason": gathered.rejected[site]}
            elif site in gathered.failed:
                outcome = {"status": "failed", "reason": f"its training task failed ({gathered.failed[site]})"}
            else:
                outcome = {"status": "not_received", "reason": "no result arrived in time; a late result is dropped"}
            if gathered.metric_problems.get(site):
                outcome["rejected_metrics"] = gathered.metric_problems[site]
            self._outcomes[site] = {"task": TASK_TRAIN, "round": gathered.number, **outcome}

    def _validate(self, version: SavedVersion) -> dict[str, dict]:
        """Each site validates its slice of ``version``; returns site -> its checked metrics (a site whose
        validation loss is rejected is left out; the reasons go to the log and the round's history)."""
        metrics: dict[str, dict] = {}

        def collect(result: FLModel) -> None:
            site = result.meta.get("client_name", "?")
            info = self._sites[site]
            valid, problems = check_metrics(result.metrics or {}, [*info.classes, *info.reported])
            with self._lock:
                if problems:
                    self._entry(version.round).setdefault("rejected_validation_metrics", {})[site] = problems
                    self.error(f"rejected validation metric(s) of {site}: {'; '.join(problems)}")
                if "val_loss" in valid:
                    metrics[site] = valid

        self._to_each_site(
            TASK_VALIDATE,
            lambda site, info: self._slice(version, site, info, **{META_ROUND: version.round}),
            self.validate_timeout,
            collect,
        )
        return metrics

    def _judge(self, version: SavedVersion, site_metrics: dict[str, dict]) -> None:
        """Record the sites' validation of ``version``; best-model selection and early stopping on the judged
        validation loss (the mean of two judging sites', the median of three or more)."""
        judges = {
            site: metrics["val_loss"]
            for site, metrics in site_metrics.items()
            if self.judging_sites is None or site in self.judging_sites
        }
        judged, statistic = judged_loss(judges)
        mean_loss = _mean([metrics.get("val_loss") for metrics in site_metrics.values()])
        mean_auroc = _mean([metrics.get("val_mean_auroc") for metrics in site_metrics.values()])
        validation = {
            "sites": site_metrics,
            "mean_val_loss": mean_loss,
            "mean_val_auroc": mean_auroc,
            "judged_val_loss": judged,
            "judged_by": {"statistic": statistic, "sites": sorted(judges)},
        }
        self._entry(version.round)["validation"] = validation
        if math.isnan(judged):
            self.warning(f"global model {model_label(version.round)}: no validation loss of a judging site")
            return
        self.info(
            f"global model {model_label(version.round)}: {statistic} validation loss {judged:.4f} of {sorted(judges)}, "
            f"mean validation AUROC {mean_auroc:.4f} over {len(site_metrics)} site(s)"
        )
        if select(self._federation, version, judged, self.min_delta):
            validation["best"] = True
            self._make_global(version, AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)
            self._save_personal(version, best=True)
            self.info(f"new best global model: {model_label(version.round)}")

    def _evaluate_server_models(self, latest: SavedVersion) -> None:
        """The server's saved models (latest, best), each validated by every site on its own slice: FLARE's
        ``cross_val_results.json`` of the server's models, without sending any site another site's rows."""
        best = self._federation.best
        models = {DefaultCheckpointFileName.GLOBAL_MODEL: latest}
        if best is not None:
            models[DefaultCheckpointFileName.BEST_GLOBAL_MODEL] = best
        results: dict[int, dict[str, dict]] = {latest.round: self._entry(latest.round)["validation"]["sites"]}
        for name, version in models.items():
            if version.round not in results:
                results[version.round] = self._validate(version)
            for site, metrics in results[version.round].items():
                # not sticky: FLARE's cross-site evaluation of the sites' models sets the same properties afterwards
                self.fl_ctx.set_prop(AppConstants.MODEL_OWNER, SERVER_MODEL_PREFIX + name, private=True, sticky=False)
                self.fl_ctx.set_prop(AppConstants.DATA_CLIENT, site, private=True, sticky=False)
                result = DXO(data_kind=DataKind.METRICS, data=metrics).to_shareable()
                self.fl_ctx.set_prop(AppConstants.VALIDATION_RESULT, result, private=True, sticky=False)
                self.event(AppEventType.VALIDATION_RESULT_RECEIVED)

    def _publish_best(self) -> None:
        """Send every site the best global model (union head, class names, preprocessing): from here on the
        sites know the union's class names."""
        federation = self._federation
        version = federation.best or federation.latest
        meta = {**self._model_meta(version), META_ROUND: version.round}
        received: list[str] = []

        def collect(result: FLModel) -> None:
            received.append(result.meta.get("client_name", "?"))

        self.info(
            f"publishing the best global model ({model_label(version.round)}, {len(version.class_names)} classes) "
            "to every site: the sites learn the union's class names now"
        )
        self._to_each_site(
            TASK_PUBLISH, lambda site, info: FLModel(params=version.state, meta=meta), self.validate_timeout, collect
        )
        self.info(f"the global model was published to {sorted(received)}")

    def _fail_without_progress(self, last_round: int) -> None:
        """No round aggregated ``min_clients`` valid contributions: the job fails, naming the sites and why."""
        federation = self._federation
        federation.finished = True  # nothing to resume: a corrected job starts afresh
        self._checkpoint_round()
        reasons = {}
        for site in self._sites:
            outcome = self._outcomes.get(site, {"status": "not_received"})
            if outcome["status"] == "aggregated":
                reasons[site] = f"its result was valid, but no round had {self.min_clients} valid contributions"
            else:
                reasons[site] = outcome.get("reason", outcome["status"])
        for site, reason in reasons.items():
            self.error(f"{site}: {reason}")
        raise FederationCannotProceed(
            f"the federation made no progress: in {last_round + 1} round(s) none aggregated {self.min_clients} valid "
            f"contribution(s) (min_clients); no global model was trained or published. Per site: {reasons}"
        )

    # --- history and FLARE plumbing -----------------------------------------------------------------

    def _entry(self, round_number: int) -> dict[str, Any]:
        """The history's entry for the global model of ``round_number`` (created in round order)."""
        history = self._federation.history
        for entry in history:
            if entry["round"] == round_number:
                return entry
        entry = {"round": round_number, "model": model_label(round_number)}
        history.append(entry)
        history.sort(key=lambda item: item["round"])
        return entry

    def _wait(self) -> bool:
        """Until every task is answered or timed out, or every site still awaited is disconnected."""
        while self.get_num_standing_tasks():
            if self.abort_signal.triggered:
                self.info("abort signal received: stopping")
                return False
            with self._lock:
                awaited = set(self._outstanding)
            if awaited and not any(self._alive(site) for site in awaited):
                self.warning(f"{sorted(awaited)} disconnected: not waiting for their answers")
                self.cancel_all_tasks(fl_ctx=self.fl_ctx)
                break
            time.sleep(self._task_check_period)
        return True

    def _set_round(self, round_number: int) -> None:
        self.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, round_number, private=True, sticky=True)
        self.fl_ctx.set_prop(AppConstants.NUM_ROUNDS, self.num_rounds, private=True, sticky=True)

    def _model_meta(self, version: SavedVersion) -> dict[str, Any]:
        """Stored with the saved model: what it predicts, when it was made, how to feed it images."""
        return {
            META_CLASS_NAMES: version.class_names,
            "round": version.round,
            "trained": version.trained,  # False: no aggregation has happened yet (the initial weights)
            "method": self.method,
            META_PREPROCESSING: self._federation_preprocessing,
        }  # no per-site class lists: the file is published to the sites, which must not learn each other's

    def _save_personal(self, version: SavedVersion, best: bool = False) -> None:
        """PFL: ``personal_models/<site>.pt`` (latest) or ``best_<site>.pt``, each with the site's classes."""
        if not version.personal:
            return
        folder = Path(self.get_app_dir()) / PERSONAL_MODELS_DIR
        meta = {key: value for key, value in self._model_meta(version).items() if key != META_CLASS_NAMES}
        in_channels = int(meta[META_PREPROCESSING].get("in_channels", 1))
        for site, state in version.personal.items():
            name = f"best_{site}.pt" if best else f"{site}.pt"
            save_checkpoint(folder / name, state, self._sites[site].classes, in_channels, site=site, **meta)

    def _as_flmodel(self, version: SavedVersion) -> FLModel:
        return FLModel(params=version.state, current_round=version.round, meta=self._model_meta(version))

    def _make_global(self, version: SavedVersion, event: str) -> None:
        """Make ``version`` the context's global model and fire ``event`` (the persistor saves the best)."""
        learnable = make_model_learnable(version.state, self._model_meta(version))
        self.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, learnable, private=True, sticky=True)
        self.event(event)

    def _write_history(self) -> None:
        """The round history (JSON) and the training curves (PNG) next to the models."""
        history = self._federation.history
        app_dir = Path(self.get_app_dir())
        text = json.dumps(history, indent=2, default=float).encode()
        write_atomically(app_dir / HISTORY_FILE, lambda handle: handle.write(text), "round history")
        if any("validation" in entry for entry in history):
            try:
                plot_training_curves(history, app_dir / CURVES_FILE)
            except OSError as error:
                self.warning(f"could not draw {CURVES_FILE}: {error}")
