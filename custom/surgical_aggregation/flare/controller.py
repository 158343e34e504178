"""``SurgicalAggregatorShareable``: the FLARE 2.9 server workflow of surgical aggregation.

A thin layer over :mod:`surgical_aggregation.aggregation`:

1. handshake: every site reports its class names (no site learns the others'); the union head
   is built from them, each class's first row identical at every site;
2. each round every site receives the backbone plus only its own head rows, in its own order;
   contributions are validated and aggregated one by one as they arrive (an invalid one is
   rejected with a logged reason, the others still aggregate);
3. the latest global model is saved every round; the best one is chosen by the mean of the
   sites' validation BCE loss of the global model (mean validation AUROC is logged too), with
   early stopping (patience, min delta);
4. a site that fails or drops out costs at most the round's timeout; with fewer than
   ``min_clients`` valid contributions the last good global model is kept.

The comparators of the papers run through this same workflow with ``method`` (see
:mod:`surgical_aggregation.methods`): ``vanilla`` and ``partial_loss`` send every site the whole
union head, ``personal`` (PFL) lets each site keep its head and saves one personal model per
site under ``personal_models/``; ``label_prior`` adds FedSLD's handshake and ``proximal_mu`` FedProx.
"""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.abstract.model import make_model_learnable
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType
from nvflare.app_common.workflows.model_controller import ModelController
from nvflare.fuel.utils.log_utils import center_message

from ..checkpoint import save_checkpoint
from ..core.aggregation import BACKBONE_STRATEGIES, WEIGHTINGS, Contribution, ContributionRejected, SurgicalAggregator
from ..core.head import NAMED_HEAD, batchnorm_keys, extend_head, slice_for_client, to_numpy
from ..core.labels import canonical_name, canonical_names, union_labels
from ..core.methods import (
    LabelCounts,
    SiteRecipe,
    check_method,
    federation_label_prior,
    head_classes_for_site,
    recipe_meta,
)
from ..plots import plot_training_curves
from .protocol import (
    META_CLASS_NAMES,
    META_DATA,
    META_LABEL_COUNTS,
    META_NUM_SAMPLES,
    META_PREPROCESSING,
    META_RECIPE,
    META_WANT_LABEL_COUNTS,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_TRAIN,
    TASK_VALIDATE,
)

HISTORY_FILE = "round_history.json"
CURVES_FILE = "training_curves.png"
PERSONAL_MODELS_DIR = "personal_models"  # PFL: <site>.pt (latest) and best_<site>.pt


@dataclass
class SiteInfo:
    classes: list[str]  # canonical names
    reported: list[str]  # the site's own spelling and order, echoed back to it
    num_samples: int
    data: str
    preprocessing: dict[str, Any]
    label_counts: dict[str, LabelCounts] = field(default_factory=dict)  # FedSLD only


@dataclass
class GlobalVersion:
    """A global model and the round that produced it (kept until the sites have validated it)."""

    round: int
    state: dict[str, Any]
    class_names: list[str]
    personal: dict[str, dict[str, Any]] = field(default_factory=dict)  # PFL: site -> its full model state


