"""A site's FLARE Client API script.

Runs in the FLARE client process through the job's two-line ``custom/client.py`` (in-process,
the default), or as ``python3 -u -m surgical_aggregation.flare.client`` (external process).

Finds the site's config (``config.find_site_config``) and answers the server's tasks:

* ``describe``: the site's class names (in its own order) and training-set size;
* ``train``: load the received slice (backbone + this site's rows, matched by name), validate it
  (the global model's validation), warm up the head on the first round, train the local epochs,
  validate the local model, send weights, metrics, sample count and class names;
* ``validate``: evaluate a model on this site's validation split, over the classes both have, picked
  by name (the server's models arrive as this site's slice; with site-to-site evaluation, another
  site's model arrives whole);
* ``submit_model``: send the local model with its class names (site-to-site evaluation only);
* ``publish``: keep the published global model (union head, class names) in the job's folder;
* ``refused``: the server left this site out at the handshake: log why, in one line.

Training curves go to TensorBoard (or MLflow) through FLARE; every task received and every result
sent is recorded in the site's ``audit/exchanges.jsonl`` (``flare.audit``).
"""

from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import nvflare.client as flare
import torch
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.client.tracking import SummaryWriter

from ..core.devices import resolve_device
from ..core.errors import SiteConfigError, UserError
from ..core.head import numpy_state
from ..core.labels import read_alias_file
from ..core.methods import method_from_meta
from ..data.storage import write_atomically
from ..training.checkpoint import ARCHITECTURE_KEY, PREPROCESSING_KEY, save_checkpoint
from ..training.config import JOB_DEFAULT_ORIGIN, SITE_CONFIGS_DIR, SiteConfig, find_site_config, load_site_config
from ..training.loops import Evaluation
from ..training.parallel import check_gpus
from ..training.privacy import released_validation
from ..training.privacy_ledger import LEDGER_FILE, SPENT_FILE
from ..training.site_data import SiteData, prepare_site_data, resolve_table, split_table
from ..training.trainer import SiteTrainer, Tracker, evaluation_metrics
from .audit import SiteAudit
from .blind_site import BLIND_TASKS, BlindSite, classless_metrics
from .handshake import site_handshake
from .protocol import (
    JOB_ALIASES_FILE,
    META_BLIND,
    META_CLASS_NAMES,
    META_COMPARE_TO,
    META_DATA,
    META_METHOD,
    META_MODEL_KEY,
    META_NUM_SAMPLES,
    META_OUTCOME,
    META_PREPROCESSING,
    META_PRIVACY,
    META_ROUND,
    META_VALIDATION_SIZE,
    META_WANT_LABEL_COUNTS,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_PUBLISH,
    TASK_REFUSED,
    TASK_SUBMIT_MODEL,
    TASK_TRAIN,
    TASK_VALIDATE,
)

LOCAL_MODEL_FILE = "local_model.pt"
FORWARDED_TO_VALIDATION = (META_ROUND, META_MODEL_KEY, META_COMPARE_TO)  # of a blind validate task's meta
PUBLISHED_MODEL_FILE = "published_global_model.pt"  # the global model the server published at the end
# the site's validations a later task compares with (per image: they never leave the site), kept on disk because a
# site's process may be restarted between tasks (``nvflare simulator`` with fewer threads than sites)
ROUND_MEMORY_FILE = "round_memory.pt"
# metric sent to the server -> the curve it is tracked as, per round
ROUND_CURVES = {
    "val_loss": "global_model/val_loss",
    "val_mean_auroc": "global_model/val_mean_auroc",
    "local_val_loss": "local_model/val_loss",
    "local_val_mean_auroc": "local_model/val_mean_auroc",
    "train_loss": "train/loss",
}


def job_app_dir(site: str, job_id: str, cwd: Path | None = None) -> Path:
    """This job's app folder at the site: the working directory of an external trainer process,
    ``<site workspace>/<job id>/app_<site>`` seen from an in-process one (cwd = site workspace)."""
    cwd = cwd or Path.cwd()
    return cwd if cwd.name == f"app_{site}" else cwd / job_id / f"app_{site}"


