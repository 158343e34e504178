"""End to end through FLARE's POC mode on loopback, as an operator runs it: an isolated POC with
the job's site names, ``nvflare job submit`` through the admin API, ``job wait``, ``job download``,
then every started process stopped by its id.

One byoc POC runs scenarios 1, 3, 4 and 5 in turn (each recorded for its test), the preinstalled one its own. Both
are the system tier (``pytest -m system``: minutes each, not in CI).

1. byoc (the default): the tiny main job completes and the downloaded result holds the 20-class
   union model; users without the ``submit_job`` right are refused. ``site-nih`` joins as the hospital IT
   guide says: its kit's template (written from the job) filled in with its data folder, ``check-site``
   passed, then the job run with that site config.
2. preinstalled: the sites allow-list the bundle's classes and refuse bring-your-own-code, so the
   byoc job fails to deploy and the same job without ``custom/`` completes (submitted through its
   recipe and FLARE's ``ProdEnv``, the admin API a production system offers).
3. a server crash mid-federation: the server and its job process are killed by id, the daemon brings
   the server back, and the same job submitted again continues from the last completed round.
4. a site goes down mid-federation (its daemon, process and job process killed by id): the server logs it
   out after the heartbeat timeout, the controller stops waiting for it, and the job finishes with the
   other site, in bounded time, with the union model.
5. a site's job process alone is killed mid-federation (the site stays up): the site's launcher reports it
   as the site leaving the job, not as the job's failure, and the job finishes with the other site.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from nvflare.recipe import ProdEnv

from surgical_aggregation.cli import main
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS
from surgical_aggregation.data.storage import CACHE_ENV
from surgical_aggregation.flare.poc import COMPLETED, USERS, PocWorkspace, SubmissionRefused, job_sites
from surgical_aggregation.flare.recipe import nih_chexpert_recipe, write_job
from surgical_aggregation.images.synthetic import generate_nih
from surgical_aggregation.training.checkpoint import load_checkpoint
from surgical_aggregation.training.parallel import process_alive

from helpers import built_once, tiny_recipe

pytestmark = pytest.mark.slow
SITES = ["site-nih", "site-chexpert"]
UNION = set(NIH_LABELS) | set(CHEXPERT_LABELS)


def _job(root: Path, code: str) -> Path:
    execution = "external_process" if code == "preinstalled" else "in_process"
    recipe = tiny_recipe(nih_chexpert_recipe, root / "cache", rounds=1, code=code, client_execution=execution)
    return write_job(recipe, root / f"job-{code}")


def _started(root: Path, code: str, monkeypatch, **prepare) -> tuple[PocWorkspace, dict]:
    monkeypatch.setenv("SURGICAL_AGGREGATION_CACHE", str(root / "cache"))
    poc = PocWorkspace(root / "poc")
    assert poc.prepare(_job(root, "byoc"), code, **prepare) == SITES
    return poc, poc.start()


def _assert_all_stopped(poc: PocWorkspace, record: dict) -> None:
    poc.stop()  # pids it had to kill are logged; what matters is that none survive
    assert len(record["pids"]) == 6  # server and two sites: parent and daemon each
    assert not any(process_alive(pid) for pid in record["pids"].values())
    assert poc._group_members(record["process_group"]) == []
    assert not poc.processes_file.exists()


def test_poc_isolation_and_site_names(tmp_path, monkeypatch):
    assert job_sites(Path(__file__).resolve().parents[1] / "jobs" / "nih_chexpert") == SITES
    poc = PocWorkspace(tmp_path / "poc")
    env = poc.env()
    assert env["HOME"] == str(tmp_path / "poc" / "home") != os.environ.get("HOME")
    assert env["NVFLARE_POC_WORKSPACE"] == str(tmp_path / "poc" / "poc")
    # the bundle's cache is the user's, not one under the private HOME that stop --clean deletes (the stand-in)
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert poc.env()[CACHE_ENV] == str(Path.home() / ".cache" / "surgical_aggregation")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "mine"))
    assert poc.env()[CACHE_ENV] == str(tmp_path / "mine")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("not a POC")
    with pytest.raises(RuntimeError, match="not empty and not a POC workspace"):
        PocWorkspace(tmp_path / "precious").prepare(_job(tmp_path, "byoc"))
    assert (tmp_path / "precious" / "notes.txt").is_file()


def _follow_the_hospital_it_guide(poc: PocWorkspace, job: Path, data: Path) -> Path:
    """provisioning/README.md, "For hospital IT", step 3 and the check: the kit's template, filled in, checked."""
    local = poc.kit("site-nih") / "local"
    config = json.loads((local / "surgical_aggregation.json.template").read_text())
    config["data"]["location"] = str(data)
    (local / "surgical_aggregation.json").write_text(json.dumps(config, indent=2))
    assert main(["check-site", "--job", str(job), "--config", str(local / "surgical_aggregation.json")]) == 0
    return local / "surgical_aggregation.json"


