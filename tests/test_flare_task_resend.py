"""Regression test: a site that asks for its task again before answering (its GET_TASK reply was lost) must not
make FLARE 2.9's task monitor die on a KeyError and the workflow wait forever (wf_comm_server.py:355-358, 1106-1109).

Uses nvflare's real WFCommServer and its 'wf_task' monitor thread with the bundle's SiteTasks; only the engine
and the sites are fakes. Runs in about a second."""

from __future__ import annotations

import threading
import time

from nvflare.apis.client import Client
from nvflare.apis.fl_context import FLContextManager
from nvflare.apis.impl.wf_comm_server import WFCommServer
from nvflare.apis.signal import Signal
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.utils.fl_model_utils import FLModelUtils

from surgical_aggregation.flare.tasks import SiteTasks

SITES = ["site-1", "site-2", "site-3"]


class _Engine:
    def __init__(self) -> None:
        self._contexts = FLContextManager(engine=self)
        self.clients = [Client(site, None) for site in SITES]

    def new_context(self):
        return self._contexts.new_context()

    def get_clients(self):
        return self.clients

    def fire_event(self, *args, **kwargs) -> None:
        pass

    def get_component(self, _):
        return None


class _Tasks(SiteTasks):
    def run(self) -> None:
        pass


def test_a_resent_task_does_not_hang_the_workflow():
    engine = _Engine()
    controller, communicator = _Tasks(persistor_id=""), WFCommServer()
    controller.set_communicator(communicator)
    controller.initialize(engine.new_context())
    controller.abort_signal = Signal()
    communicator.initialize_run(engine.new_context())  # starts the 'wf_task' monitor thread
    answers, returned, done = [], [], threading.Event()

    def workflow() -> None:
        try:
            returned.append(controller.to_each_site("train", SITES, lambda s: FLModel(params={}), 3600, answers.append))
        finally:
            done.set()

    threading.Thread(target=workflow, daemon=True).start()
    try:
        deadline = time.monotonic() + 10
        while communicator.get_num_standing_tasks() < len(SITES) and time.monotonic() < deadline:
            time.sleep(0.05)
        ids = {c.name: communicator.process_task_request(c, engine.new_context())[1] for c in engine.clients}
        # site-1 asks again before answering: FLARE sends it the same task again
        assert communicator.process_task_request(engine.clients[0], engine.new_context())[1] == ids["site-1"]
        for client in engine.clients:
            result = FLModelUtils.to_shareable(FLModel(params={}, metrics={"val_loss": 1.0}))
            communicator.process_submission(client, "train", ids[client.name], result, engine.new_context())
        assert done.wait(10), "to_each_site still waiting: FLARE's task monitor died"
        assert returned == [True] and len(answers) == len(SITES)
        assert communicator._task_monitor.is_alive() and communicator.get_num_standing_tasks() == 0
    finally:
        controller.abort_signal.trigger(True)
        communicator._all_done = True