@dataclass(frozen=True)
class TrainedRound:
    """A site's validation of the round it last trained in (with the per-image figures ``Evaluation`` keeps): of the
    model the round started from, and of the model it trained itself. They stay at the site; the server is sent
    paired differences of later models against them (:meth:`ClientSession.compared`)."""

    round: int
    start: Evaluation
    own: Evaluation


# an evaluation's arrays: per image, and per BatchNorm layer (a restart that lost them would leave the site's paired
# figures unjudged: the BatchNorm rule fails open without its own model's readings)
_ARRAYS = ("image_losses", "scores", "labels", "mask", "batchnorm_divergences")


def _evaluation_payload(evaluation: Evaluation) -> dict[str, Any]:
    """An evaluation as plain values and tensors (``torch.load(..., weights_only=True)`` reads it back)."""
    payload = {
        name: getattr(evaluation, name) for name in ("loss", "per_class_auroc", "mean_auroc", "samples", "loss_se")
    }
    for name in _ARRAYS:
        value = getattr(evaluation, name)
        payload[name] = None if value is None else torch.from_numpy(np.asarray(value))
    return payload


def _evaluation_from(payload: dict[str, Any]) -> Evaluation:
    """The evaluation :func:`_evaluation_payload` wrote (one written before an array was kept reads it as None)."""
    values = {name: (None if payload.get(name) is None else payload[name].numpy()) for name in _ARRAYS}
    plain = {name: value for name, value in payload.items() if name not in _ARRAYS}
    return Evaluation(**plain, **values)


def paired_figures(
    evaluation: Evaluation, reference: Evaluation, name: str, auroc: bool = True, recalibrated: bool = False
) -> dict[str, float]:
    """``val_loss_minus_<name>`` (and ``val_auroc_minus_<name>``; with ``recalibrated``, the harm test's
    ``val_recalibrated_loss_minus_<name>``), with standard errors, and ``val_batchnorm_minus_<name>``: ``evaluation``
    against ``reference``, paired over the site's validation images; what cannot be compared is left out."""
    figures = evaluation.compared_with(reference, recalibrated)
    metrics = {
        f"val_loss_minus_{name}": figures["loss"],
        f"val_loss_minus_{name}_se": figures["loss_se"],
    }
    if recalibrated:
        metrics |= {
            f"val_recalibrated_loss_minus_{name}": figures["recalibrated_loss"],
            f"val_recalibrated_loss_minus_{name}_se": figures["recalibrated_loss_se"],
        }
    if auroc:
        metrics |= {f"val_auroc_minus_{name}": figures["auroc"], f"val_auroc_minus_{name}_se": figures["auroc_se"]}
    pairs = [(key, f"{key}_se") for key in metrics if not key.endswith("_se")]
    kept = {key: metrics[key] for pair in pairs if all(math.isfinite(metrics[key]) for key in pair) for key in pair}
    if math.isfinite(figures["batchnorm"]):  # a reading of the model's statistics, not a noisy mean: no error
        kept[f"val_batchnorm_minus_{name}"] = figures["batchnorm"]
    return kept


