"""A site's job launcher under which a killed job process costs the federation one site, not the job.

FLARE 2.9's client launcher reports any job process that ends without its return-code file as
``EXECUTION_ERROR`` (``ProcessHandle.poll``); the site's parent turns that into ``EXCEPTION`` for a started
job (``client_executor._wait_child_process_finish``) and the server fails the whole job on it
(``FedServer.process_job_failure``), whatever ``min_clients`` says. A process killed by a signal (an
operator's ``kill``, the out-of-memory killer, a crash) wrote no return code, so this launcher reports it as
``UNKNOWN``, which FLARE does not count as a failure. The server then learns from the site's next heartbeat
that the job is gone there (its dead-job report), deems the site disconnected after its grace period, and
the controller goes on without it (``min_clients`` still decides whether enough sites remain).

Every other ending (a clean exit, FLARE's own error codes, an abort) is reported exactly as FLARE does.
The provisioning builder and the POC set-up put this class in each site's ``local/resources.json`` in place
of FLARE's; the site's Python environment must have the bundle installed (as hospital IT's guide says).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from nvflare.apis.fl_constant import FLContextKey, JobConstants
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_launcher_spec import JobHandleSpec, JobReturnCode
from nvflare.app_common.job_launcher.client_process_launcher import ClientProcessJobLauncher
from nvflare.app_common.job_launcher.process_launcher import ProcessHandle

from ..training.config import SITE_LOCAL_CONFIG
from .simulation import THREADS_VARIABLE

FLARE_CLIENT_LAUNCHER = "nvflare.app_common.job_launcher.client_process_launcher.ClientProcessJobLauncher"
SITE_LAUNCHER = f"{__name__}.SiteJobLauncher"

log = logging.getLogger(__name__)


class LostProcessHandle(JobHandleSpec):
    """FLARE's process handle, except that a death by a signal reads as ``UNKNOWN`` instead of a failure."""

    def __init__(self, handle: ProcessHandle, job_id: str):
        self.handle = handle
        self.job_id = job_id
        self._said = False

    def terminate(self) -> None:
        self.handle.terminate()

    def poll(self) -> int:
        code = self.handle.adapter.poll()
        if code is not None and code < 0:
            if not self._said:
                self._said = True
                log.error(
                    "the job process of job %s ended by signal %d (killed, out of memory or crashed): reported to "
                    "the server as this site leaving the job, not as the job's failure",
                    self.job_id,
                    -code,
                )
            return JobReturnCode.UNKNOWN
        return self.handle.poll()

    def wait(self) -> None:
        self.handle.wait()


def site_cpu_threads(workspace: Path) -> int | None:
    """``cpu_threads`` of the site's own config (``<workspace>/local/surgical_aggregation.json``), if it sets it."""
    path = workspace / "local" / SITE_LOCAL_CONFIG
    try:
        threads = json.loads(path.read_text()).get("cpu_threads")
    except (OSError, ValueError, AttributeError):
        return None  # no config, or one the job will refuse with its own message
    return threads if isinstance(threads, int) and not isinstance(threads, bool) and threads >= 1 else None


class SiteJobLauncher(ClientProcessJobLauncher):
    """FLARE's client process launcher with :class:`LostProcessHandle` around each job process, which starts with
    ``OMP_NUM_THREADS`` at the site config's ``cpu_threads`` when it sets one (torch, BLAS and the data workers then
    keep to the cores hospital IT gave the site)."""

    def launch_job(self, job_meta: dict, fl_ctx: FLContext) -> JobHandleSpec:
        workspace = fl_ctx.get_prop(FLContextKey.WORKSPACE_OBJECT)
        threads = site_cpu_threads(Path(workspace.get_root_dir()) if workspace is not None else Path.cwd())
        before = os.environ.get(THREADS_VARIABLE)
        if threads is not None:
            os.environ[THREADS_VARIABLE] = str(threads)  # FLARE's launcher copies this process's environment
        try:
            handle = super().launch_job(job_meta, fl_ctx)
        finally:
            if threads is not None and before is None:
                os.environ.pop(THREADS_VARIABLE, None)
            elif threads is not None:
                os.environ[THREADS_VARIABLE] = before
        return LostProcessHandle(handle, str(job_meta.get(JobConstants.JOB_ID)))


def with_site_launcher(resources: dict) -> dict:
    """A site's ``resources.json`` with FLARE's client launcher replaced by :class:`SiteJobLauncher`."""
    for component in resources.get("components", []):
        if component.get("path") == FLARE_CLIENT_LAUNCHER:
            component["path"] = SITE_LAUNCHER
    return resources
