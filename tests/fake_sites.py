"""Simulated sites in place of FLARE's transport, for the controller's tests.

Only the transport (send/wait), persistence and logging are replaced; handshake, slicing, checks,
aggregation, rejection, min_clients, best-model selection and early stopping are the real code.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import make_reply
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from surgical_aggregation.flare import protocol
from surgical_aggregation.flare.controller import SurgicalAggregatorShareable

from helpers import TOY_HEAD, toy_outputs, toy_state

Behaviour = Callable[[int, dict], dict | str | None]  # (round, received params) -> sent params
FAILS = "fails"  # a behaviour's answer when the site's task raises: FLARE returns an error code, no result


class FakeSite:
    def __init__(self, name: str, classes: list[str], losses: list[float], behaviour: Behaviour | None = None):
        self.name, self.classes, self.losses = name, classes, losses
        self.behaviour = behaviour or (lambda round_number, params: shifted(params, 0.01 * (1 + round_number)))
        self.received: list[tuple[list[str], dict]] = []  # training tasks: (class names, params)
        self.warmups: list[bool] = []  # the server's warm-up request in each training task
        self.training_rounds: list[int] = []  # the round of each training task it received
        self.tasks: list[tuple[str, list[str], dict]] = []  # every task after the handshake: (task, names, params)
        self.outcomes: list[dict] = []  # what the server said of its previous training results
        self.preprocessing = {"image_size": 64, "in_channels": 1, "imagenet_normalize": True}
        self.metrics_override: dict | None = None  # sent instead of honest metrics with training results
        self.validation_override: dict | None = None  # ... with the final validation's
        self.trains_received_rows = False  # its results carry the rows it received (FL + partial loss), not its own
        self.privacy: Callable[[int], dict] | None = None  # a DP-SGD site's privacy report by round
        self.samples = 10  # its training-set size, declared at the handshake and reported with each result
        self.validation_size: int | None = None  # declared at the handshake (the floor of its standard errors)
        self.harm_scale: float | None = None  # see harm_figures: its paired figures of each model it validates
        self.own_gain = 0.1  # what its own training gains in a round, in loss
        self.sent: dict | None = None  # the params of its last training result (its own model)
        self._candidates: dict = {}  # the round's candidates it validated: key -> its validation loss
        self._candidates_round = None

    def answer(self, task: str, data: FLModel) -> FLModel | None:
        meta = {
            "client_name": self.name,
            protocol.META_CLASS_NAMES: self.classes,
            protocol.META_NUM_SAMPLES: self.samples,
        }
        if task == protocol.TASK_DESCRIBE:
            described = {
                **meta,
                protocol.META_PREPROCESSING: self.preprocessing,
                protocol.META_VALIDATION_SIZE: self.validation_size,
            }
            return FLModel(params={}, metrics={"num_train": self.samples}, meta=described)
        self.tasks.append((task, list(data.meta.get(protocol.META_CLASS_NAMES) or []), data.params))
        if protocol.META_OUTCOME in data.meta:
            self.outcomes.append(data.meta[protocol.META_OUTCOME])
        if task in (protocol.TASK_PUBLISH, protocol.TASK_REFUSED):
            return FLModel(params={}, meta={"client_name": self.name})
        # losses[r]: its validation loss of the model it trains from in round r, the model round r - 1 made, which
        # it validates (TASK_VALIDATE) at the end of round r - 1
        round_number = (
            data.current_round if task != protocol.TASK_VALIDATE else data.meta.get(protocol.META_ROUND, -1) + 1
        )
        metrics = {"val_loss": self.losses[min(round_number, len(self.losses) - 1)], "val_mean_auroc": 0.7}
        if self.metrics_override is not None and task == protocol.TASK_TRAIN:
            metrics = {**metrics, **self.metrics_override}
        if task == protocol.TASK_VALIDATE:
            metrics.update(self.harm_figures(data.params))
            metrics.update(self.against_reference(data.meta, metrics))
            return FLModel(metrics={**metrics, **(self.validation_override or {})}, meta=meta)
        self.received.append((list(data.meta[protocol.META_CLASS_NAMES]), data.params))
        self.training_rounds.append(data.current_round)
        self.warmups.append(bool(data.meta[protocol.META_WARMUP]))
        if self.privacy is not None:
            meta[protocol.META_PRIVACY] = self.privacy(round_number)
            if meta[protocol.META_PRIVACY].get("stopped") is True:  # its budget is spent: no update
                return FLModel(params={}, metrics=metrics, meta=meta)
        params = self.behaviour(round_number, data.params)
        if params is None or params == FAILS:
            return params
        if self.trains_received_rows:
            meta[protocol.META_CLASS_NAMES] = list(data.meta[protocol.META_CLASS_NAMES])
        self.sent = params
        return FLModel(params=params, metrics=metrics, meta=meta)

    def against_reference(self, meta: dict, metrics: dict) -> dict:
        """A round's candidates by their key: a candidate that names another (``META_COMPARE_TO``) is compared with
        it (its loss minus the other's, standard error 0.005), as the bundle's client does."""
        if meta.get(protocol.META_ROUND) != self._candidates_round:
            self._candidates, self._candidates_round = {}, meta.get(protocol.META_ROUND)
        self._candidates[meta.get(protocol.META_MODEL_KEY)] = metrics["val_loss"]
        reference = (
            self._candidates.get(meta.get(protocol.META_COMPARE_TO)) if protocol.META_COMPARE_TO in meta else None
        )
        if reference is None:
            return {}
        return {"val_loss_minus_reference": metrics["val_loss"] - reference, "val_loss_minus_reference_se": 0.005}

    def harm_figures(self, params: dict) -> dict:
        """With ``harm_scale``: a model costs this site ``harm_scale`` x its squared distance from the site's own last
        model (its loss 0.5 plus that), paired over 400 images with standard errors of 0.005; its own training gained
        ``own_gain``. A model far from what the site trained is worse for it, one close to it is not."""
        if self.harm_scale is None or self.sent is None:
            return {}
        own = {key: torch.as_tensor(np.asarray(value)) for key, value in self.sent.items()}
        distance = sum(
            float(torch.sum((torch.as_tensor(np.asarray(params[key])) - own[key]).double() ** 2))
            for key in own
            if key in params and own[key].is_floating_point()
        )
        harm = self.harm_scale * distance
        return {
            "val_loss": 0.5 + harm,
            "val_loss_minus_own": harm,
            "val_loss_minus_own_se": 0.005,
            "val_loss_minus_start": harm - self.own_gain,
            "val_loss_minus_start_se": 0.005,
        }


def shifted(params: dict, amount: float) -> dict:
    tensors = {key: torch.as_tensor(value) for key, value in params.items()}  # FLARE sends NumPy, tests torch
    return {key: value + amount if value.is_floating_point() else value.clone() for key, value in tensors.items()}


class Harness(SurgicalAggregatorShareable):
    def __init__(self, sites: list[FakeSite], app_dir, initial: tuple[dict, list[str]] | None = None, **arguments):
        # the plain mean unless a test asks for a robust rule: the other mechanisms, each in isolation
        super().__init__(**{"robust_aggregation": "mean", **arguments})
        self.head = TOY_HEAD
        self.sites = {site.name: site for site in sites}
        self.initial = initial or (toy_state(0, seed=0), [])
        self.fl_ctx, self.abort_signal = FLContext(), Signal()
        self.app_dir, self.saved, self.events, self.messages = app_dir, [], [], []
        self.validation_results: list[tuple[str, str, dict]] = []  # (model, site, metrics), as FLARE's JSON gets them
        self.dead: set[str] = set()  # sites FLARE deems disconnected
        self.unanswered: set[str] = set()  # tasks sent to sites that never answered (standing until cancelled)
        self.cancelled = 0
        # FLARE's engine: the job's sites, answering or not
        self.engine = SimpleNamespace(get_clients=lambda: [SimpleNamespace(name=name) for name in self.sites])

    @property
    def history(self) -> list[dict]:
        return self._federation.history

    # transport
    def send_model_and_wait(self, task_name="train", data=None, targets=None, min_responses=None, timeout=0):
        answers = {name: site.answer(task_name, data) for name, site in self.sites.items()}
        for name, answer in answers.items():
            if answer == FAILS:  # FLARE's path for an error: no result, its return code seen on the way
                self._accept_train_result(name, make_reply(ReturnCode.EXECUTION_EXCEPTION), self.fl_ctx)
        return [answer for answer in answers.values() if answer is not None and answer != FAILS]

    def send_model(self, task_name="train", data=None, targets=None, min_responses=None, timeout=0, callback=None):
        site = targets[0]
        answer = self.sites[site].answer(task_name, data)
        if answer is None:
            if site in self.dead:
                self.unanswered.add(site)  # a dead site's task stands until it times out or is cancelled
            return
        failed = answer == FAILS
        reply = make_reply(ReturnCode.EXECUTION_EXCEPTION if failed else ReturnCode.OK)
        if self._accept_train_result(site, reply, self.fl_ctx) and not failed:  # FLARE's path for every answer
            callback(answer)

    def get_num_standing_tasks(self) -> int:
        return len(self.unanswered)

    def get_client_disconnect_time(self, client_name):
        return 1.0 if client_name in self.dead else None

    def cancel_all_tasks(self, completion_status=None, fl_ctx=None):
        self.cancelled += 1
        self.unanswered.clear()

    # persistence, events, logs
    def load_model(self) -> FLModel:
        return FLModel(params=self.initial[0], meta={protocol.META_CLASS_NAMES: self.initial[1]})

    def _probe(self):  # the model check's forward pass on the toy model
        return toy_outputs

    def _state_location(self) -> Path:
        return Path(self.app_dir) / "federation" / "federation.pt"

    def save_model(self, model: FLModel) -> None:
        self.saved.append(model)

    def get_app_dir(self) -> str:
        return str(self.app_dir)

    def event(self, event_type: str) -> None:
        self.events.append((event_type, self.fl_ctx.get_prop(AppConstants.GLOBAL_MODEL)))
        if event_type == AppEventType.VALIDATION_RESULT_RECEIVED:
            owner, site = self.fl_ctx.get_prop(AppConstants.MODEL_OWNER), self.fl_ctx.get_prop(AppConstants.DATA_CLIENT)
            metrics = from_shareable(self.fl_ctx.get_prop(AppConstants.VALIDATION_RESULT)).data
            self.validation_results.append((owner, site, metrics))

    def info(self, msg: str) -> None:
        self.messages.append(("info", msg))

    def warning(self, msg: str) -> None:
        self.messages.append(("warning", msg))

    def error(self, msg: str) -> None:
        self.messages.append(("error", msg))

    def panic(self, reason: str, fl_ctx=None) -> None:  # FLARE aborts the job; here the test sees it raised
        raise RuntimeError(reason)

    def best_rounds(self) -> list[int]:
        return [ml["meta"]["round"] for event, ml in self.events if event == AppEventType.GLOBAL_BEST_MODEL_AVAILABLE]


def messages(harness: Harness, level: str) -> str:
    return "\n".join(text for kind, text in harness.messages if kind == level)
