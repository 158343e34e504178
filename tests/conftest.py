"""Session fixtures: tiny generated datasets in the real layouts, built once."""

from __future__ import annotations

import os

# Under pytest-xdist (the README's test command: -n 2) each worker gets its share of the cores before torch starts
# its thread pool; workers that each take every core oversubscribe them (at -n 3 without this, a fixture of 23 s took
# 280 s). A value already set is kept, and the simulator's site processes inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

import time

import pytest

from surgical_aggregation.images.synthetic import GeneratedDataset, generate_chexpert, generate_mimic, generate_nih

# The modules whose federations take longest (CI's --durations), longest first. pytest-xdist's loadscope queues modules
# by their number of tests, which put these few-test modules last, where one worker ran them long after the other had
# finished; queued first, the short modules fill in at the end. A module missing here only runs in xdist's order.
LONGEST_MODULES = (
    "tests/test_blind_defences_e2e.py",
    "tests/test_flare_e2e.py",
    "tests/test_falsification.py",
    "tests/test_flare_hostile_e2e.py",
    "tests/test_defences_e2e.py",
    "tests/test_deploy.py",
    "tests/test_docs.py",
    "tests/test_stopping.py",
    "tests/test_exclusion_e2e.py",
    "tests/test_blind_e2e.py",
)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """``--dist loadscope`` with :data:`LONGEST_MODULES` queued first (longest processing time first)."""
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    if config.getvalue("dist") != "loadscope":
        return None

    class LongestModulesFirst(LoadScopeScheduling):
        ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self.ordered:
                rank = {module: index for index, module in enumerate(LONGEST_MODULES)}
                scopes = sorted(self.workqueue, key=lambda scope: rank.get(scope, len(rank)))  # stable for the rest
                self.workqueue = OrderedDict((scope, self.workqueue[scope]) for scope in scopes)
                self.ordered = True
            super()._assign_work_unit(node)

    return LongestModulesFirst(config, log)


_started = time.monotonic()
_workers: dict[str, list[float]] = {}  # worker -> [seconds its tests took, when its last report came]


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Under xdist, on the controller: each worker's busy time and when it finished, for the summary below."""
    worker = getattr(report, "node", None)
    if worker is not None:
        times = _workers.setdefault(worker.gateway.id, [0.0, 0.0])
        times[0] += report.duration
        times[1] = time.monotonic() - _started


def pytest_terminal_summary(terminalreporter) -> None:
    """How evenly the workers were loaded: a worker that finished long before the other was idle that long."""
    for worker, (busy, finished) in sorted(_workers.items()):
        terminalreporter.write_line(f"{worker}: tests took {busy:.0f} s; its last one ended {finished:.0f} s in")


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test writes to the user's cache (~/.cache/surgical_aggregation)."""
    os.environ["SURGICAL_AGGREGATION_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def nih_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_nih(tmp_path_factory.mktemp("nih"), n_patients=40, image_size=32, label_source="builtin")


@pytest.fixture(scope="session")
def chexpert_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_chexpert(tmp_path_factory.mktemp("chexpert"), n_patients=40, image_size=32, label_source="builtin")


@pytest.fixture(scope="session")
def mimic_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_mimic(tmp_path_factory.mktemp("mimic"), n_patients=30, image_size=32, label_source="builtin")