@pytest.mark.system
def test_preinstalled_poc_refuses_byoc_and_runs_the_allow_listed_job(tmp_path, monkeypatch):
    poc, record = _started(tmp_path, "preinstalled", monkeypatch)
    try:
        lead = USERS["lead"]
        refused = poc.submit(tmp_path / "job-byoc", lead)  # accepted for the queue, refused at deployment
        assert poc.wait(refused, timeout=300) != COMPLETED
        server_log = (poc.kit("server") / "log.txt").read_text()
        assert f"Failed to run the Job ({refused})" in server_log and "BYOC not permitted" in server_log
        # the preinstalled job's recipe, submitted through FLARE's ProdEnv (the admin API) with the lead's kit
        recipe = tiny_recipe(
            nih_chexpert_recipe,
            tmp_path / "cache",
            rounds=1,
            code="preinstalled",
            client_execution="external_process",
        )
        job_id = recipe.run(ProdEnv(startup_kit_location=str(poc.kit(lead)), username=lead)).get_job_id()
        assert poc.wait(job_id, timeout=600) == COMPLETED
        result = poc.download(job_id, tmp_path / "downloads") / "workspace"
        model = load_checkpoint(result / "app_server" / "FL_global_model.pt")
        assert set(model.class_names) == UNION
    finally:
        _assert_all_stopped(poc, record)


def _assert_finished_without_site_chexpert(workspace: Path) -> None:
    """Both sites trained round 0, the server dropped site-chexpert, and site-nih finished the 3 rounds alone."""
    assert "site-chexpert is disconnected: no train task for it" in (workspace / "log.txt").read_text()
    history = json.loads((workspace / "app_server" / "round_history.json").read_text())
    assert sorted(history[1]["aggregation"]["accepted"]) == sorted(SITES)
    assert history[-1]["aggregation"]["accepted"] == ["site-nih"]
    model = load_checkpoint(workspace / "app_server" / "FL_global_model.pt")
    assert set(model.class_names) == UNION and model.meta["round"] == 2 and model.meta["trained"]


def _processes(poc: PocWorkspace, participant: str) -> list[int]:
    """A participant's process (pid.fl) and the job processes it launched."""
    main = int((poc.kit(participant) / "pid.fl").read_text())
    children = [int(stat.parent.name) for stat in Path("/proc").glob("[0-9]*/stat") if _parent(stat) == main]
    return [main, *children]


def _wait_for_round_0(history: Path) -> None:
    deadline = time.monotonic() + 300
    while not (history.is_file() and any("aggregation" in e for e in json.loads(history.read_text())[1:])):
        assert time.monotonic() < deadline, "round 0 never finished"
        time.sleep(0.5)


