"""SurgicalAggregatorShareable's control flow, with simulated sites in place of FLARE's transport.

Only the transport (send/wait), persistence and logging are replaced; handshake, slicing,
aggregation, rejection, min_clients, best-model selection and early stopping are the real code.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from nvflare.apis.dxo import from_shareable
from nvflare.apis.fl_context import FLContext
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.app_constant import AppConstants
from nvflare.app_common.app_event_type import AppEventType

from surgical_aggregation.core.head import initial_head_rows
from surgical_aggregation.flare.controller import SurgicalAggregatorShareable
from surgical_aggregation.flare.protocol import (
    META_CLASS_NAMES,
    META_NUM_SAMPLES,
    META_WARMUP,
    TASK_DESCRIBE,
    TASK_PUBLISH,
    TASK_TRAIN,
    TASK_VALIDATE,
)

from helpers import TOY_HEAD, rows_by_name, toy_state

Behaviour = Callable[[int, dict], dict | None]  # (round, received params) -> sent params (None: no answer)


class FakeSite:
    def __init__(self, name: str, classes: list[str], losses: list[float], behaviour: Behaviour | None = None):
        self.name, self.classes, self.losses = name, classes, losses
        self.behaviour = behaviour or (lambda round_number, params: _shifted(params, 0.01 * (1 + round_number)))
        self.received: list[tuple[list[str], dict]] = []  # training tasks: (class names, params)
        self.warmups: list[bool] = []  # the server's warm-up request in each training task
        self.tasks: list[tuple[str, list[str], dict]] = []  # every task after the handshake: (task, names, params)

    def answer(self, task: str, data: FLModel) -> FLModel | None:
        meta = {"client_name": self.name, META_CLASS_NAMES: self.classes, META_NUM_SAMPLES: 10}
        if task == TASK_DESCRIBE:
            return FLModel(params={}, metrics={"num_train": 10}, meta=meta)
        self.tasks.append((task, list(data.meta.get(META_CLASS_NAMES) or []), data.params))
        if task == TASK_PUBLISH:
            return FLModel(params={}, meta={"client_name": self.name})
        round_number = data.current_round if task != TASK_VALIDATE else len(self.losses) - 1
        metrics = {"val_loss": self.losses[min(round_number, len(self.losses) - 1)], "val_mean_auroc": 0.7}
        if task == TASK_VALIDATE:
            return FLModel(metrics=metrics, meta=meta)
        self.received.append((list(data.meta[META_CLASS_NAMES]), data.params))
        self.warmups.append(bool(data.meta[META_WARMUP]))
        params = self.behaviour(round_number, data.params)
        return None if params is None else FLModel(params=params, metrics=metrics, meta=meta)


def _shifted(params: dict, amount: float) -> dict:
    tensors = {key: torch.as_tensor(value) for key, value in params.items()}  # FLARE sends NumPy, tests torch
    return {key: value + amount if value.is_floating_point() else value.clone() for key, value in tensors.items()}


class Harness(SurgicalAggregatorShareable):
    def __init__(self, sites: list[FakeSite], app_dir, initial: tuple[dict, list[str]] | None = None, **arguments):
        super().__init__(**arguments)
        self.head = TOY_HEAD
        self.sites = {site.name: site for site in sites}
        self.initial = initial or (toy_state(0, seed=0), [])
        self.fl_ctx, self.abort_signal = FLContext(), Signal()
        self.app_dir, self.saved, self.events, self.messages = app_dir, [], [], []
        self.validation_results: list[tuple[str, str, dict]] = []  # (model, site, metrics), as FLARE's JSON gets them

    @property
    def history(self) -> list[dict]:
        return self._federation.history

    # transport
    def send_model_and_wait(self, task_name="train", data=None, targets=None, min_responses=None, timeout=0):
        answers = [site.answer(task_name, data) for site in self.sites.values()]
        return [answer for answer in answers if answer is not None]

    def send_model(self, task_name="train", data=None, targets=None, min_responses=None, timeout=0, callback=None):
        answer = self.sites[targets[0]].answer(task_name, data)
        if answer is not None:
            callback(answer)

    def get_num_standing_tasks(self) -> int:
        return 0

    # persistence, events, logs
    def load_model(self) -> FLModel:
        return FLModel(params=self.initial[0], meta={META_CLASS_NAMES: self.initial[1]})

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

    def best_rounds(self) -> list[int]:
        return [ml["meta"]["round"] for event, ml in self.events if event == AppEventType.GLOBAL_BEST_MODEL_AVAILABLE]


def _messages(harness: Harness, level: str) -> str:
    return "\n".join(text for kind, text in harness.messages if kind == level)


def test_union_slices_and_aggregation(tmp_path):
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.5, 0.4, 0.3])
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.6, 0.5, 0.4])
    harness = Harness([b, a], tmp_path, num_rounds=2)
    harness.run()
    assert [r["round"] for r in harness.history] == [-1, 0, 1]  # one entry per global model (-1: before training)
    final = harness.saved[-1]
    # union in name order, whoever brought which class; "Effusion" is "Pleural Effusion"
    assert final.meta[META_CLASS_NAMES] == ["Hernia", "Mass", "Pleural Effusion"]
    # every task carried exactly the site's rows, in its order, with its own spelling
    assert all(classes == ["Mass", "Effusion"] for classes, _ in a.received)
    assert all(params["head.weight"].shape == (2, 4) for _, params in a.received)
    # round 1: each site sent its round-1 slice + 0.02; shared rows are the mean of both, others the owner's
    round_1 = {site.name: rows_by_name(site.received[1][1], site.classes) for site in (a, b)}
    result = rows_by_name(final.params, final.meta[META_CLASS_NAMES])
    np.testing.assert_allclose(result["Mass"], round_1["site-a"]["Mass"] + 0.02, atol=1e-6)
    shared = (round_1["site-a"]["Effusion"] + round_1["site-b"]["Pleural Effusion"]) / 2 + 0.02
    np.testing.assert_allclose(result["Pleural Effusion"], shared, atol=1e-6)
    assert (tmp_path / "round_history.json").is_file() and (tmp_path / "training_curves.png").is_file()


def test_handshake_leaves_out_a_site_with_unknown_labels(tmp_path):
    good = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5])]
    harness = Harness([*good, FakeSite("site-c", ["Tumour"], [0.5])], tmp_path, num_rounds=1)
    harness.run()
    assert "handshake with site-c failed, leaving it out" in _messages(harness, "error")
    assert "unknown label 'Tumour'" in _messages(harness, "error")
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Edema", "Mass"]
    with pytest.raises(RuntimeError, match=r"only 1 site\(s\) answered the handshake"):
        Harness([good[0], FakeSite("site-c", ["Tumour"], [0.5])], tmp_path, num_rounds=1).run()


def test_broken_update_is_rejected_and_the_round_continues(tmp_path):
    def nan_in_round_1(round_number, params):
        sent = _shifted(params, 0.01)
        if round_number == 1:
            sent["backbone.conv.weight"][0, 0, 0, 0] = math.nan
        return sent

    sites = [
        FakeSite("site-a", ["Mass"], [0.5]),
        FakeSite("site-b", ["Mass", "Edema"], [0.5]),
        FakeSite("site-c", ["Edema"], [0.5], nan_in_round_1),
    ]
    harness = Harness(sites, tmp_path, num_rounds=2, min_clients=2)
    harness.run()
    assert "contribution from 'site-c' rejected: 'backbone.conv.weight' has 1 non-finite" in _messages(harness, "error")
    round_1 = next(entry for entry in harness.history if entry["round"] == 1)["aggregation"]
    assert round_1["accepted"] == ["site-a", "site-b"] and "site-c" in round_1["rejected"]
    final = harness.saved[-1].params
    assert torch.isfinite(final["backbone.conv.weight"]).all()
    # Edema's row now comes from site-b alone
    sent_b = rows_by_name(_shifted(sites[1].received[1][1], 0.02), sites[1].classes)
    union = harness.saved[-1].meta[META_CLASS_NAMES]
    np.testing.assert_allclose(rows_by_name(final, union)["Edema"], sent_b["Edema"], atol=1e-6)


def test_too_few_valid_contributions_keep_the_last_good_model(tmp_path):
    def silent_after_round_0(round_number, params):
        return _shifted(params, 0.01) if round_number == 0 else None  # drops out

    sites = [FakeSite("site-a", ["Mass"], [0.5]), FakeSite("site-b", ["Edema"], [0.5], silent_after_round_0)]
    harness = Harness(sites, tmp_path, num_rounds=2, min_clients=2)
    harness.run()
    assert "round 1: no result from ['site-b']" in _messages(harness, "warning")
    assert "keeping the last good global model" in _messages(harness, "warning")
    after_round_0, after_round_1 = harness.saved[0].params, harness.saved[1].params
    for key in after_round_0:
        assert torch.equal(torch.as_tensor(after_round_0[key]), torch.as_tensor(after_round_1[key])), key


def test_best_model_by_mean_validation_loss_and_early_stopping(tmp_path):
    # The sites validate the model they receive: losses reported in round r judge the global of round r-1.
    sites = [  # the last value answers the final validation
        FakeSite("site-a", ["Mass"], [0.9, 0.5, 0.3, 0.35, 0.34, 0.36, 0.6]),
        FakeSite("site-b", ["Edema"], [0.9, 0.7, 0.5, 0.55, 0.56, 0.54, 0.6]),
    ]
    harness = Harness(sites, tmp_path, num_rounds=7, patience=3, min_delta=1e-3)
    harness.run()
    # global of round 0: 0.6, round 1: 0.4 (best), rounds 2-4: 0.45 -> three without improvement -> stop
    judged = [(r["round"], r["validation"]["mean_val_loss"]) for r in harness.history if "validation" in r]
    assert [j[0] for j in judged] == [-1, 0, 1, 2, 3, 4, 5]  # -1: before training (never best); 5: the final one
    assert [j[1] for j in judged] == pytest.approx([0.9, 0.6, 0.4, 0.45, 0.45, 0.45, 0.6])
    assert harness.best_rounds() == [0, 1]
    assert harness._federation.best.round == 1
    assert max(r["round"] for r in harness.history) == 5  # round 6 never ran
    assert "early stop: 3 validated rounds without improvement" in _messages(harness, "info")


def test_the_server_asks_each_site_to_warm_up_its_head_once(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4, 0.3]), FakeSite("site-b", ["Edema"], [0.6, 0.5, 0.4])]
    Harness(sites, tmp_path, num_rounds=3).run()
    assert [site.warmups for site in sites] == [[True, False, False], [True, False, False]]


# --- class-set privacy, publication, continuing federations, resuming after a crash -----------------


def test_before_publication_each_site_only_ever_receives_its_own_rows(tmp_path):
    a = FakeSite("site-a", ["Mass", "Effusion"], [0.9, 0.3, 0.5, 0.6])  # the best model is round 0's, not the last
    b = FakeSite("site-b", ["Pleural Effusion", "Hernia"], [0.9, 0.3, 0.5, 0.6])
    harness = Harness([a, b], tmp_path, num_rounds=3)
    harness.run()
    for site in (a, b):
        before_publication, publication = site.tasks[:-1], site.tasks[-1]
        assert [task for task, _, _ in before_publication] == [TASK_TRAIN] * 3 + [TASK_VALIDATE] * 2
        for _, names, params in before_publication:  # training, final validation, the best model's evaluation
            assert names == site.classes  # its own classes, in its own spelling and order
            assert params["head.weight"].shape == (2, 4)
        task, names, params = publication
        assert task == TASK_PUBLISH and names == ["Hernia", "Mass", "Pleural Effusion"]
        assert params["head.weight"].shape == (3, 4)
    best = harness._federation.best
    assert best.round == 0
    np.testing.assert_array_equal(np.asarray(a.tasks[-1][2]["head.weight"]), np.asarray(best.state["head.weight"]))
    # the server's models as FLARE's cross-site evaluation reports them: latest (final validation) and best
    assert sorted((owner, site) for owner, site, _ in harness.validation_results) == [
        ("SRV_FL_global_model.pt", "site-a"),
        ("SRV_FL_global_model.pt", "site-b"),
        ("SRV_best_FL_global_model.pt", "site-a"),
        ("SRV_best_FL_global_model.pt", "site-b"),
    ]


def test_publication_can_be_turned_off(tmp_path):
    sites = [FakeSite("site-a", ["Mass"], [0.5, 0.4]), FakeSite("site-b", ["Edema"], [0.5, 0.4])]
    Harness(sites, tmp_path, num_rounds=1, publish_global_model=False).run()
    assert all(TASK_PUBLISH not in [task for task, _, _ in site.tasks] for site in sites)


def test_a_federation_continues_from_an_earlier_global_model(tmp_path):
    earlier = toy_state(2, seed=5)  # learned rows of Mass and Edema
    a = FakeSite("site-a", ["Mass", "Hernia"], [0.5, 0.4])  # Hernia: a class nobody had
    b = FakeSite("site-b", ["Edema"], [0.5, 0.4])
    harness = Harness([a, b], tmp_path, initial=(earlier, ["Mass", "Edema"]), num_rounds=1)
    harness.run()
    assert harness.saved[-1].meta[META_CLASS_NAMES] == ["Mass", "Edema", "Hernia"]  # existing first, new appended
    learned = rows_by_name(earlier, ["Mass", "Edema"])
    np.testing.assert_array_equal(rows_by_name(a.received[0][1], a.classes)["Mass"], learned["Mass"])
    np.testing.assert_array_equal(rows_by_name(b.received[0][1], b.classes)["Edema"], learned["Edema"])
    hernia = rows_by_name(a.received[0][1], a.classes)["Hernia"]
    fresh_weight, fresh_bias = initial_head_rows(["Hernia"], 4)
    np.testing.assert_allclose(hernia, np.append(fresh_weight[0], fresh_bias[0]), atol=1e-7)
    # a site warms its head up only when one of its classes starts from scratch
    assert (a.warmups, b.warmups) == ([True], [False])


def test_a_crashed_federation_resumes_from_its_last_completed_round(tmp_path):
    def crash_in_round_2(round_number, params):
        if round_number == 2:
            raise ConnectionError("the server went down")
        return _shifted(params, 0.01)

    losses = [0.9, 0.5, 0.4, 0.45, 0.3]
    sites = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses, crash_in_round_2)]
    with pytest.raises(ConnectionError):
        Harness(sites, tmp_path, num_rounds=4).run()
    after_round_1 = Harness(sites, tmp_path, num_rounds=4)._state_location()
    assert after_round_1.is_file()

    again = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses)]
    harness = Harness(again, tmp_path, num_rounds=4)
    harness.run()
    assert "resuming the federation saved by job" in _messages(harness, "info")
    assert [entry["round"] for entry in harness.history] == [-1, 0, 1, 2, 3]  # each model once
    assert all("aggregation" in entry for entry in harness.history[1:])
    assert [site.warmups for site in again] == [[False, False], [False, False]]  # warmed up before the crash
    assert again[0].received[0][1]["head.weight"].shape == (1, 4)  # resumed with the union, at round 2
    assert harness.saved[0].current_round == 2
    assert harness._federation.best.round == 3 and harness._federation.finished

    # a finished federation is not resumed: the next job of that name starts afresh
    fresh = [FakeSite("site-a", ["Mass"], losses), FakeSite("site-b", ["Edema"], losses)]
    restarted = Harness(fresh, tmp_path, num_rounds=1)
    restarted.run()
    assert [entry["round"] for entry in restarted.history] == [-1, 0] and fresh[0].warmups == [True]


def test_an_unfinished_federation_is_not_continued_with_another_method(tmp_path):
    def crash(round_number, params):
        raise ConnectionError("the server went down")

    with pytest.raises(ConnectionError):
        Harness([FakeSite("site-a", ["Mass"], [0.5], crash)], tmp_path, num_rounds=2, min_clients=1).run()
    with pytest.raises(RuntimeError, match=r"ran with .*'method': 'surgical'.*remove that folder to start afresh"):
        Harness([FakeSite("site-a", ["Mass"], [0.5])], tmp_path, num_rounds=2, min_clients=1, method="personal").run()
