"""POC mode: rehearse a deployment on this machine with FLARE's own commands, fully isolated.

One folder (default ``poc/workspace``) holds everything: the POC workspace
(``NVFLARE_POC_WORKSPACE``), a private config home (``HOME``, where ``nvflare`` keeps
``~/.nvflare/config.conf``), the generated ``project.yml`` (the job's site names, a free port,
the deployment's roles) and ``processes.json``. ``start`` runs ``nvflare poc start`` in a new
session and records that session's process group and the participants' pids; ``stop`` asks
FLARE to shut down, then ends every recorded process by its id. Another POC of the user's
(``~/.nvflare``, the default workspace, port 8002) is never touched.

Steps: ``prepare`` → ``start`` → ``submit`` (``nvflare job submit``, then ``job wait`` and
``job download``) → ``stop`` → ``clean``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from ..core.errors import UserError
from ..data.storage import CACHE_ENV, default_cache_root
from ..training.parallel import process_alive
from .deploy import SERVER_HEARTBEAT_TIMEOUT, set_heartbeat_timeout, write_local_folder
from .job_folder import job_sites
from .protocol import CODE_DELIVERIES
from .simulation import THREADS_VARIABLE, cores_per_process

log = logging.getLogger(__name__)

PROJECT_NAME = "surgical_aggregation_poc"
MASTER_TEMPLATE = "master_template.yml"
SERVER_NAME = "server"
# One user per role of the real deployment (provisioning/project.yml), so that rights can be rehearsed.
USERS = {
    "project_admin": "admin@poc.example",
    "lead": "lead@poc.example",
    "org_admin": "it@poc.example",
    "member": "member@poc.example",
}
COMPLETED = "FINISHED:COMPLETED"
_JOB_ID = re.compile(r"job_id:\s*([0-9a-fA-F-]{36})")
# ``nvflare job wait`` says "status: COMPLETED (FINISHED:COMPLETED)" or "reached terminal state FINISHED_EXCEPTION."
_FINAL_STATE = re.compile(r"status: \S+ \((\S+)\)|terminal state (\S+?)\.?$", re.MULTILINE)


class PocError(UserError, RuntimeError):
    """A POC step failed; the message carries FLARE's own output."""


class SubmissionRefused(PocError):
    """The server refused a job (e.g. the submitter lacks the right)."""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("localhost", 0))
        return probe.getsockname()[1]


def poc_project(sites: list[str], port: int) -> dict:
    """The POC's project.yml: loopback server on ``port``, the job's sites, one user per role."""
    participants = [
        {"name": SERVER_NAME, "type": "server", "org": "poc", "default_host": "localhost", "fed_learn_port": port}
    ]
    participants += [{"name": user, "type": "admin", "org": "poc", "role": role} for role, user in USERS.items()]
    participants += [{"name": site, "type": "client", "org": "poc"} for site in sites]
    return {
        "api_version": 3,
        "name": PROJECT_NAME,
        "description": "surgical aggregation POC",
        "participants": participants,
        "builders": [
            {"path": "nvflare.lighter.impl.workspace.WorkspaceBuilder", "args": {"template_file": MASTER_TEMPLATE}},
            {"path": "nvflare.lighter.impl.static_file.StaticFileBuilder", "args": {"config_folder": "config"}},
            {"path": "nvflare.lighter.impl.cert.CertBuilder"},
            {"path": "nvflare.lighter.impl.signature.SignatureBuilder"},
        ],
    }


@dataclass(frozen=True)
class JobOutcome:
    job_id: str
    state: str  # FLARE's final status, e.g. FINISHED:COMPLETED
    downloaded: Path  # <out>/<job id>: the job's result (workspace/app_server/ when it ran)

    @property
    def completed(self) -> bool:
        return self.state == COMPLETED