class ClientSession:
    """One site's state across the tasks of a job."""

    def __init__(
        self,
        site: str,
        config: SiteConfig,
        app_dir: Path,
        log: logging.Logger,
        tracker: Tracker | None = None,
        job: str = "",
    ) -> None:
        self.site = site
        self.config = config
        self.log = log
        self.tracker = tracker
        check_gpus(config.gpus, resolve_device(config.device), config.device, f"site {site}")  # at start, not first fit
        self.table = resolve_table(config, log)
        self.audit = SiteAudit(app_dir, config.record_exchanges)
        self.app_dir = app_dir
        self.local_model_path = app_dir / LOCAL_MODEL_FILE
        self._trainer: SiteTrainer | None = None
        self.trained: TrainedRound | None = None
        self.candidates: dict[str, Evaluation] = {}  # the round's candidates it validated, with per-image figures
        self.candidates_round: object = None
        self.memory_file = app_dir / ROUND_MEMORY_FILE
        if self.memory_file.is_file():  # this job's own file, written by this site's earlier process
            memory = torch.load(self.memory_file, weights_only=True)
            trained = memory["trained"]
            self.trained = None if trained is None else TrainedRound(
                trained["round"], _evaluation_from(trained["start"]), _evaluation_from(trained["own"])
            )  # fmt: skip
            self.candidates = {key: _evaluation_from(value) for key, value in memory["candidates"].items()}
            self.candidates_round = memory["candidates_round"]
        # blind mode (flare.blind_site): only with the consortium's secret; such a site takes part in blind jobs only
        self.blind = BlindSite.from_file(config.blind_secret, site, app_dir, log, job) if config.blind_secret else None

    def remember(self) -> None:
        """Keep the validations later tasks compare with (:attr:`trained`, :attr:`candidates`) on disk."""
        trained = self.trained
        memory = {
            "trained": None
            if trained is None
            else {
                "round": trained.round,
                "start": _evaluation_payload(trained.start),
                "own": _evaluation_payload(trained.own),
            },
            "candidates": {key: _evaluation_payload(value) for key, value in self.candidates.items()},
            "candidates_round": self.candidates_round,
        }
        write_atomically(self.memory_file, lambda handle: torch.save(memory, handle), "round memory")

    def __enter__(self) -> ClientSession:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._trainer is not None:
            self._trainer.close()  # the helpers of a site training on several GPUs leave with the job

    @property
    def class_names(self) -> list[str]:
        return list(self.table.classes)

    @property
    def trainer(self) -> SiteTrainer:
        """Built on first use: this is where the image cache is made (or reused)."""
        if self._trainer is None:
            data: SiteData = prepare_site_data(self.config, self.log, table=self.table)
            self.log.info("%s data ready: %s", self.site, data.summary())
            self._trainer = SiteTrainer(self.config, data, self.site, self.log, self.tracker)
            if self.config.differential_privacy.enabled:
                self._keep_ledger_at_site(self._trainer)
            if self._trainer.restore(self.local_model_path):
                self.log.info("%s: resumed the local model from %s", self.site, self.local_model_path)
        return self._trainer

    def _keep_ledger_at_site(self, trainer: SiteTrainer) -> None:
        """DP-SGD's ledger in the site workspace's local/ folder, read by every job of this site; each job's app
        folder records the steps it took there, which the site's later jobs check the ledger against."""
        workspace = self.app_dir.parents[1]
        ledger = workspace / "local" / LEDGER_FILE
        # every app folder's record, not only this site name's: a site renamed after losing its ledger is still refused
        earlier = [path for path in workspace.glob(f"*/app_*/{SPENT_FILE}") if path.parent != self.app_dir]
        trainer.keep_ledger_in(ledger, self.app_dir / SPENT_FILE, sorted(earlier))
        self.log.info("%s: DP-SGD ledger %s (%d steps on this data so far)", self.site, ledger, trainer.ledger.steps)

    def handle(self, task: str, received: FLModel) -> FLModel:
        """Answer one task; the task as received and the answer as sent are both recorded in the audit."""
        meta = received.meta or {}
        if meta.get(META_OUTCOME) and task != TASK_REFUSED:
            self.record_outcome(meta[META_OUTCOME])
        round_number = received.current_round if task == TASK_TRAIN else meta.get(META_ROUND)
        names = meta.get(META_CLASS_NAMES) or []
        # the published model is kept whole in its own file: no second copy among the exchanges; ciphertexts (blind
        # mode) are not kept: their decryption is ("decrypted")
        blind = bool(meta.get(META_BLIND))  # the server's mode
        keep = task != TASK_PUBLISH and not blind
        self.audit.record(task, round_number, "received", names, received.params, keep_tensors=keep)
        if task != TASK_REFUSED and blind != (self.blind is not None):
            answer = self.not_blind_alike(task, blind)
        elif self.blind is not None and task != TASK_REFUSED:  # a blind site answers the blind tasks, nothing else
            answer = self.handle_blind(task, received)
        elif task == TASK_DESCRIBE:
            answer = self.describe(bool(meta.get(META_WANT_LABEL_COUNTS)))
        elif task == TASK_TRAIN:
            answer = self.train(received)
        elif task == TASK_VALIDATE:
            answer = self.validate(received)
        elif task == TASK_SUBMIT_MODEL:
            state = numpy_state(self.trainer.state_dict())
            answer = FLModel(params=state, meta={META_CLASS_NAMES: self.trainer.head_classes})
        elif task == TASK_PUBLISH:
            answer = self.keep_published(received)
        elif task == TASK_REFUSED:
            answer = self.refused(meta.get(META_OUTCOME) or {})
        else:
            raise ValueError(f"{self.site}: unknown task {task!r}")
        sent = (answer.meta or {}).get(META_CLASS_NAMES) or []
        privacy = (answer.meta or {}).get(META_PRIVACY)
        self.audit.record(
            task, round_number, "sent", sent, answer.params, answer.metrics, privacy=privacy, keep_tensors=not blind
        )
        return answer

    def not_blind_alike(self, task: str, server_blind: bool) -> FLModel:
        """A blind server and a site without the consortium's secret, or a site with one and a plain server: the
        site sends nothing of its classes (its log says why) and takes no part."""
        if server_blind:
            self.log.error(
                "%s: this job runs in blind mode and this site's config has no blind_secret (the consortium's "
                "secret file): it sends nothing; ask the consortium for the secret and set blind_secret",
                self.site,
            )
        else:
            self.log.error(
                "%s: this site's config has blind_secret, so it takes part in blind jobs only, and this job's server "
                "asks for class names and models in clear (task %s): it sends nothing; remove blind_secret to take "
                "part in plain jobs",
                self.site,
                task,
            )
        return FLModel(params={}, meta={})

    def handle_blind(self, task: str, received: FLModel) -> FLModel:
        """A blind task: decrypt what the server sent into the model the plain task would have received, answer it
        as the plain task does, and encrypt the result (``flare.blind_site``)."""
        if task not in BLIND_TASKS:  # e.g. a site-to-site evaluation's submit_model: its model in clear, never
            self.log.error("%s: blind mode answers %s only; task %r gets nothing", self.site, BLIND_TASKS, task)
            return FLModel(params={}, meta={})
        settings = (received.meta or {}).get(META_BLIND)
        settings = settings if isinstance(settings, dict) else {}
        classes = list(self.class_names)
        method = method_from_meta(received.meta.get(META_METHOD) or {})
        preprocessing = self.config.modality.preprocessing(self.config)
        # made once, from the model's shapes alone: the handshake prepares no data (as the plain one)
        layout = self.blind.layout(
            lambda: self.config.modality.build_model(classes, preprocessing).state_dict(), method.backbone_strategy
        )
        if task == TASK_DESCRIBE:
            self.log.info("%s: blind mode, %d classes, none named to the server", self.site, len(classes))
            blind, params = self.blind.describe(layout, classes)
            return FLModel(params=params, meta={META_BLIND: blind, META_PREPROCESSING: preprocessing})
        round_number = received.current_round if task == TASK_TRAIN else (received.meta or {}).get(META_ROUND)
        if task == TASK_TRAIN:
            params = self.blind.received(received.params or {}, settings, classes)
            self.audit.record(task, round_number, "decrypted", classes, params)
            answer = self.train(FLModel(params=params, meta={**received.meta, META_CLASS_NAMES: classes},
                                        current_round=received.current_round))  # fmt: skip
            sent = (answer.meta or {}).get(META_CLASS_NAMES) or []
            parts = {}
            if answer.params:  # (a DP-SGD site whose budget is spent sends nothing)
                privacy = (answer.meta or {}).get(META_PRIVACY)
                self.audit.record(task, round_number, "encrypted", sent, answer.params, answer.metrics, privacy=privacy)
                samples = int((answer.meta or {}).get(META_NUM_SAMPLES, 0))
                parts = self.blind.encrypted(answer.params, sent, samples, str(settings.get("weighting", "uniform")))
            # no privacy report (its steps would tell the server the training-set size): the site's ledger keeps it
            return FLModel(params=parts, metrics=classless_metrics(answer.metrics or {}), meta={})
        params = self.blind.decrypted(received.params or {}, classes)
        if task == TASK_VALIDATE:
            self.audit.record(task, round_number, "decrypted", classes, params)
            forwarded = {key: meta for key, meta in (received.meta or {}).items() if key in FORWARDED_TO_VALIDATION}
            answer = self.validate(FLModel(params=params, meta={**forwarded, META_CLASS_NAMES: classes}))
            return FLModel(metrics=classless_metrics(answer.metrics or {}))
        meta = {key: value for key, value in (received.meta or {}).items() if key != META_BLIND}
        return self.keep_published(FLModel(params=params, meta={**meta, META_CLASS_NAMES: classes}))

    def record_outcome(self, outcome: dict) -> None:
        """What the server did with this site's last training result: logged, and recorded in the audit (a result
        the server never aggregated is not left standing as merely "sent")."""
        task, round_number, status = outcome.get("task"), outcome.get("round"), outcome.get("status")
        note = "; ".join(str(part) for part in (outcome.get("reason"), outcome.get("rejected_metrics")) if part)
        if status == "aggregated":
            self.audit.record(task, round_number, "aggregated", note=note)
            if note:
                self.log.warning(
                    "%s round %s: aggregated, but the server dropped metrics: %s", self.site, round_number, note
                )
            return
        self.audit.record(task, round_number, "not_aggregated", note=f"{status}: {note}")
        self.log.warning(
            "%s round %s: the server did NOT aggregate this site's result (%s): %s",
            self.site,
            round_number,
            status,
            note,
        )

    def describe(self, with_label_counts: bool = False) -> FLModel:
        """Class names and sizes; per-class training counts only when asked (FedSLD shares them by design), never by
        a DP-SGD site (exact counts of its training split, outside any privacy budget)."""
        if with_label_counts and self.config.differential_privacy.enabled:
            raise SiteConfigError(
                f"{self.site}: differential_privacy is on, and the job's method (FedSLD) asks for exact per-class "
                "counts of the training split, which DP-SGD cannot cover: this site does not send them; run it in a "
                "job without label_prior"
            )
        meta = site_handshake(self.config, self.table, with_label_counts)
        self.log.info("%s: %d classes %s; %s", self.site, len(self.class_names), self.class_names, meta[META_DATA])
        if with_label_counts:
            self.log.info("%s: sharing per-class training counts with the server (FedSLD)", self.site)
        splits = split_table(self.table, self.config)
        counts = {"num_train": len(splits["train"]), "num_val": len(splits["val"])}
        if self.config.differential_privacy.withholds_validation:  # no count of its validation set
            counts.pop("num_val")
            meta.pop(META_VALIDATION_SIZE, None)
        return FLModel(params={}, metrics=counts, meta=meta)

    def train(self, received: FLModel) -> FLModel:
        trainer = self.trainer
        round_number = received.current_round or 0
        classes = received.meta.get(META_CLASS_NAMES) or self.class_names
        trainer.set_method(method_from_meta(received.meta.get(META_METHOD) or {}))
        trainer.load_global(received.params, classes)
        global_evaluation = self.validated_before(received.meta) or trainer.validate()
        compared = self.compared(global_evaluation, received.meta.get(META_ROUND))
        report = trainer.fit(round_number, warmup=bool(received.meta.get(META_WARMUP)))
        if report.privacy is not None and report.privacy["stopped"]:  # DP-SGD budget spent: nothing to send
            trainer.save(self.local_model_path)
            meta = {META_CLASS_NAMES: trainer.head_classes, META_PRIVACY: report.privacy}
            return FLModel(params={}, metrics=self.released(evaluation_metrics(global_evaluation, "val") | compared,
                                                            global_evaluation), meta=meta)  # fmt: skip
        local_evaluation = trainer.validate()
        self.trained = TrainedRound(round_number, global_evaluation, local_evaluation)
        self.remember()
        trainer.save(self.local_model_path)
        state = trainer.state_dict()
        metrics = evaluation_metrics(global_evaluation, "val") | compared
        metrics.update({f"local_{k}": v for k, v in evaluation_metrics(local_evaluation, "val").items()})
        metrics = self.released(metrics, global_evaluation)
        if not self.config.differential_privacy.enabled:  # computed on the training split, un-noised: DP keeps it home
            metrics["train_loss"] = report.train_losses[-1]
        self._track_round(round_number, metrics)
        self.log.info(
            "%s round %d: received global model validation loss %.4f / mean AUROC %.4f; "
            "after local training %.4f / %.4f",
            self.site,
            round_number,
            global_evaluation.loss,
            global_evaluation.mean_auroc,
            local_evaluation.loss,
            local_evaluation.mean_auroc,
        )
        meta = {META_CLASS_NAMES: trainer.head_classes, META_NUM_SAMPLES: report.samples}
        if report.privacy is not None:
            meta[META_PRIVACY] = report.privacy  # epsilon spent so far: the server's history shows it by round
        return FLModel(params=numpy_state(state), metrics=metrics, meta=meta)

    def _track_round(self, round_number: int, metrics: dict[str, float]) -> None:
        """Per-round curves (TensorBoard or MLflow through FLARE): the received global model's validation, the
        local model's after training, and the training loss; step = round."""
        if self.tracker is None:
            return
        for metric, tag in ROUND_CURVES.items():
            if metric in metrics:
                self.tracker(tag, metrics[metric], round_number)

    def validate(self, received: FLModel) -> FLModel:
        classes = received.meta.get(META_CLASS_NAMES)
        if not classes:
            raise ValueError(f"{self.site}: the model to validate carries no class names; rows cannot be matched")
        evaluation = self.trainer.evaluate_state(received.params, classes)
        shared = [name for name in self.class_names if name in classes]
        self.log.info(
            "%s validation of a model with %d of its %d classes: loss %.4f, mean AUROC %.4f",
            self.site,
            len(shared),
            len(self.class_names),
            evaluation.loss,
            evaluation.mean_auroc,
        )
        metrics = evaluation_metrics(evaluation, "val") | self.compared(evaluation, received.meta.get(META_ROUND))
        metrics |= self.against_reference(evaluation, received.meta or {})
        return FLModel(metrics=self.released(metrics, evaluation))

    def released(self, metrics: dict[str, float], evaluation: Evaluation) -> dict[str, float]:
        """What leaves the site of a validation: everything, or for a DP site (``release_validation: "loss"``) only
        its clipped, rounded mean loss and standard error (``training.privacy.released_validation``)."""
        kept = released_validation(evaluation, self.config.differential_privacy)
        return metrics if kept is None else kept

    def compared(self, evaluation: Evaluation, model_round: object) -> dict[str, float]:
        """Paired over this site's validation images, when ``evaluation`` is of the global model that the round this
        site last trained in made (``model_round``): its loss and mean AUROC minus those of the model the site trained
        itself in that round (``..._minus_own``), and minus those of the model the round started from
        (``..._minus_start``), each with its standard error, and the same of the loss once each model is recalibrated
        in the large to this site's images (``val_recalibrated_loss...``). Nothing for another model."""
        trained = self.trained
        if trained is None or model_round != trained.round:
            return {}
        own = paired_figures(evaluation, trained.own, "own", recalibrated=True)
        figures = own | paired_figures(evaluation, trained.start, "start", recalibrated=True)
        recalibrated_loss = evaluation.recalibrated_loss()
        if math.isfinite(recalibrated_loss):  # the margin of the harm test's recalibrated half
            figures["val_recalibrated_loss"] = recalibrated_loss
        return figures

    def validated_before(self, meta: dict) -> Evaluation | None:
        """This site's validation of the model a task carries, when it validated that very candidate of that round
        (the server names it, ``META_MODEL_KEY``): a training task after the round's screening needs no second
        pass over the validation images."""
        key = meta.get(META_MODEL_KEY)
        if not isinstance(key, str) or meta.get(META_ROUND) != self.candidates_round:
            return None
        return self.candidates.get(key)

    def against_reference(self, evaluation: Evaluation, meta: dict) -> dict[str, float]:
        """A round's candidates (``META_MODEL_KEY``) are kept while the round lasts; one that names another of them
        (``META_COMPARE_TO``, e.g. the round's first, when a contribution is left out) is compared with it, paired
        over this site's validation images (``..._minus_reference``)."""
        key, reference = meta.get(META_MODEL_KEY), meta.get(META_COMPARE_TO)
        if not isinstance(key, str):
            return {}
        model_round = meta.get(META_ROUND)
        if model_round != self.candidates_round:
            self.candidates, self.candidates_round = {}, model_round
        self.candidates[key] = evaluation
        self.remember()
        earlier = self.candidates.get(reference) if isinstance(reference, str) else None
        return {} if earlier is None else paired_figures(evaluation, earlier, "reference", recalibrated=True)

    def refused(self, outcome: dict) -> FLModel:
        """The server left this site out at the handshake: why, in the site's log and audit."""
        reason = outcome.get("reason", "no reason given")
        self.audit.record(TASK_DESCRIBE, None, "not_aggregated", note=f"refused: {reason}")
        self.log.error(
            "%s: the server refused this site at the handshake: %s; it takes no part in this job (correct the site "
            "config or data, check it with the job, and ask for the job to be submitted again)",
            self.site,
            reason,
        )
        return FLModel(params={}, meta={})

    def keep_published(self, received: FLModel) -> FLModel:
        """The published global model: kept in the job's folder, where hospital IT finds it (``predict`` scores
        any of its classes, labelled at this site or not)."""
        meta = dict(received.meta or {})
        classes = meta.pop(META_CLASS_NAMES, None) or []
        preprocessing = meta.get(META_PREPROCESSING) or {}
        path = self.app_dir / PUBLISHED_MODEL_FILE
        meta.update({ARCHITECTURE_KEY: self.config.modality.architecture, PREPROCESSING_KEY: preprocessing})
        save_checkpoint(path, numpy_state(received.params), classes, **meta)
        self.log.info("%s received the published global model (%d classes): %s", self.site, len(classes), path)
        return FLModel(params={}, meta={"kept": str(path)})


