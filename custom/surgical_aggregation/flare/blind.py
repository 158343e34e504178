"""``BlindSurgicalAggregator``: the server workflow of blind surgical aggregation (``core.blind``), in which the
server adds ciphertexts and never holds a secret key, a plaintext head row, a site's backbone or a class name.

1. handshake: each site sends how many ciphertexts its update has, which of them it is sent back (the backbone part
   and its own class slots, by position: the positions are an HMAC of the class names under the sites' key, which the
   server does not hold), the consortium's fingerprint, a fresh CKKS key pair for this job (the public context, and
   the secret context wrapped under the consortium's key) and its preprocessing. No class name and no count of
   images. Every site must send the same fingerprint (one consortium) and the same number of ciphertexts; the first
   site's key (by name) becomes the job's, relayed wrapped to every site with each task (``core.blind.JobKey``);
2. round 0 sends the initial model in the clear (random weights of a public seed, no head row: each site makes its
   own rows, seeded by name as the plain job does); later rounds send each site the summed ciphertexts it asked
   for. Each result is checked for what can be checked of ciphertexts: their names, number and that each parses
   under the consortium's context with at most one ciphertext's values; and its metrics, of which only the
   documented numbers without a class in their name are accepted. The valid results' ciphertexts are added;
3. the round loop both workflows share (:mod:`.loop`): every site validates the round's summed candidate (it decrypts
   its parts), the candidate is screened for harm to a site, and a contribution it harms with is left out (the sums
   made again without it: ciphertexts add and subtract without a key), then judged (best model, early stopping):
   the defences that run at the sites keep running. The server keeps the sums of the latest and the best round;
4. at the end every site is sent its parts of the best model, which it decrypts and keeps as its published model.
   No union model is assembled: the server cannot decrypt one, and a site that did would read every other site's
   rows.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.fuel.utils.log_utils import center_message

from ..core.blind import (
    PUBLIC_CONTEXT,
    BlindAggregationError,
    BlindCipher,
    params_as_parts,
    parts_as_params,
    split_job_key,
)
from ..core.checks.handshake import preprocessing_problem
from ..core.checks.metrics import METRIC_KEYS, check_metrics
from ..core.head import numpy_state
from ..core.methods import SiteMethod, method_meta
from ..data.storage import write_atomically
from ..evaluation.run_summary import INITIAL_ROUND, model_label
from .loop import FederationCannotProceed, FederationLoop, RoundResults
from .protocol import (
    META_BLIND,
    META_CLASS_NAMES,
    META_METHOD,
    META_MODEL_KEY,
    META_OUTCOME,
    META_PREPROCESSING,
    META_ROUND,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_PUBLISH,
    TASK_REFUSED,
    TASK_TRAIN,
)
from .results import write_history
from .settings import checked_arguments
from .state import FederationState, SavedVersion

BLIND_MODEL_FILE = "blind_global_model.npz"  # the latest round's summed ciphertexts (the server cannot read them)
BLIND_BEST_MODEL_FILE = "best_blind_global_model.npz"
SEEN_FILE = "blind_server_saw.json"  # what the server received at the handshake and each round: counts and sizes
BLIND_WEIGHTINGS = ("uniform", "samples")
_VALUES = "the server sees ciphertexts only, so it cannot check or change what an update's numbers do; "
_AT_SITES = (
    "the sites' own validation of each model guards instead (validation_guard: a contribution most other sites are "
    "better off without is left out, the sums made again without it)"
)
# what a blind job refuses (recipe, write-job), and why
BLIND_REFUSED = {
    "update_bound": _VALUES + _AT_SITES,
    "clip_updates": _VALUES + _AT_SITES,
    "reject_opposed_updates": _VALUES + _AT_SITES,
    "robust_aggregation": "ciphertexts add; no rule of their values (a median, a geometric median) can be taken "
    "without reading them: blind mode sums, and " + _AT_SITES,
    "byzantine_sites": "it sets the robust rule, which blind mode cannot take",
    "update_noise": "its scale is the median norm of the sites' updates, which the server cannot read in blind mode",
    "robust_learning_rate": "it votes on the sign of each site's update, value by value, which blind mode cannot read",
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


class BlindSurgicalAggregator(FederationLoop):
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
        """The job config's ``args``; as the plain workflow's of the same names, checked by the same rules
        (:mod:`.settings`)."""
        arguments = {name: value for name, value in locals().items() if name in _ARGUMENTS}
        super().__init__(persistor_id)
        if backbone_strategy not in BLIND_BACKBONES:
            raise ValueError(f"blind mode averages the backbone by {BLIND_BACKBONES}, not {backbone_strategy!r}")
        if weighting not in BLIND_WEIGHTINGS:
            raise ValueError(f"weighting must be one of {BLIND_WEIGHTINGS}, got {weighting!r}")
        vars(self).update(checked_arguments(arguments))
        self._cipher: BlindCipher | None = None  # the job's public context: adds, cannot decrypt
        self._job_key: dict[str, np.ndarray] = {}  # the job's key, wrapped: relayed to every site with each task
        self._parts = 0  # ciphertexts in every site's update
        self._wanted: dict[str, list[int]] = {}  # site -> the parts it is sent back
        self._federation: FederationState | None = None
        self._initial_state: dict[str, Any] = {}  # the initial model, sent in the clear in round 0
        self._answers: dict[str, dict[int, bytes]] = {}  # the round's valid updates: site -> its ciphertexts
        self._files: dict[str, int] = {}  # the file of the latest or best sums -> the round it holds
        self._seen: dict[str, Any] = {"handshake": {}, "rounds": [], "received": []}

    # --- the loop's hooks (flare.loop); a version's ``state`` is its summed ciphertexts, part -> bytes ----------

    def _open(self) -> FederationState:
        self.info(center_message("Start blind surgical aggregation"))
        initial = self.load_model()
        if (initial.meta or {}).get(META_CLASS_NAMES):
            raise FederationCannotProceed(
                "the initial model has head rows with class names: a blind job starts from a model without any "
                "(the server must hold no row and no name)"
            )
        self._initial_state = numpy_state(initial.params)
        self._handshake()
        self._federation = FederationState(
            {"blind": True}, SavedVersion(INITIAL_ROUND, {}, []), None, math.inf, 0, [], [], {}, []
        )
        return self._federation

    def _site_names(self) -> list[str]:
        return list(self._wanted)

    def _train(self, round_number: int, latest: SavedVersion) -> RoundResults | None:
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
            initial = None if latest.state else self._initial_state  # no round has added anything yet
            model = self._task(
                latest, site, initial, **{META_WARMUP: initial is not None, META_MODEL_KEY: self._model_key(latest)}
            )
            model.current_round, model.total_rounds = round_number, self.num_rounds
            return model

        if not self.to_each_site(TASK_TRAIN, list(self._wanted), train_data, self.train_timeout, accept):
            return None
        failed = self.failed_answers()
        for site, code in failed.items():
            self.error(f"round {round_number}: the training task of {site} failed ({code}); its log names the cause")
        self._seen["rounds"].append(seen)
        self._answers = answers
        accepted = sorted(answers)
        outcomes = {}
        for site in self._wanted:
            if site in answers:
                outcomes[site] = {"task": TASK_TRAIN, "round": round_number, "status": "aggregated"}
            elif site in rejected:
                outcomes[site] = {
                    "task": TASK_TRAIN,
                    "round": round_number,
                    "status": "rejected",
                    "reason": rejected[site],
                }
        return RoundResults(
            accepted=accepted,
            contributors=accepted,
            record={"accepted": accepted, "rejected": rejected, "failed": failed},
            outcomes=outcomes,
            received_validation={site: values for site, values in metrics.items() if site in answers},
            trained=sorted(set(answers) | set(rejected)),
        )

    def _candidate(self, round_number: int, leave_out: frozenset[str] = frozenset()) -> SavedVersion | None:
        kept = {site: parts for site, parts in self._answers.items() if site not in leave_out}
        if not kept:
            return None
        return SavedVersion(round_number, self._add(kept), [], {}, True)

    def _model_for(self, version: SavedVersion, site: str) -> FLModel:
        return self._task(version, site, None)

    def _received(self, task: str, site: str, result: FLModel, round_number: int | None) -> None:
        self._saw(task, site, result, round_number)

    def _check_validation(self, site: str, metrics: Mapping[str, Any]) -> tuple[dict[str, float], list[str]]:
        return classless_check(metrics)

    def _tolerated(self, contributors: int) -> int:
        return (contributors - 1) // 2

    def _adopt(self, latest: SavedVersion) -> None:
        self._keep_sums()

    def _checkpoint(self) -> None:
        self._write_records()

    def _finish(self, latest: SavedVersion) -> None:
        if self.publish_global_model:
            self._publish(self._federation.best)
        self._keep_sums()
        self.info(center_message("Finished blind surgical aggregation"))

    # --- steps ------------------------------------------------------------------------------------
    def _handshake(self) -> None:
        """Every site's ciphertext count, the parts it asks for and the public context; no class name is asked for,
        and an answer that carries one is refused without being logged."""
        asked = {META_BLIND: {"weighting": self.weighting}, META_METHOD: self._method()}
        results = self.ask_every_site(TASK_DESCRIBE, FLModel(params={}, meta=asked), self.handshake_timeout)
        admitted, refused, consortia = {}, {}, {}
        for result in results:
            meta = result.meta or {}
            site = meta.get("client_name", "?")
            self._saw(TASK_DESCRIBE, site, result)
            problem, blind = self._handshake_problem(meta, result.params or {})
            if problem:
                refused[site] = problem
                continue
            admitted[site] = blind
            consortia[site] = blind["consortium"]
        if len(set(consortia.values())) > 1:  # one consortium: the sites that agree with the most others stay
            common = max(set(consortia.values()), key=list(consortia.values()).count)
            for site in [site for site, fingerprint in consortia.items() if fingerprint != common]:
                refused[site] = "its secret is not the consortium's (a site of another consortium's secret?)"
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
            raise FederationCannotProceed(
                f"only {len(admitted)} site(s) passed the blind handshake ({sorted(admitted)}); {self.min_clients} "
                "needed. See the sites' logs for their errors."
            )
        maker = min(admitted)  # whose fresh key the job uses: any site's would do, this one by name
        first = admitted[maker]
        self._cipher = BlindCipher.from_bytes(first["context"])
        self._job_key = {name: np.frombuffer(value, dtype=np.uint8) for name, value in first["job_key"].items()}
        self._parts = int(first["parts"])
        self._wanted = {site: [int(part) for part in blind["wanted"]] for site, blind in admitted.items()}
        for site, wanted in self._wanted.items():
            self.info(f"{site}: an update of {self._parts} ciphertexts, {len(wanted)} of them sent back to it")
        public_digest = hashlib.sha256(first["context"]).hexdigest()
        self.info(f"this job's key: {maker}'s, public context {public_digest[:16]}")
        self._seen["handshake"] = {
            "public_context_sha256": public_digest,
            "job_key_made_by": maker,
            "ciphertexts_per_update": self._parts,
            "parts_sent_back": {site: len(wanted) for site, wanted in self._wanted.items()},
        }

    def _handshake_problem(self, meta: dict[str, Any], params: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        blind = meta.get(META_BLIND)
        if META_CLASS_NAMES in meta:
            return "it sent class names: in blind mode a site sends none (is its blind_secret set?)", {}
        context = np.asarray(params.get(PUBLIC_CONTEXT, []))
        job_key, _ = split_job_key(params)
        if (
            not isinstance(blind, dict)
            or not {"parts", "wanted", "consortium"} <= set(blind)
            or context.dtype != np.uint8
            or job_key is None
        ):
            return "it did not answer in blind mode (its site config needs blind_secret)", {}
        blind = {**blind, "context": context.tobytes(), "job_key": job_key}
        parts, wanted = blind["parts"], blind["wanted"]
        if not isinstance(blind["consortium"], str) or len(blind["consortium"]) != 64:
            return "its consortium fingerprint is not a SHA-256 MAC in hex", {}
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
            return FLModel(params={**initial_state, **self._job_key}, meta=meta)
        sums = version.state
        parts = parts_as_params({part: sums[part] for part in self._wanted[site]})
        return FLModel(params={**parts, **self._job_key}, meta=meta)

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
        app = Path(self.get_app_dir())
        for version, name in ((federation.latest, BLIND_MODEL_FILE), (federation.best, BLIND_BEST_MODEL_FILE)):
            # a file is written again only when it is to hold another round (each is a site's upload in size)
            if version is not None and version.state and self._files.get(name) != version.round:
                arrays = parts_as_params(version.state)
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


_ARGUMENTS = frozenset(inspect.signature(BlindSurgicalAggregator.__init__).parameters) - {"self", "persistor_id"}
