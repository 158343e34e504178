"""FLARE plumbing of a server workflow that gives every site its own task data: send, and wait for the answers.

FLARE's ``ModelController.send_model_and_wait`` sends every target the same model and waits for all of them, also
for a site that has disconnected. This workflow sends each site its own slice and how its last result fared, waits
until every answer is in or timed out, stops waiting for sites that are all disconnected, and remembers which
answers were errors. :class:`SiteTasks` is that layer, and nothing else; the federation's logic sits above it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from nvflare.apis.fl_constant import ReturnCode
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.app_common.abstract.fl_model import FLModel
from nvflare.app_common.workflows.model_controller import ModelController

from .protocol import META_OUTCOME

TaskData = Callable[[str], FLModel]  # site -> what it is sent
Callback = Callable[[FLModel], None]  # called with each answer as it arrives, one answer at a time
WAIT_GRACE = 60  # seconds past a task's timeout before the wait gives up on FLARE's task monitor


class _ClientTasks(list):
    """A task's ``client_tasks`` holding each ClientTask once. FLARE 2.9's ``WFCommServer`` appends a ClientTask it
    re-sends (a site asking again before answering) a second time when a later standing task is not for that site
    (``_do_process_task_request``); the task's exit then pops its id twice from ``_client_task_map`` and the KeyError
    kills the task monitor thread, after which no task ends and the workflow waits forever."""

    def append(self, client_task: Any) -> None:
        if not any(existing is client_task for existing in self):
            super().append(client_task)


class SiteTasks(ModelController):
    """A :class:`ModelController` that sends one task to each live site with that site's own data."""

    def __init__(self, persistor_id: str) -> None:
        super().__init__(persistor_id=persistor_id, ignore_result_error=True)
        self._task_lock = threading.Lock()  # the answers arrive on FLARE's threads
        self._outcomes: dict[str, dict[str, Any]] = {}  # site -> how its last result fared, told with its next task
        self._outstanding: set[str] = set()  # sites whose answer to the current task is awaited
        self._failed: dict[str, str] = {}  # site -> return code, for the current task's answers that were errors

    def tell_next_time(self, site: str, outcome: dict[str, Any]) -> None:
        """``outcome`` goes to ``site`` with its next task."""
        self._outcomes[site] = outcome

    def last_outcome(self, site: str) -> dict[str, Any] | None:
        return self._outcomes.get(site)

    def alive(self, site: str) -> bool:
        """False while FLARE deems the site disconnected (it may come back; then it is sent tasks again)."""
        return self.get_client_disconnect_time(site) is None

    def to_each_site(self, task: str, sites: list[str], data: TaskData, timeout: int, callback: Callback) -> bool:
        """One ``task`` per live site of ``sites``, each with its own data (and how its last result fared); False when
        aborted while waiting."""
        self._start_task()
        answering = threading.Lock()

        def one_at_a_time(result: FLModel) -> None:  # FLARE calls back on its threads: answers are handled in turn
            with answering:
                callback(result)

        for site in sites:
            if not self.alive(site):
                self.warning(f"{site} is disconnected: no {task} task for it")
                continue
            model = data(site)
            if site in self._outcomes:
                model.meta[META_OUTCOME] = self._outcomes.pop(site)
            with self._task_lock:
                self._outstanding.add(site)
            self.send_model(task_name=task, data=model, targets=[site], timeout=timeout, callback=one_at_a_time)
        return self._wait(timeout)

    def _start_task(self) -> None:
        """A new task: no site is awaited yet and no answer has failed."""
        with self._task_lock:
            self._outstanding, self._failed = set(), {}

    def ask_every_site(self, task: str, data: FLModel, timeout: int) -> list[FLModel]:
        """``task`` with the same ``data`` to every site of the job; the answers within ``timeout``. A site whose
        answer was an error, or that gave none (in the simulator: its process never started; else it is down), is
        named in the log: it takes no part in the job."""
        self._start_task()
        results = self.send_model_and_wait(task_name=task, data=data, timeout=timeout)
        answered = {(result.meta or {}).get("client_name") for result in results}
        failed = self.failed_answers()
        for site in sorted({client.name for client in self.engine.get_clients()} - answered):
            if site in failed:
                self.error(f"{site} answered the {task} task with an error ({failed[site]}): its log names the cause; "
                           "it takes no part in this job")  # fmt: skip
            else:
                self.error(f"{site} did not answer the {task} task within {timeout} s: it takes no part in this job")
        return results

    def _prepare_task(self, data: FLModel, task_name: str, timeout: int, callback: Callable) -> Any:
        task = super()._prepare_task(data=data, task_name=task_name, timeout=timeout, callback=callback)
        task.client_tasks = _ClientTasks()  # see _ClientTasks: one site's task, sent again, is listed once
        return task

    def failed_answers(self) -> dict[str, str]:
        """Site -> return code, for the last task's answers that were errors."""
        with self._task_lock:
            return dict(self._failed)

    def _accept_train_result(
        self, client_name: str, result: Shareable, fl_ctx: FLContext, is_unknown_task: bool = False
    ) -> bool:
        """FLARE's first look at every answer (errors included): the site is no longer awaited; a failed task is
        remembered for the round's record and the site's outcome."""
        if not is_unknown_task:  # an unknown task is a late answer to an earlier one: dropped below
            with self._task_lock:
                self._outstanding.discard(client_name)
                code = result.get_return_code(ReturnCode.OK)
                if code != ReturnCode.OK:
                    self._failed[client_name] = str(code)
        return super()._accept_train_result(client_name, result, fl_ctx, is_unknown_task)

    def _wait(self, timeout: int = 0) -> bool:
        """Until every task is answered or timed out, or every site still awaited is disconnected."""
        deadline = time.monotonic() + timeout + WAIT_GRACE if timeout else None
        while self.get_num_standing_tasks():
            if self.abort_signal.triggered:
                self.info("abort signal received: stopping")
                return False
            monitor = getattr(self.communicator, "_task_monitor", None)  # FLARE's 'wf_task' thread ends tasks
            if isinstance(monitor, threading.Thread) and monitor.ident is not None and not monitor.is_alive():
                raise RuntimeError("FLARE's task monitor thread (wf_task) has died: no task can end (see the log)")
            if deadline is not None and time.monotonic() > deadline:
                self.error(f"tasks still standing {timeout + WAIT_GRACE}s after they were sent: cancelling them")
                self.cancel_all_tasks(fl_ctx=self.fl_ctx)
                break
            with self._task_lock:
                awaited = set(self._outstanding)
            if awaited and not any(self.alive(site) for site in awaited):
                self.warning(f"{sorted(awaited)} disconnected: not waiting for their answers")
                self.cancel_all_tasks(fl_ctx=self.fl_ctx)
                break
            time.sleep(self._task_check_period)
        return True