def _mean(values: list[float]) -> float:
    values = [v for v in values if v is not None and not math.isnan(v)]
    return float(np.mean(values)) if values else math.nan


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
            weighting: "uniform" (the papers' unweighted mean) or "samples" (by training images).
            label_prior: FedSLD: sites share per-class training counts once, and re-weight their loss
                by the federation's label prior the server computes from them.
            proximal_mu: FedProx's proximal term weight (0 = off).
            patience: stop after this many validated rounds without improvement of the mean
                validation loss by more than ``min_delta``.
            handshake_timeout / train_timeout / validate_timeout: seconds a site may take per task
                (0 waits forever; a dropped site then hangs the run).
            final_validation: validate the last global model after the last round, so it can be the best.
            head_seed: seed of the initial head rows (one generator per class name).
        """
        super().__init__(persistor_id=persistor_id, ignore_result_error=True)
        if backbone_strategy not in BACKBONE_STRATEGIES:
            raise ValueError(f"backbone_strategy must be one of {BACKBONE_STRATEGIES}, got {backbone_strategy!r}")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
        check_method(method, backbone_strategy)
        if not proximal_mu >= 0:
            raise ValueError(f"proximal_mu must not be negative, got {proximal_mu!r}")
        for name, value in (("num_rounds", num_rounds), ("min_clients", min_clients)):
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
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
        self.head_seed = head_seed
        self.head = NAMED_HEAD

        self._sites: dict[str, SiteInfo] = {}
        self._prior: dict[str, float] = {}
        self._personal_parts: dict[str, dict[str, Any]] = {}  # PFL: site -> entries it keeps
        self._warmed_up: set[str] = set()
        self._history: list[dict[str, Any]] = []
        self._best_loss = math.inf
        self._best_round: int | None = None
        self._rounds_without_improvement = 0

    # --- the workflow -------------------------------------------------------------------------

    def run(self) -> None:
        self.info(center_message("Start surgical aggregation"))
        initial = self.load_model()
        state = dict(initial.params)
        classes = canonical_names(initial.meta.get(META_CLASS_NAMES, []), "initial model")
        self._sites = self._handshake()
        if self.label_prior:
            self._prior = federation_label_prior({site: info.label_counts for site, info in self._sites.items()})
            self.info(f"federation label prior (FedSLD): { {k: round(v, 4) for k, v in self._prior.items()} }")
        ordered = [self._sites[site].classes for site in sorted(self._sites)]
        state, classes = extend_head(state, classes, union_labels(*ordered), self.head, self.head_seed)
        self.info(f"union head: {len(classes)} classes {classes}")

        latest: GlobalVersion | None = None
        for round_number in range(self.num_rounds):
            if self.abort_signal.triggered:
                return
            self.info(center_message(f"Round {round_number} started", boarder_str="-"))
            self._set_round(round_number)
            self.event(AppEventType.ROUND_STARTED)
            started = time.perf_counter()
            record: dict[str, Any] = {"round": round_number}
            aggregator = self._train_round(round_number, state, classes, record)
            if aggregator is None:  # aborted
                return
            if latest is not None:  # the sites validated the model they received: the previous global
                self._consider(latest, record["sites"], record)
            self.event(AppEventType.BEFORE_AGGREGATION)
            aggregated = aggregator.finalize()
            record.update(
                accepted=aggregated.accepted, rejected=aggregated.rejected, new_classes=aggregated.new_classes
            )
            if len(aggregated.accepted) >= self.min_clients:
                state, classes = aggregated.state, aggregated.class_names
                self.info(f"round {round_number}: aggregated {aggregated.accepted}; union {len(classes)} classes")
            else:
                self.warning(
                    f"round {round_number}: only {len(aggregated.accepted)} valid contribution(s) "
                    f"({aggregated.accepted}), {self.min_clients} needed: keeping the last good global model"
                )
            latest = GlobalVersion(round_number, state, classes, self._personal_models(state))
            self._publish(latest, AppEventType.AFTER_AGGREGATION)
            self.save_model(self._as_flmodel(latest))
            self._save_personal(latest)
            record["seconds"] = round(time.perf_counter() - started, 2)
            self._record(record)
            if self._rounds_without_improvement >= self.patience:
                self.info(f"early stop: {self.patience} validated rounds without improvement beyond {self.min_delta}")
                break

        if self.final_validation and latest is not None:
            record = {"round": latest.round, "final_validation": True}
            metrics = self._validate(latest)
            self._consider(latest, metrics, record)
            self._record(record)
        self.info(
            f"best global model: round {self._best_round} (mean validation loss {self._best_loss:.4f}); "
            f"files in {self.get_app_dir()}"
        )
        self.info(center_message("Finished surgical aggregation"))

    # --- steps ------------------------------------------------------------------------------------

    def _handshake(self) -> dict[str, SiteInfo]:
        """Ask every site for its class names; at least ``min_clients`` must answer validly."""
        results = self.send_model_and_wait(
            task_name=TASK_DESCRIBE,
            data=FLModel(params={}, meta={META_WANT_LABEL_COUNTS: self.label_prior}),
            timeout=self.handshake_timeout,
        )
        sites: dict[str, SiteInfo] = {}
        for result in results:
            site = result.meta.get("client_name", "?")
            try:
                reported = [str(name) for name in result.meta.get(META_CLASS_NAMES) or []]
                classes = canonical_names(reported, f"site {site}'s class names")
                if not classes:
                    raise ValueError(f"site {site} reported no class names")
                samples = int(result.meta.get(META_NUM_SAMPLES, 0))
                counts = self._label_counts(site, reported, result.meta.get(META_LABEL_COUNTS))
            except (ValueError, TypeError) as error:
                self.error(f"handshake with {site} failed, leaving it out: {error}")
                continue
            preprocessing = dict(result.meta.get(META_PREPROCESSING) or {})
            sites[site] = SiteInfo(
                classes, reported, samples, str(result.meta.get(META_DATA, "")), preprocessing, counts
            )
            self.info(f"{site}: {len(classes)} classes, {samples} training images ({sites[site].data})")
        settings = {json.dumps(info.preprocessing, sort_keys=True) for info in sites.values()}
        if len(settings) > 1:
            self.warning(f"sites preprocess images differently: {[(s, i.preprocessing) for s, i in sites.items()]}")
        if len(sites) < self.min_clients:
            raise RuntimeError(
                f"only {len(sites)} site(s) answered the handshake ({sorted(sites)}); {self.min_clients} needed. "
                "See the sites' logs for their errors."
            )
        return sites

    def _label_counts(self, site: str, reported: list[str], counts: Any) -> dict[str, LabelCounts]:
        """FedSLD: the site's per-class training counts, by canonical name (empty when not asked for)."""
        if not self.label_prior:
            return {}
        if not isinstance(counts, dict) or set(counts) != set(reported):
            raise ValueError(f"site {site} sent no per-class counts for its classes {reported} (FedSLD needs them)")
        return {canonical_name(name): LabelCounts(int(value[0]), int(value[1])) for name, value in counts.items()}

    def _recipe(self, info: SiteInfo) -> SiteRecipe:
        prior = {name: self._prior[name] for name in info.classes if name in self._prior} or None
        return SiteRecipe(self.method, self.backbone_strategy, self.proximal_mu, prior)

    def _personal_models(self, state: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """PFL: each site's model = the global backbone with the entries that site keeps (head, FedBN's BN)."""
        return {site: {**state, **parts} for site, parts in self._personal_parts.items()}

    def _keep_personal(self, site: str, result_state: dict[str, Any]) -> None:
        keys = set(self.head.keys)
        if self.backbone_strategy == "fedbn":
            keys |= batchnorm_keys(result_state)
        self._personal_parts[site] = {key: to_numpy(result_state[key]) for key in keys}

    def _train_round(
        self, round_number: int, state: dict, classes: list[str], record: dict
    ) -> SurgicalAggregator | None:
        """Send each site its slice; aggregate the results as they arrive."""
        aggregator = SurgicalAggregator(
            state, classes, self.backbone_strategy, self.weighting, self.head, normalize_name=canonical_name
        )
        lock = threading.Lock()
        site_metrics: dict[str, dict] = {}
        record["sites"] = site_metrics

        def accept(result: FLModel) -> bool:
            site = result.meta.get("client_name", "?")
            meta = result.meta or {}
            contribution = Contribution(
                client=site,
                state=result.params or {},
                class_names=meta.get(META_CLASS_NAMES) or [],
                num_samples=meta.get(META_NUM_SAMPLES, 0),
            )
            with lock:
                site_metrics[site] = dict(result.metrics or {})
                try:
                    aggregator.add(contribution)
                except ContributionRejected as rejection:
                    self.error(f"round {round_number}: {rejection}")
                    return False
                if self.method == "personal":
                    self._keep_personal(site, contribution.state)
            self.info(f"round {round_number}: accepted the contribution of {site}")
            return True

        for site, info in self._sites.items():
            warmup = site not in self._warmed_up
            self._warmed_up.add(site)
            head_classes = head_classes_for_site(self.method, info.classes, classes)
            self.send_model(
                task_name=TASK_TRAIN,
                data=FLModel(
                    params=slice_for_client(state, classes, head_classes, self.head),
                    current_round=round_number,
                    total_rounds=self.num_rounds,
                    meta={
                        # the site's own spelling for its own classes; the union's names for union heads
                        META_CLASS_NAMES: head_classes if head_classes != info.classes else info.reported,
                        META_RECIPE: recipe_meta(self._recipe(info)),
                        META_WARMUP: warmup,
                    },
                ),
                targets=[site],
                timeout=self.train_timeout,
                callback=accept,
            )
        if not self._wait():
            return None
        missing = sorted(set(self._sites) - set(site_metrics))
        if missing:
            self.warning(f"round {round_number}: no result from {missing} (failed or timed out); continuing without")
        return aggregator

    def _validate(self, version: GlobalVersion) -> dict[str, dict]:
        """Each site validates its slice of ``version`` (PFL: its personal model); returns site -> metrics."""
        if not version.personal:
            results = self.send_model_and_wait(
                task_name=TASK_VALIDATE,
                data=FLModel(params=version.state, meta={META_CLASS_NAMES: version.class_names}),
                timeout=self.validate_timeout,
            )
            return {result.meta.get("client_name", "?"): dict(result.metrics or {}) for result in results}
        metrics: dict[str, dict] = {}

        def collect(result: FLModel) -> None:
            metrics[result.meta.get("client_name", "?")] = dict(result.metrics or {})

        for site, state in version.personal.items():
            self.send_model(
                task_name=TASK_VALIDATE,
                data=FLModel(params=state, meta={META_CLASS_NAMES: self._sites[site].classes}),
                targets=[site],
                timeout=self.validate_timeout,
                callback=collect,
            )
        self._wait()
        return metrics

    def _consider(self, version: GlobalVersion, site_metrics: dict[str, dict], record: dict) -> None:
        """Best-model selection and early stopping on the mean of the sites' validation losses."""
        losses = [metrics.get("val_loss") for metrics in site_metrics.values()]
        aurocs = [metrics.get("val_mean_auroc") for metrics in site_metrics.values()]
        mean_loss, mean_auroc = _mean(losses), _mean(aurocs)
        record.update(validated_round=version.round, mean_val_loss=mean_loss, mean_val_auroc=mean_auroc)
        record.setdefault("sites", site_metrics)
        if math.isnan(mean_loss):
            self.warning(f"global model of round {version.round}: no validation loss reported")
            return
        self.info(
            f"global model of round {version.round}: mean validation loss {mean_loss:.4f}, "
            f"mean validation AUROC {mean_auroc:.4f} over {len(site_metrics)} site(s)"
        )
        if mean_loss < self._best_loss - self.min_delta:
            self._best_loss, self._best_round = mean_loss, version.round
            self._rounds_without_improvement = 0
            record["best"] = True
            self._publish(version, AppEventType.GLOBAL_BEST_MODEL_AVAILABLE)
            self._save_personal(version, best=True)
            self.info(f"new best global model: round {version.round}")
        else:
            self._rounds_without_improvement += 1

    # --- FLARE plumbing ------------------------------------------------------------------------------

    def _wait(self) -> bool:
        while self.get_num_standing_tasks():
            if self.abort_signal.triggered:
                self.info("abort signal received: stopping")
                return False
            time.sleep(self._task_check_period)
        return True

    def _set_round(self, round_number: int) -> None:
        self.fl_ctx.set_prop(AppConstants.CURRENT_ROUND, round_number, private=True, sticky=True)
        self.fl_ctx.set_prop(AppConstants.NUM_ROUNDS, self.num_rounds, private=True, sticky=True)

    def _model_meta(self, version: GlobalVersion) -> dict[str, Any]:
        """Stored with the saved model: what it predicts, when it was made, how to feed it images."""
        first_site = self._sites[sorted(self._sites)[0]]
        return {
            META_CLASS_NAMES: version.class_names,
            "round": version.round,
            "method": self.method,
            META_PREPROCESSING: first_site.preprocessing,
        }  # no per-site class lists: the file may be shared with sites, which must not learn each other's

    def _save_personal(self, version: GlobalVersion, best: bool = False) -> None:
        """PFL: ``personal_models/<site>.pt`` (latest) or ``best_<site>.pt``, each with the site's classes."""
        if not version.personal:
            return
        folder = Path(self.get_app_dir()) / PERSONAL_MODELS_DIR
        meta = {key: value for key, value in self._model_meta(version).items() if key != META_CLASS_NAMES}
        in_channels = int(meta[META_PREPROCESSING].get("in_channels", 1))
        for site, state in version.personal.items():
            name = f"best_{site}.pt" if best else f"{site}.pt"
            save_checkpoint(folder / name, state, self._sites[site].classes, in_channels, site=site, **meta)

    def _as_flmodel(self, version: GlobalVersion) -> FLModel:
        return FLModel(params=version.state, current_round=version.round, meta=self._model_meta(version))

    def _publish(self, version: GlobalVersion, event: str) -> None:
        """Make ``version`` the context's global model and fire ``event`` (the persistor saves the best)."""
        learnable = make_model_learnable(version.state, self._model_meta(version))
        self.fl_ctx.set_prop(AppConstants.GLOBAL_MODEL, learnable, private=True, sticky=True)
        self.event(event)

    def _record(self, record: dict) -> None:
        """Append to the round history (JSON) and redraw the training curves (PNG) next to the models."""
        self._history.append(record)
        app_dir = Path(self.get_app_dir())
        (app_dir / HISTORY_FILE).write_text(json.dumps(self._history, indent=2, default=float))
        try:
            plot_training_curves(self._history, app_dir / CURVES_FILE)
        except (ValueError, OSError) as error:
            self.warning(f"could not draw {CURVES_FILE}: {error}")
