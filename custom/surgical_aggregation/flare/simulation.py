"""Running a recipe in FLARE's simulator (``SimEnv``) and finding what it wrote.

The simulator's workspace layout (``<workspace>/server/simulate_job/app_server/...``) is FLARE's
business; :class:`FederationResult` is the one place that knows it, so the experiment harness
asks for "the best global model" rather than for a path.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from nvflare.app_common.app_constant import DefaultCheckpointFileName
from nvflare.recipe import SimEnv

from ..core.errors import StorageError, UserError
from ..evaluation.run_summary import summary_lines
from .protocol import JOB_FAILED
from .recipe import SurgicalAggregationRecipe
from .results import CURVES_FILE, HISTORY_FILE, PERSONAL_MODELS_DIR, result_files
from .tracking import MLFLOW_STORE


@dataclass(frozen=True)
class FederationResult:
    """The files a finished simulated federation left in its workspace."""

    workspace: Path
    earlier_results: Path | None = None  # where an earlier run's results in the same workspace were moved

    @property
    def server_app(self) -> Path:
        return self.workspace / "server" / "simulate_job" / "app_server"

    @property
    def history(self) -> Path:
        return self.server_app / HISTORY_FILE

    @property
    def curves(self) -> Path:
        return self.server_app / CURVES_FILE

    @property
    def mlflow_store(self) -> Path:
        """The MLflow store (SQLite) of a federation tracked with ``tracking="mlflow"`` and no tracking URI."""
        return self.server_app.parent / MLFLOW_STORE

    @property
    def final_global_model(self) -> Path:
        """The last round's global model."""
        return self.server_app / DefaultCheckpointFileName.GLOBAL_MODEL

    @property
    def best_global_model(self) -> Path:
        """The best global model, or the latest when no round was ever judged best."""
        best = self.server_app / DefaultCheckpointFileName.BEST_GLOBAL_MODEL
        return best if best.is_file() else self.server_app / DefaultCheckpointFileName.GLOBAL_MODEL

    def summary(self) -> list[str]:
        """The best and final global models' validation and where the files are (see ``run_summary``)."""
        history = json.loads(self.history.read_text()) if self.history.is_file() else []
        files = {**result_files(self.server_app), "site logs": f"{self.workspace}/<site>/log.txt"}
        return summary_lines(history, files)

    def personal_model(self, site: str, last: bool = False) -> Path:
        """PFL: a site's best personal model (or its latest when none was judged best), or its latest."""
        folder = self.server_app / PERSONAL_MODELS_DIR
        best = folder / f"best_{site}.pt"
        return best if best.is_file() and not last else folder / f"{site}.pt"


@contextlib.contextmanager
def _output_to(log_file: Path | None) -> Iterator[None]:
    """Send this process's and its children's stdout/stderr to ``log_file`` (the simulator is chatty)."""
    if log_file is None:
        yield
        return
    log_file.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log_file, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


THREADS_VARIABLE = "OMP_NUM_THREADS"  # torch's default number of CPU threads in a process that starts with it


