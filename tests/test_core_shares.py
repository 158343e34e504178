"""Sites beside each other keep to their cores outside the simulator too: the POC starts its sites with their share
(``OMP_NUM_THREADS``), and a provisioned site's job process starts with its config's ``cpu_threads``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from surgical_aggregation.flare import launcher as launcher_module
from surgical_aggregation.flare import poc as poc_module
from surgical_aggregation.flare.launcher import SiteJobLauncher, site_cpu_threads
from surgical_aggregation.flare.simulation import THREADS_VARIABLE


class _Workspace:
    def __init__(self, root: Path) -> None:
        self.root = root

    def get_root_dir(self) -> str:
        return str(self.root)


class _Context:
    def __init__(self, root: Path) -> None:
        self.workspace = _Workspace(root)

    def get_prop(self, key, default=None):
        return self.workspace if key == launcher_module.FLContextKey.WORKSPACE_OBJECT else default


def test_a_sites_job_process_starts_with_its_configs_cpu_threads(tmp_path, monkeypatch):
    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "surgical_aggregation.json").write_text(json.dumps({"cpu_threads": 3}))
    seen = []
    monkeypatch.setattr(
        launcher_module.ClientProcessJobLauncher, "launch_job",
        lambda self, meta, ctx: seen.append(os.environ.get(THREADS_VARIABLE)) or object(),
    )  # fmt: skip
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    SiteJobLauncher().launch_job({"job_id": "j1"}, _Context(tmp_path))
    assert seen == ["3"] and THREADS_VARIABLE not in os.environ  # set for the job process, then given back
    (tmp_path / "local" / "surgical_aggregation.json").write_text(json.dumps({"cpu_threads": None}))
    monkeypatch.setenv(THREADS_VARIABLE, "1")
    SiteJobLauncher().launch_job({"job_id": "j2"}, _Context(tmp_path))
    assert seen == ["3", "1"]  # no cpu_threads: the environment's value stays
    assert site_cpu_threads(tmp_path / "nowhere") is None


def test_the_poc_starts_each_site_on_its_share_of_the_cores(tmp_path, monkeypatch):
    poc = poc_module.PocWorkspace(tmp_path)
    poc.prod_dir.mkdir(parents=True)
    participants = [{"name": name, "type": kind} for name, kind in
                    (("server", "server"), ("site-a", "client"), ("site-b", "client"), ("admin", "admin"))]  # fmt: skip
    (tmp_path / "project.yml").write_text(yaml.safe_dump({"participants": participants}))
    started = {}

    def popen(command, env, **options):
        started["env"] = env
        raise RuntimeError("not started")

    monkeypatch.setattr(poc_module.subprocess, "Popen", popen)
    monkeypatch.setattr(poc_module.os, "cpu_count", lambda: 8)
    monkeypatch.delenv(THREADS_VARIABLE, raising=False)
    with pytest.raises(RuntimeError, match="not started"):
        poc.start()
    assert started["env"][THREADS_VARIABLE] == "4"  # 8 cores, 2 sites