@dataclass
class PocWorkspace:
    """An isolated POC under ``root``."""

    root: Path

    def __post_init__(self) -> None:
        self.root = Path(self.root).resolve()

    @property
    def poc_dir(self) -> Path:
        return self.root / "poc"

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def processes_file(self) -> Path:
        return self.root / "processes.json"

    @property
    def prod_dir(self) -> Path:
        return self.poc_dir / PROJECT_NAME / "prod_00"

    def kit(self, participant: str) -> Path:
        return self.prod_dir / participant

    def env(self) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        return {
            **os.environ,
            "HOME": str(self.home),
            # the user's cache, not one under the private HOME that stop --clean deletes: a stand-in at an image
            # size the bundle does not ship takes 40 minutes or more to build on a CPU
            CACHE_ENV: str(default_cache_root()),
            "NVFLARE_POC_WORKSPACE": str(self.poc_dir),
            "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        }

    def nvflare(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        command = [str(Path(sys.executable).parent / "nvflare"), *args]
        log.info("$ nvflare %s", " ".join(args))
        return subprocess.run(
            command, env=self.env(), cwd=self.root, capture_output=True, text=True, timeout=timeout, check=False
        )

    def _checked(self, *args: str, timeout: float = 300) -> str:
        result = self.nvflare(*args, timeout=timeout)
        output = result.stdout + result.stderr
        if result.returncode != 0:
            raise PocError(f"nvflare {' '.join(args)} failed (exit {result.returncode}):\n{output.strip()}")
        return output

    # --- steps ---------------------------------------------------------------------------------

    def prepare(
        self,
        job_folder: str | Path,
        code: str = "byoc",
        port: int | None = None,
        heartbeat_timeout: int = SERVER_HEARTBEAT_TIMEOUT,
    ) -> list[str]:
        """A fresh POC for the job's sites (replacing this workspace's previous one), its server set up as the
        provisioning builder sets up a real one. Returns the sites."""
        if code not in CODE_DELIVERIES:
            raise ValueError(f"code must be one of {CODE_DELIVERIES}, got {code!r}")
        if self.processes_file.exists():
            raise PocError(f"{self.root}: a POC started here is still recorded as running; stop it first")
        sites = job_sites(job_folder)
        self._remove_own_folder()
        self.home.mkdir(parents=True)
        project = self.root / "project.yml"
        project.write_text(yaml.safe_dump(poc_project(sites, port or free_port()), sort_keys=False))
        self._checked("poc", "prepare", "-i", str(project), "--force")
        # after FLARE's own POC set-up, which rewrites the server's resources.json
        write_local_folder(self.kit(SERVER_NAME) / "local", "server", code)
        set_heartbeat_timeout(self.kit(SERVER_NAME) / "startup", heartbeat_timeout)
        for site in sites:  # each site's config template from the job it will run
            write_local_folder(self.kit(site) / "local", "client", code, job=job_folder, site=site)
        log.info("POC for %s (%s) prepared in %s", ", ".join(sites), code, self.poc_dir)
        return sites

    def start(self, timeout: float = 180) -> dict:
        """Start the server and the sites, each site's torch on its share of the cores (``OMP_NUM_THREADS``, unless
        set already; a site config's ``cpu_threads`` decides in the end); record their process group and pids."""
        if not self.prod_dir.is_dir():
            raise PocError(f"{self.root}: no prepared POC; run prepare first")
        if self.processes_file.exists():
            raise PocError(f"{self.root}: already started (see {self.processes_file}); stop it first")
        sites = [name for name in self._participants() if name != SERVER_NAME]
        env = {THREADS_VARIABLE: str(cores_per_process(len(sites))), **self.env()}  # as the simulator shares cores
        launcher = subprocess.Popen(
            [str(Path(sys.executable).parent / "nvflare"), "poc", "start"],
            env=env,
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,  # everything it launches shares this process group
        )
        record = {"process_group": launcher.pid, "pids": {}}
        self.processes_file.write_text(json.dumps(record, indent=2))  # written first: stop() works even if start fails
        try:
            output, _ = launcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as error:
            raise PocError(f"nvflare poc start did not return within {timeout:.0f} s") from error
        if launcher.returncode != 0:
            raise PocError(f"nvflare poc start failed (exit {launcher.returncode}):\n{output.strip()}")
        for participant in self._participants():
            for pid_file in ("pid.fl", "daemon_pid.fl"):
                path = self.kit(participant) / pid_file
                if path.is_file():
                    record["pids"][f"{participant}/{pid_file}"] = int(path.read_text().strip())
        self.processes_file.write_text(json.dumps(record, indent=2))
        log.info("POC started: process group %d, %d processes", record["process_group"], len(record["pids"]))
        return record

    def submit(self, job_folder: str | Path, user: str | None = None) -> str:
        """``nvflare job submit`` as ``user`` (default: the project admin). Returns the job id."""
        args = ["job", "submit", "-j", str(Path(job_folder).resolve())]
        if user is not None:
            args += ["--startup-kit", str(self.kit(user))]
        result = self.nvflare(*args)
        output = result.stdout + result.stderr
        match = _JOB_ID.search(output)
        if result.returncode != 0 or match is None:
            raise SubmissionRefused(f"job {job_folder} not accepted (exit {result.returncode}):\n{output.strip()}")
        log.info("submitted %s as %s: job %s", job_folder, user or USERS["project_admin"], match.group(1))
        return match.group(1)

    def wait(self, job_id: str, timeout: float = 1800) -> str:
        """Wait for the job to end; returns its final status, e.g. ``FINISHED:COMPLETED``."""
        result = self.nvflare("job", "wait", job_id, "--timeout", str(int(timeout)), timeout=timeout + 60)
        output = result.stdout + result.stderr
        states = [status or terminal for status, terminal in _FINAL_STATE.findall(output)]
        if not states:
            raise PocError(f"nvflare job wait {job_id}: no final state (exit {result.returncode}):\n{output.strip()}")
        state = states[-1].replace("FINISHED_", "FINISHED:")
        log.info("job %s: %s", job_id, state)
        return state

    def download(self, job_id: str, out: str | Path) -> Path:
        """Download the job (its result: ``workspace/app_server``, when it ran). Returns ``out/<job id>``."""
        out = Path(out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        self._checked("job", "download", job_id, "-o", str(out))
        log.info("job %s downloaded to %s", job_id, out / job_id)
        return out / job_id

    def stop(self, grace: float = 20) -> list[int]:
        """Shut the POC down and end every process ``start`` recorded. Returns the pids it had to kill."""
        if not self.processes_file.exists():
            log.info("%s: nothing recorded as running", self.root)
            return []
        record = json.loads(self.processes_file.read_text())
        result = self.nvflare("poc", "stop", timeout=120)
        if result.returncode != 0:
            log.warning("nvflare poc stop failed (exit %d); ending the processes by id", result.returncode)
        pids = sorted(set(record["pids"].values()) | set(self._group_members(record["process_group"])))
        deadline = time.monotonic() + grace
        while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.5)
        killed = [pid for pid in pids if process_alive(pid)]
        for pid in killed:
            log.warning("process %d still running after shutdown; killing it", pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(record["process_group"], signal.SIGKILL)
        deadline = time.monotonic() + grace
        while self._group_members(record["process_group"]) and time.monotonic() < deadline:
            time.sleep(0.2)
        self.processes_file.unlink()
        log.info("POC stopped")
        return killed

    def submit_and_collect(
        self, job_folder: str | Path, user: str | None, out: str | Path, timeout: float
    ) -> JobOutcome:
        """Submit, wait for the job to end and download it, whatever its final state."""
        job_id = self.submit(job_folder, user)
        state = self.wait(job_id, timeout)
        return JobOutcome(job_id, state, self.download(job_id, out))

    def run(self, job_folder: str | Path, code: str, user: str | None, out: str | Path, timeout: float) -> JobOutcome:
        """prepare, start, submit (wait, download), stop: stopped even on failure; the workspace is deleted
        only when the job completed (kept otherwise, for its logs)."""
        self.prepare(job_folder, code)
        try:
            self.start()
            outcome = self.submit_and_collect(job_folder, user, out, timeout)
        finally:
            self.stop()
        if outcome.completed:
            self.clean()
        return outcome

    def clean(self) -> None:
        """Delete the workspace (refused while a POC started here is recorded as running)."""
        if self.processes_file.exists():
            raise PocError(f"{self.root}: still recorded as running; stop it first")
        self._remove_own_folder()

    # --- helpers -------------------------------------------------------------------------------

    def _remove_own_folder(self) -> None:
        """Delete ``root`` only if it is empty or a POC workspace of this module."""
        if not self.root.exists():
            return
        project = self.root / "project.yml"
        ours = project.is_file() and yaml.safe_load(project.read_text()).get("name") == PROJECT_NAME
        if not ours and any(self.root.iterdir()):
            raise PocError(f"{self.root} is not empty and not a POC workspace of this bundle; choose another folder")
        shutil.rmtree(self.root)

    def _participants(self) -> list[str]:
        project = yaml.safe_load((self.root / "project.yml").read_text())
        return [p["name"] for p in project["participants"] if p["type"] in ("server", "client")]

    @staticmethod
    def _group_members(process_group: int) -> list[int]:
        members = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().split(") ")[-1].split()
            except OSError:
                continue
            if int(fields[2]) == process_group and fields[0] != "Z":  # after "pid (comm) ": state, ppid, pgrp
                members.append(int(stat.parent.name))
        return members
