"""``BlindSurgicalAggregator``: the server workflow of blind surgical aggregation (``core.blind``), in which the
server adds ciphertexts and never holds a secret key, a plaintext head row, a site's backbone or a class name.

1. handshake: each site sends how many ciphertexts its update has, which of them it is sent back (the backbone part
   and its own class slots, by position: the positions are an HMAC of the class names under the sites' key, which the
   server does not hold), the consortium's public CKKS context and its preprocessing. No class name and no count of
   images. Every site must send the same public context (one consortium) and the same number of ciphertexts;
2. round 0 sends the initial model in the clear (random weights of a public seed, no head row: each site makes its
   own rows, seeded by name as the plain job does); later rounds send each site the summed ciphertexts it asked
   for. Each result is checked for what can be checked of ciphertexts: their names, number and that each parses
   under the consortium's context with at most one ciphertext's values; and its metrics, of which only the
   documented numbers without a class in their name are accepted. The valid results' ciphertexts are added;
3. the sites' validation of the model they received judges it (best model, early stopping, and the rules that stop
   the job when a site's own validation contradicts the federation: ``state.judge``), as in the plain job: the
   defences that run at the sites keep running. The server keeps the sums of the latest and the best round;
4. at the end every site validates the last model, and is sent its parts of the best one, which it decrypts and
   keeps as its published model. No union model is assembled: the server cannot decrypt one, and a site that did
   would read every other site's rows.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.fuel.utils.log_utils import center_message

from ..core.blind import PUBLIC_CONTEXT, BlindAggregationError, BlindCipher, params_as_parts, parts_as_params
from ..core.checks import METRIC_KEYS, check_metrics, preprocessing_problem
from ..core.errors import UserError
from ..core.head import numpy_state
from ..core.methods import SiteMethod, method_meta
from ..data.storage import write_atomically
from ..evaluation.run_summary import INITIAL_ROUND, model_label
from .protocol import (
    JOB_FAILED,
    META_BLIND,
    META_CLASS_NAMES,
    META_METHOD,
    META_OUTCOME,
    META_PREPROCESSING,
    META_ROUND,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_PUBLISH,
    TASK_REFUSED,
    TASK_TRAIN,
    TASK_VALIDATE,
)
from .results import write_history
from .state import FederationState, SavedVersion, averaged_sites, disagreement, history_entry, judge
from .tasks import SiteTasks

BLIND_MODEL_FILE = "blind_global_model.npz"  # the latest round's summed ciphertexts (the server cannot read them)
BLIND_BEST_MODEL_FILE = "best_blind_global_model.npz"
SEEN_FILE = "blind_server_saw.json"  # what the server received at the handshake and each round: counts and sizes
BLIND_WEIGHTINGS = ("uniform", "samples")
_VALUES = "the server sees ciphertexts only, so it cannot check or change what an update's numbers do; "
_AT_SITES = "the sites' own validation of each model guards instead (validation_guard)"
# what a blind job refuses (recipe, write-job), and why
BLIND_REFUSED = {
    "update_bound": _VALUES + _AT_SITES,
    "clip_updates": _VALUES + _AT_SITES,
    "reject_opposed_updates": _VALUES + _AT_SITES,
    "method": "blind mode runs surgical aggregation (the comparators send sites rows of classes they do not label)",
    "label_prior": "FedSLD sends the server each site's per-class counts, which name its classes",
    "proximal_mu": "FedProx is not offered in blind mode",
    "identity_batchnorm": "not offered in blind mode",
    "export_bundle": "a MONAI Bundle of the union model needs the union in clear, which no party assembles",
    "min_sites_per_published_class": "the server cannot tell which rows of the model it publishes are whose",
    "final_validation": "the sites always validate the last model in blind mode",
    "resume": "a blind federation starts afresh with each job (the server keeps no state to continue from)",
    "max_classes_per_site": "the server never sees a class",
    "max_class_name_length": "the server never sees a class name",
    "label_aliases": "they name classes, and a job passes through the server: each site keeps its aliases in its "
    "own config (data.label_aliases), in its local/ folder",
    "initial_model": "its head rows carry class names, which the server must not hold",
    "accepted_classes": "a closed vocabulary is checked by the server on class names, which it never sees",
    "site_to_site_evaluation": "it sends each site's model and class names to every other site",
    "update_privacy": "FLARE's privacy filters read an update's numbers, and a blind site sends ciphertexts",
}
BLIND_BACKBONES = ("fedavg", "fedbn_plus")


def refused_table() -> str:
    """The Markdown table of docs/blind.md: each setting a blind job refuses, and why."""
    lines = ["| setting | why blind mode refuses it |", "| --- | --- |"]
    lines += [f"| `{name}` | {reason} |" for name, reason in BLIND_REFUSED.items()]
    return "\n".join(lines)


class BlindFederationCannotProceed(RuntimeError):
    """Why a blind job stops (too few sites, no progress, a disagreement of the sites' validation)."""


class BlindSurgicalAggregator(SiteTasks):
    def __init__(
        self,
        num_rounds: int = 10,
        min_clients: int = 2,
        backbone_strategy: str = "fedavg",
        weighting: str = "uniform",
        patience: int = 25,
        min_delta: float = 1e-4,
        handshake_timeout: int = 600,
        train_timeout: int = 3600,
        validate_timeout: int = 1800,
        validation_guard: bool = True,
        judging_sites: list | None = None,
        publish_global_model: bool = True,
        preprocessing: dict | None = None,
        head_seed: int = 0,
        persistor_id: str = AppConstants.DEFAULT_PERSISTOR_ID,
    ) -> None:
        """The job config's ``args``; as the plain workflow's of the same names (:mod:`.settings`)."""
        super().__init__(persistor_id)
        if backbone_strategy not in BLIND_BACKBONES:
            raise ValueError(f"blind mode averages the backbone by {BLIND_BACKBONES}, not {backbone_strategy!r}")
        if weighting not in BLIND_WEIGHTINGS:
            raise ValueError(f"weighting must be one of {BLIND_WEIGHTINGS}, got {weighting!r}")
        if not (isinstance(num_rounds, int) and num_rounds >= 1 and isinstance(min_clients, int) and min_clients >= 1):
            raise ValueError(
                f"num_rounds and min_clients must be whole numbers of at least 1: {num_rounds}, {min_clients}"
            )
        self.num_rounds, self.min_clients = num_rounds, min_clients
        self.backbone_strategy, self.weighting = backbone_strategy, weighting
        self.patience, self.min_delta = patience, min_delta
        self.handshake_timeout, self.train_timeout, self.validate_timeout = (
            handshake_timeout,
            train_timeout,
            validate_timeout,
        )
        self.validation_guard, self.judging_sites = validation_guard, judging_sites
        self.publish_global_model, self.preprocessing, self.head_seed = publish_global_model, preprocessing, head_seed
        self._cipher: BlindCipher | None = None  # the consortium's public context: adds, cannot decrypt
        self._parts = 0  # ciphertexts in every site's update
        self._wanted: dict[str, list[int]] = {}  # site -> the parts it is sent back
        self._federation: FederationState | None = None
        self._sums: dict[int, dict[int, bytes]] = {}  # round -> summed ciphertexts (the latest and the best)
        self._files: dict[str, int] = {}  # the file of the latest or best sums -> the round it holds
        self._seen: dict[str, Any] = {"handshake": {}, "rounds": [], "received": []}

    # --- the workflow ---------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except (BlindFederationCannotProceed, UserError) as reason:
            self.error(f"{JOB_FAILED}{reason}")
            self.panic(str(reason))

    def _run(self) -> None:
        self.info(center_message("Start blind surgical aggregation"))
        initial = self.load_model()
        if (initial.meta or {}).get(META_CLASS_NAMES):
            raise BlindFederationCannotProceed(
                "the initial model has head rows with class names: a blind job starts from a model without any "
                "(the server must hold no row and no name)"
            )
        initial_state = numpy_state(initial.params)
        self._handshake()
        federation = FederationState(
            {"blind": True}, SavedVersion(INITIAL_ROUND, {}, []), None, math.inf, 0, [], [], {}, []
        )
        self._federation = federation
        latest = federation.latest
        for round_number in range(self.num_rounds):
            if self.abort_signal.triggered:
                self._write_records()
                return
            if federation.rounds_without_improvement >= self.patience:
                self.info(f"early stop: {self.patience} validated rounds without improvement beyond {self.min_delta}")
                break
            self.info(center_message(f"Round {round_number} started", boarder_str="-"))
            answers, metrics, rejected = self._train_round(round_number, latest, initial_state)
            accepted = sorted(answers)
            self._judge(
                latest,
                {site: values for site, values in metrics.items() if site in answers},
                objectors={site: values for site, values in metrics.items() if site not in answers},
            )
            history_entry(federation.history, round_number)["aggregation"] = {
                "trained_from": latest.round,  # the last good model, which a round that adds nothing keeps
                "accepted": accepted,
                "rejected": rejected,
                "failed": self.failed_answers(),
            }
            if len(accepted) >= self.min_clients:
                self._sums[round_number] = self._add(answers)
                federation.aggregated_rounds += 1
                self.info(f"round {round_number}: added the ciphertexts of {accepted}")
                latest = SavedVersion(round_number, {}, [], {}, True)
                federation.latest = latest
            else:  # the last good model stays the latest, under its own round (no new model to judge)
                self.warning(
                    f"round {round_number}: only {len(accepted)} valid contribution(s) ({accepted}), "
                    f"{self.min_clients} needed: keeping the last good global model"
                )
            self._keep_sums()
        if federation.aggregated_rounds == 0:
            raise BlindFederationCannotProceed("the federation made no progress: no round added enough valid results")
        self._judge(latest, *self._final_validation(latest))
        if federation.best is None:
            raise BlindFederationCannotProceed(
                "no trained global model was judged by the sites: nothing is published (see the sites' logs)"
            )
        if self.publish_global_model:
            self._publish(federation.best)
        self._keep_sums()
        self.info(center_message("Finished blind surgical aggregation"))

    # --- steps ------------------------------------------------------------------------------------

    def _handshake(self) -> None:
        """Every site's ciphertext count, the parts it asks for and the public context; no class name is asked for,
        and an answer that carries one is refused without being logged."""
        asked = {META_BLIND: {"weighting": self.weighting}, META_METHOD: self._method()}
        results = self.send_model_and_wait(
            task_name=TASK_DESCRIBE, data=FLModel(params={}, meta=asked), timeout=self.handshake_timeout
        )
        admitted, refused, contexts = {}, {}, {}
        for result in results:
            meta = result.meta or {}
            site = meta.get("client_name", "?")
            self._saw(TASK_DESCRIBE, site, result)
            problem, blind = self._handshake_problem(meta, result.params or {})
            if problem:
                refused[site] = problem
                continue
            admitted[site] = blind
            contexts[site] = hashlib.sha256(blind["context"]).hexdigest()
        if len(set(contexts.values())) > 1:  # one consortium: the sites that agree with the most others stay
            common = max(set(contexts.values()), key=list(contexts.values()).count)
            for site in [site for site, digest in contexts.items() if digest != common]:
                refused[site] = "its public context is not the consortium's (a site of another consortium's secret?)"
                admitted.pop(site)
        counts = {site: int(blind["parts"]) for site, blind in admitted.items()}
        if len(set(counts.values())) > 1:
            common = max(set(counts.values()), key=list(counts.values()).count)
            for site in [site for site, count in counts.items() if count != common]:
                refused[site] = f"its update has {counts[site]} ciphertexts, the others' {common}"
                admitted.pop(site)
        for site, reason in refused.items():
            self.error(f"handshake with {site} refused: {reason}")
        if refused:
            self.to_each_site(
                TASK_REFUSED,
                sorted(refused),
                lambda site: FLModel(params={}, meta={META_OUTCOME: {"status": "refused", "reason": refused[site]}}),
                self.handshake_timeout,
                lambda result: None,
            )
        if len(admitted) < self.min_clients:
            raise BlindFederationCannotProceed(
                f"only {len(admitted)} site(s) passed the blind handshake ({sorted(admitted)}); {self.min_clients} "
                "needed. See the sites' logs for their errors."
            )
        first = next(iter(admitted.values()))
        self._cipher = BlindCipher.from_bytes(first["context"])
        self._parts = int(first["parts"])
        self._wanted = {site: [int(part) for part in blind["wanted"]] for site, blind in admitted.items()}
        for site, wanted in self._wanted.items():
            self.info(f"{site}: an update of {self._parts} ciphertexts, {len(wanted)} of them sent back to it")
        self._seen["handshake"] = {
            "public_context_sha256": contexts[next(iter(admitted))],
            "ciphertexts_per_update": self._parts,
            "parts_sent_back": {site: len(wanted) for site, wanted in self._wanted.items()},
        }

    def _handshake_problem(self, meta: dict[str, Any], params: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        blind = meta.get(META_BLIND)
        if META_CLASS_NAMES in meta:
            return "it sent class names: in blind mode a site sends none (is its blind_secret set?)", {}
        context = np.asarray(params.get(PUBLIC_CONTEXT, []))
        if not isinstance(blind, dict) or not {"parts", "wanted"} <= set(blind) or context.dtype != np.uint8:
            return "it did not answer in blind mode (its site config needs blind_secret)", {}
        blind = {**blind, "context": context.tobytes()}
        parts, wanted = blind["parts"], blind["wanted"]
        if not isinstance(parts, int) or parts < 1:
            return f"its ciphertext count {parts!r} is not a whole number of at least 1", {}
        if not isinstance(wanted, list) or not all(isinstance(part, int) and 0 <= part < parts for part in wanted):
            return f"the parts it asks for are not part numbers below {parts}", {}
        try:
            context = BlindCipher.from_bytes(blind["context"])
        except Exception as error:  # TenSEAL's parse errors are plain exceptions of several kinds
            return f"its public context cannot be read ({type(error).__name__})", {}
        if context.holds_secret_key:
            return "it sent a context with the secret key: the server must never hold it (nothing of it is kept)", {}
        if self.preprocessing and (
            problem := preprocessing_problem(meta.get(META_PREPROCESSING) or {}, self.preprocessing, "the job's")
        ):
            return problem, {}
        return None, blind

    def _method(self) -> dict[str, Any]:
        """The method's site-side settings: surgical aggregation with the job's backbone strategy."""
        return method_meta(SiteMethod("surgical", self.backbone_strategy, 0.0, None, False))

    def _task(self, version: SavedVersion, site: str, initial_state: dict[str, Any] | None, **meta: Any) -> FLModel:
        """What ``site`` is sent of ``version``: the initial model in the clear, or the sums of its parts."""
        settings = {"weighting": self.weighting, "head_seed": self.head_seed, "initial": initial_state is not None}
        meta = {META_BLIND: settings, META_METHOD: self._method(), META_ROUND: version.round, **meta}
        if initial_state is not None:
            return FLModel(params=initial_state, meta=meta)
        sums = self._sums[version.round]
        return FLModel(params=parts_as_params({part: sums[part] for part in self._wanted[site]}), meta=meta)

    def _train_round(
        self, round_number: int, latest: SavedVersion, initial_state: dict[str, Any]
    ) -> tuple[dict[str, dict[int, bytes]], dict[str, dict[str, float]], dict[str, str]]:
        answers: dict[str, dict[int, bytes]] = {}
        metrics: dict[str, dict[str, float]] = {}
        rejected: dict[str, str] = {}
        seen: dict[str, Any] = {"round": round_number, "sites": {}}

        def accept(result: FLModel) -> None:
            site = (result.meta or {}).get("client_name", "?")
            self._saw(TASK_TRAIN, site, result, round_number)
            if site in answers or site in rejected:
                rejected[site] = "this client already contributed in this round"
                answers.pop(site, None)
                return
            checked, problems = classless_check(result.metrics or {})
            if problems:
                self.error(f"round {round_number}: rejected metric(s) of {site}: {'; '.join(problems)}")
            metrics[site] = checked
            if not result.params:  # e.g. a DP-SGD site whose budget is spent: nothing to add, nothing wrong
                self.warning(f"round {round_number}: {site} sent no update")
                return
            try:
                parts = params_as_parts(result.params, site)
            except BlindAggregationError as error:
                rejected[site] = str(error)
            else:
                seen["sites"][site] = {"ciphertexts": len(parts), "bytes": sum(len(data) for data in parts.values())}
                if problem := self._parts_problem(parts):
                    rejected[site] = problem
                else:
                    answers[site] = parts
            if site in rejected:
                self.error(f"round {round_number}: contribution from {site!r} rejected: {rejected[site]}")
            else:
                self.info(f"round {round_number}: received {len(parts)} ciphertexts from {site}")

        def train_data(site: str) -> FLModel:
            initial = None if self._sums.get(latest.round) else initial_state  # no round has added anything yet
            model = self._task(latest, site, initial, **{META_WARMUP: initial is not None})
            model.current_round, model.total_rounds = round_number, self.num_rounds
            return model

        self.to_each_site(TASK_TRAIN, list(self._wanted), train_data, self.train_timeout, accept)
        for site, code in self.failed_answers().items():
            self.error(f"round {round_number}: the training task of {site} failed ({code}); its log names the cause")
        self._seen["rounds"].append(seen)
        return answers, metrics, rejected

    def _parts_problem(self, parts: dict[int, bytes]) -> str | None:
        """What the server can check of an update it cannot read."""
        if sorted(parts) != list(range(self._parts)):
            return f"it sent {len(parts)} ciphertexts, not the {self._parts} of every update"
        for part, data in parts.items():
            if problem := self._cipher.ciphertext_problem(data):
                return f"ciphertext {part}: {problem}"
        return None

    def _add(self, answers: dict[str, dict[int, bytes]]) -> dict[int, bytes]:
        sites = sorted(answers)
        summed = self._cipher.add([[answers[site][part] for part in range(self._parts)] for site in sites])
        return dict(enumerate(summed))

    def _judge(
        self, version: SavedVersion, site_metrics: dict[str, dict], objectors: dict[str, dict] | None = None
    ) -> None:
        judges = [site for site in (self.judging_sites or site_metrics) if site in site_metrics]
        verdict = judge(
            self._federation, version, site_metrics, judges, self.min_delta, self.validation_guard, objectors
        )
        label = model_label(version.round)
        if math.isnan(verdict.judged_loss):
            return
        self.info(f"global model {label}: {verdict.statistic} validation loss {verdict.judged_loss:.4f} of {judges}")
        for site, reason in {**verdict.regressed, **verdict.harmed}.items():
            self.warning(f"global model {label} is worse for {site}: {reason}")
        if verdict.disagreement:
            self._write_records()
            raise BlindFederationCannotProceed(disagreement(version, verdict))
        if verdict.best:
            self.info(f"new best global model: {label}")

    def _final_validation(self, latest: SavedVersion) -> tuple[dict[str, dict], dict[str, dict]]:
        """Every site validates the last model: the sites whose result made it judge, the others may object."""
        validated: dict[str, dict] = {}

        def collect(result: FLModel) -> None:
            site = (result.meta or {}).get("client_name", "?")
            self._saw(TASK_VALIDATE, site, result, latest.round)
            checked, problems = classless_check(result.metrics or {})
            if problems:
                self.error(f"final validation: rejected metric(s) of {site}: {'; '.join(problems)}")
            validated[site] = checked

        self.to_each_site(
            TASK_VALIDATE,
            list(self._wanted),
            lambda site: self._task(latest, site, None),
            self.validate_timeout,
            collect,
        )
        made = set(averaged_sites(self._federation.history, latest.round))
        judges = {site: values for site, values in validated.items() if site in made}
        return judges, {site: values for site, values in validated.items() if site not in made}

    def _publish(self, best: SavedVersion) -> None:
        self.info(f"publishing {model_label(best.round)}: each site is sent its own parts of it, which it decrypts")
        self.to_each_site(
            TASK_PUBLISH,
            list(self._wanted),
            lambda site: self._task(best, site, None),
            self.validate_timeout,
            lambda result: self._saw(TASK_PUBLISH, (result.meta or {}).get("client_name", "?"), result, best.round),
        )

    def _saw(self, task: str, site: str, result: FLModel, round_number: int | None = None) -> None:
        """Everything a site's answer brought the server, as ``SEEN_FILE`` keeps it (:func:`_kept`: what is not one
        of the protocol's keys or documented metrics is counted, never written), each param's dtype and dimensions
        counted (ciphertexts are bytes), the public context's size and SHA-256."""
        params: dict[str, Any] = {}
        for name, value in (result.params or {}).items():
            array = np.asarray(value)
            if name == PUBLIC_CONTEXT:
                params[PUBLIC_CONTEXT] = {"bytes": array.size, "sha256": hashlib.sha256(array.tobytes()).hexdigest()}
                continue
            kind = f"{array.dtype}[{array.ndim}-d]"
            params[kind] = params.get(kind, 0) + 1
        self._seen["received"].append(
            {
                "task": task,
                "site": site,
                "round": round_number,
                **_kept(result.meta or {}, result.metrics or {}),
                "param_names": sorted({str(name).split("/")[0] for name in result.params or {}}),
                "params": params,
            }
        )

    def _keep_sums(self) -> None:
        """The latest and the best round's sums (ciphertexts only) and the records, in the server's app folder."""
        federation = self._federation
        keep = {federation.latest.round, federation.best.round if federation.best else federation.latest.round}
        self._sums = {round_number: sums for round_number, sums in self._sums.items() if round_number in keep}
        app = Path(self.get_app_dir())
        for version, name in ((federation.latest, BLIND_MODEL_FILE), (federation.best, BLIND_BEST_MODEL_FILE)):
            # a file is written again only when it is to hold another round (each is a site's upload in size)
            if version is not None and self._sums.get(version.round) and self._files.get(name) != version.round:
                arrays = parts_as_params(self._sums[version.round])
                write_atomically(app / name, lambda handle, arrays=arrays: np.savez(handle, **arrays), "blind model")
                self._files[name] = version.round
        self._write_records()

    def _write_records(self) -> None:
        app = Path(self.get_app_dir())
        if problem := write_history(self._federation.history, app):
            self.warning(problem)
        text = json.dumps(self._seen, indent=2).encode()
        write_atomically(app / SEEN_FILE, lambda handle: handle.write(text), "what the server saw")


def classless_check(metrics: Any) -> tuple[dict[str, float], list[str]]:
    """``check_metrics`` of the documented metrics without a class (``METRIC_KEYS``); any other is refused and not
    named (its name may be a class's, which would then be in the server's log)."""
    if not isinstance(metrics, dict):
        return check_metrics(metrics)
    other = [name for name in metrics if name not in METRIC_KEYS]
    checked, problems = check_metrics({name: value for name, value in metrics.items() if name not in other})
    if other:
        problems.append(f"{len(other)} metric(s) other than the documented ones refused (not named here)")
    return checked, problems


# the meta keys of a blind answer the server's record keeps with their values (FLARE adds the rest of them)
KEPT_META = (META_BLIND, META_PREPROCESSING, META_ROUND, META_WARMUP, META_METHOD, "client_name", "job_id", "site_name")


def _kept(meta: dict[str, Any], metrics: dict[str, Any]) -> dict[str, Any]:
    """What the record keeps of an answer's meta and metrics: the protocol's meta keys with their values, the
    documented metric names (also those FLARE echoes in the meta's ``initial_metrics``); any other key only counted,
    as it may be a class's name (a site of the wrong mode, a hostile one)."""
    names = [name for source in (metrics, meta.get("initial_metrics") or {}) for name in source]
    return {
        "meta": {key: _summary(value) for key, value in meta.items() if key in KEPT_META},
        "other_meta_keys": sum(1 for key in meta if key not in KEPT_META and key != "initial_metrics"),
        "metric_names": sorted({name for name in names if name in METRIC_KEYS}),
        "other_metric_names": len({str(name) for name in names if name not in METRIC_KEYS}),
    }


def _summary(value: Any) -> Any:
    """A meta value as the server's record keeps it (anything but JSON's own types as its repr)."""
    if isinstance(value, dict):
        return {str(key): _summary(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_summary(item) for item in value]
    if isinstance(value, (str, int, float, bool, type(None))):
        return value
    return repr(value)