def _config_hint(site: str, path: Path | None, origin: str) -> str:
    """Where the user fixes a site's config: the job's copy is the job folder's file, not the workspace's."""
    if path is None:
        return ""
    if origin == JOB_DEFAULT_ORIGIN:
        job_file = f"app_{site}/config/{SITE_CONFIGS_DIR}/{site}.json"
        return f" (site config: the job's {job_file}; correct it in the job folder and run it again)"
    return f" (site config: {path}, {origin})"


def main() -> None:
    if not logging.getLogger().handlers:  # an external process; in-process, FLARE's logging is already set up
        logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stdout)
    logging.getLogger("surgical_aggregation").setLevel(logging.INFO)
    flare.init()
    site = flare.get_site_name()
    log = logging.getLogger(f"surgical_aggregation.{site}")
    app_dir = job_app_dir(site, flare.get_job_id())
    path, origin = None, ""
    try:
        aliases_file = app_dir / "config" / JOB_ALIASES_FILE  # the job's label aliases, as the recipe wrote them
        job_aliases = read_alias_file(aliases_file) if aliases_file.is_file() else {}
        path, origin = find_site_config(site, app_dir)
        config = load_site_config(path, job_aliases)  # its vocabulary: the site's aliases, then the job's
        log.info("%s: site config %s (%s)", site, path, origin)
        writer = SummaryWriter()
        session = ClientSession(
            site,
            config,
            app_dir,
            log,
            tracker=lambda tag, value, step: writer.add_scalar(tag, value, step),
            job=flare.get_job_id(),
        )
    except UserError as error:
        # A site's own mistake (its config, its data) is this one line. FLARE prints an exception from the
        # script three times with its traceback; SystemExit ends the script (in-process: its thread) quietly,
        # and FLARE fails the task ("trainer thread exited before producing a result", or the exit code).
        log.error("%s cannot start: %s%s", site, error, _config_hint(site, path, origin))
        raise SystemExit(1) from None
    except Exception as error:
        log.error("%s cannot start: %s", site, error)
        raise
    with session:
        while flare.is_running():
            received = flare.receive()
            if received is None:
                break
            task = flare.get_task_name()
            try:
                result = session.handle(task, received)
            except UserError as error:  # e.g. unreadable images under on_unreadable: error; a bug keeps its traceback
                log.error("%s cannot go on: its %s task failed: %s", site, task, error)
                raise SystemExit(1) from None
            flare.send(result)


if __name__ == "__main__":
    main()