def _pid_file(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return -1


def _parent(stat: Path) -> int:
    try:
        return int(stat.read_text().split(") ")[-1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


# --- one byoc POC for four scenarios, in this order (the last takes a site down for good) --------------------------


def _byoc_end_to_end(poc: PocWorkspace, root: Path) -> dict:
    job = root / "job-byoc"
    data = generate_nih(root / "hospital-nih", n_patients=30, image_size=32, label_source="builtin").root
    site_config = _follow_the_hospital_it_guide(poc, job, data)
    refusals = {}
    for role in ("org_admin", "member"):  # FLARE's default authorization: no submit_job right
        try:
            poc.submit(job, USERS[role])
        except SubmissionRefused as refused:
            refusals[role] = str(refused)
    job_id = poc.submit(job)  # the project admin
    state = poc.wait(job_id, timeout=600)
    return {
        "state": state,
        "refusals": refusals,
        "result": poc.download(job_id, root / "downloads") / "workspace",
        "site_log": (poc.kit("site-nih") / job_id / "log.txt").read_text(),
        "site_config": site_config,
        "data": data,
    }


def _job_process_killed(poc: PocWorkspace, root: Path) -> dict:
    recipe = tiny_recipe(nih_chexpert_recipe, root / "cache", rounds=3, controller={"min_clients": 1})
    job_id = poc.submit(write_job(recipe, root / "job-process-killed"))
    _wait_for_round_0(poc.kit("server") / job_id / "app_server" / "round_history.json")
    site, *job_processes = _processes(poc, "site-chexpert")
    killed = time.monotonic()
    for pid in job_processes:  # the job process only: the site itself stays up
        os.kill(pid, signal.SIGKILL)
    state = poc.wait(job_id, timeout=600)  # FLARE's own launcher fails the job here
    return {
        "job_id": job_id,
        "job_processes": job_processes,
        "state": state,
        "seconds": time.monotonic() - killed,
        "site_alive": process_alive(site),
        "site_log": (poc.kit("site-chexpert") / "log.txt").read_text(),
        "workspace": poc.download(job_id, root / "downloads") / "workspace",
    }


def _server_crash(poc: PocWorkspace, root: Path) -> dict:
    job = write_job(tiny_recipe(nih_chexpert_recipe, root / "cache", rounds=4), root / "job-crash")
    crashed = poc.submit(job)
    _wait_for_round_0(poc.kit("server") / crashed / "app_server" / "round_history.json")
    server = _processes(poc, "server")
    for pid in server:  # the crash: the server and its job process die mid-federation
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 120  # the server's daemon (startup/sub_start.sh) brings it back
    while (restarted := _pid_file(poc.kit("server") / "pid.fl")) in server or not process_alive(restarted):
        if time.monotonic() > deadline:
            return {"came_back": False}
        time.sleep(1)
    resumed = poc.submit(job)  # the same job again: it continues the federation
    state = poc.wait(resumed, timeout=600)
    return {
        "came_back": True,
        "crashed": crashed,
        "state": state,
        "workspace": poc.download(resumed, root / "downloads") / "workspace",
    }


def _site_down(poc: PocWorkspace, root: Path) -> dict:
    recipe = tiny_recipe(nih_chexpert_recipe, root / "cache", rounds=3, controller={"min_clients": 1})
    job_id = poc.submit(write_job(recipe, root / "job-site-down"))
    _wait_for_round_0(poc.kit("server") / job_id / "app_server" / "round_history.json")
    daemon = int((poc.kit("site-chexpert") / "daemon_pid.fl").read_text())
    site = _processes(poc, "site-chexpert")
    killed = time.monotonic()
    for pid in [daemon, *site]:  # the daemon first, so nothing restarts the site
        os.kill(pid, signal.SIGKILL)
    state = poc.wait(job_id, timeout=600)
    return {
        "state": state,
        "seconds": time.monotonic() - killed,
        "workspace": poc.download(job_id, root / "downloads") / "workspace",
    }


SCENARIOS = {
    "end to end": _byoc_end_to_end,
    "job process killed": _job_process_killed,
    "server crash": _server_crash,
    "site down": _site_down,
}
# the failure scenarios' tests (each picks its scenario; the end to end scenario runs whenever the POC does)
FAILURE_TESTS = {
    "job process killed": "test_a_site_whose_job_process_is_killed_is_dropped_and_the_others_finish",
    "server crash": "test_a_server_crash_costs_at_most_the_round_in_progress",
    "site down": "test_a_site_that_goes_down_is_dropped_and_the_others_finish",
}


@pytest.fixture(scope="module")
def byoc_poc(tmp_path_factory, request):
    """One byoc POC (a short heartbeat timeout and grace period keep the site-down scenario to a couple of minutes;
    the defaults are SERVER_HEARTBEAT_TIMEOUT, 120 s, and FLARE's 60 s grace) runs the scenarios in turn, the failure
    scenarios only when their tests were selected (``-m system`` or all); each records what its test checks, or the
    error that ended it."""
    selected = {item.name for item in request.session.items}
    scenarios = {
        name: scenario
        for name, scenario in SCENARIOS.items()
        if name not in FAILURE_TESTS or FAILURE_TESTS[name] in selected
    }

    def build(root: Path) -> dict:
        saved = {
            name: os.environ.get(name) for name in ("SURGICAL_AGGREGATION_CACHE", "NVFLARE_DEAD_CLIENT_GRACE_PERIOD")
        }
        os.environ["SURGICAL_AGGREGATION_CACHE"] = str(root / "cache")
        os.environ["NVFLARE_DEAD_CLIENT_GRACE_PERIOD"] = "5"
        outcomes: dict = {}
        try:
            poc = PocWorkspace(root / "poc")
            assert poc.prepare(_job(root, "byoc"), "byoc", heartbeat_timeout=30) == SITES
            record = poc.start()
            try:
                for name, scenario in scenarios.items():
                    try:
                        outcomes[name] = scenario(poc, root)
                    except Exception as error:  # the scenario's test fails with it; the others still run
                        outcomes[name] = {"error": f"{type(error).__name__}: {error}"}
            finally:
                poc.stop()  # pids it had to kill are logged; what matters is that none survive
                outcomes["stopped"] = {
                    "pids": dict(record["pids"]),
                    "alive": [pid for pid in record["pids"].values() if process_alive(pid)],
                    "group": poc._group_members(record["process_group"]),
                    "processes_file": poc.processes_file.exists(),
                }
            poc.clean()
            outcomes["cleaned"] = not poc.root.exists()
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        return outcomes

    return built_once(tmp_path_factory, "poc-byoc-" + "-".join(sorted(scenarios)).replace(" ", "_"), build)


def _outcome(byoc_poc: dict, name: str) -> dict:
    outcome = byoc_poc[name]
    assert "error" not in outcome, outcome.get("error")
    return outcome


@pytest.mark.system
def test_byoc_poc_end_to_end(byoc_poc):
    outcome = _outcome(byoc_poc, "end to end")
    for role in ("org_admin", "member"):
        assert f"'{USERS[role]}' is not authorized for 'submit_job'" in outcome["refusals"][role]
    assert outcome["state"] == COMPLETED
    result = outcome["result"]
    model = load_checkpoint(result / "app_server" / "FL_global_model.pt")
    assert len(model.class_names) == 20 and set(model.class_names) == UNION
    assert (result / "app_server" / "best_FL_global_model.pt").is_file()
    cross = json.loads((result / "cross_site_val" / "cross_val_results.json").read_text())
    assert set(cross) == set(SITES)
    history = json.loads((result / "app_server" / "round_history.json").read_text())
    assert history[1]["aggregation"]["accepted"] == SITES[::-1]  # site-nih passed the handshake and trained
    assert f"site-nih: site config {outcome['site_config']} (the site's local folder)" in outcome["site_log"]
    assert f"nih data at {outcome['data']}" in outcome["site_log"]


@pytest.mark.system
def test_a_site_whose_job_process_is_killed_is_dropped_and_the_others_finish(byoc_poc):
    outcome = _outcome(byoc_poc, "job process killed")
    assert outcome["job_processes"], "site-chexpert runs no job process"
    assert outcome["state"] == COMPLETED
    assert outcome["seconds"] < 240
    assert outcome["site_alive"]
    assert f"the job process of job {outcome['job_id']} ended by signal 9" in outcome["site_log"]
    _assert_finished_without_site_chexpert(outcome["workspace"])


@pytest.mark.system
def test_a_server_crash_costs_at_most_the_round_in_progress(byoc_poc):
    outcome = _outcome(byoc_poc, "server crash")
    assert outcome["came_back"], "the server did not come back"
    assert outcome["state"] == COMPLETED
    workspace = outcome["workspace"]
    assert "resuming the federation saved by job " + outcome["crashed"] in (workspace / "log.txt").read_text()
    result = workspace / "app_server"
    rounds = [entry["round"] for entry in json.loads((result / "round_history.json").read_text())]
    assert rounds == [-1, 0, 1, 2, 3]  # each global model exactly once
    model = load_checkpoint(result / "FL_global_model.pt")
    assert set(model.class_names) == UNION and model.meta["round"] == 3
    assert (result / "best_FL_global_model.pt").is_file()


@pytest.mark.system
def test_a_site_that_goes_down_is_dropped_and_the_others_finish(byoc_poc):
    outcome = _outcome(byoc_poc, "site down")
    assert outcome["state"] == COMPLETED
    assert outcome["seconds"] < 240  # not the 900 s train timeout per round
    _assert_finished_without_site_chexpert(outcome["workspace"])


@pytest.mark.system
def test_every_process_the_poc_started_is_stopped_and_the_workspace_cleaned(byoc_poc):
    stopped = byoc_poc["stopped"]
    assert len(stopped["pids"]) == 6  # server and two sites: parent and daemon each
    assert stopped["alive"] == [] and stopped["group"] == [] and not stopped["processes_file"]
    assert byoc_poc["cleaned"]