def cores_per_process(processes: int) -> int:
    """This machine's cores shared among ``processes`` site processes (at least one each)."""
    return max(1, (os.cpu_count() or 1) // max(processes, 1))


@contextlib.contextmanager
def cores_shared_by(processes: int) -> Iterator[int]:
    """While sites run side by side on this machine, each site process's torch takes its share of the cores
    (the processes inherit ``OMP_NUM_THREADS``; two sites with all cores each run many times slower). A value
    already set is kept; a site config's ``cpu_threads`` overrides both. Yields the threads per process."""
    if THREADS_VARIABLE in os.environ:
        yield int(os.environ[THREADS_VARIABLE])
        return
    share = cores_per_process(processes)
    os.environ[THREADS_VARIABLE] = str(share)
    try:
        yield share
    finally:
        os.environ.pop(THREADS_VARIABLE, None)


def simulate(
    recipe: SurgicalAggregationRecipe, workspace_root: Path, log_file: Path | None = None, threads: int | None = None
) -> FederationResult:
    """Run ``recipe`` in FLARE's simulator under ``workspace_root/<job name>``; one thread per site by default
    (each site keeps its process, and its local model, between tasks), the cores shared among them."""
    parallel = threads or len(recipe.sites)
    workspace_root = usable_workspace(Path(workspace_root))
    with one_run_at_a_time(workspace_root, recipe.name):
        earlier = _move_aside(workspace_root / recipe.name)
        env = SimEnv(clients=recipe.sites, num_threads=parallel, workspace_root=str(workspace_root))
        try:
            with _output_to(log_file), cores_shared_by(parallel):
                run = recipe.run(env)
        except RuntimeError as error:
            server_log = workspace_root / recipe.name / "server" / "log.txt"
            reason = _failure_reason(server_log) or str(error)
            output = f"; output: {log_file}" if log_file else ""
            raise FederationFailed(
                f"the federation {recipe.name!r} failed: {reason} (server log: {server_log}{output})"
            ) from None
        result = FederationResult(Path(env.get_job_result(run.get_job_id())), earlier)
        (workspace_root / recipe.name / COMPLETED_FILE).write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    return result


COMPLETED_FILE = "COMPLETED"  # written when a run ends with its results; a folder without it is a partial run
LOCK_SUFFIX = ".lock"


def usable_workspace(folder: Path) -> Path:
    """``folder``, created if needed; a file in its place or a folder this user cannot write is a clear error."""
    folder = folder.expanduser()
    if folder.exists() and not folder.is_dir():
        raise StorageError(f"workspace {folder} is a file, not a folder: give a folder (it is created if needed)")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise StorageError(f"cannot create the workspace {folder}: {error.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise StorageError(f"cannot write in the workspace {folder} (permission denied): give one you can write")
    return folder.resolve()


@contextlib.contextmanager
def one_run_at_a_time(workspace_root: Path, name: str) -> Iterator[None]:
    """Hold ``<workspace>/<name>.lock`` for the run (the OS frees it when the process ends, even killed); a second
    run into the same workspace is refused, naming the process that holds it."""
    path = workspace_root / f"{name}{LOCK_SUFFIX}"
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holder = lock.read().strip() or "another process"
            raise StorageError(
                f"workspace {workspace_root / name} is in use by a running {name!r} ({holder}): wait for it to end, "
                "or give another --workspace"
            ) from None
        lock.seek(0)
        lock.truncate()
        lock.write(f"process {os.getpid()}, started {time.strftime('%Y-%m-%d %H:%M:%S')}")
        lock.flush()
        try:
            yield
        finally:
            lock.seek(0)
            lock.truncate()


class FederationFailed(UserError, RuntimeError):
    """A simulated federation that ended without a result; the message names the reason and where the logs are."""


def _failure_reason(server_log: Path) -> str | None:
    """The reason the controller gave for ending the job (its last such line in the server log)."""
    if not server_log.is_file():
        return None
    lines = [line for line in server_log.read_text(errors="replace").splitlines() if JOB_FAILED in line]
    return lines[-1].split(JOB_FAILED, 1)[1].strip() if lines else None


def _move_aside(folder: Path) -> Path | None:
    """An earlier run's workspace is kept, renamed ``<name>.earlier-<its time>`` (FLARE's simulator would write
    over it), or ``<name>.incomplete-<its time>`` when that run did not end with its results (stopped or failed: its
    model files are not results)."""
    if not folder.exists():
        return None
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(folder.stat().st_mtime))
    kind = "earlier" if (folder / COMPLETED_FILE).is_file() else "incomplete"
    target, copy = folder.with_name(f"{folder.name}.{kind}-{stamp}"), 1
    while target.exists():
        copy += 1
        target = folder.with_name(f"{folder.name}.{kind}-{stamp}-{copy}")
    folder.rename(target)
    return target
