"""The README followed top to bottom on one machine: every step that writes results, in the README's order and into
the README's own folders (each ``/tmp/...`` folder it names moved under the test's folder), with the sites shrunk;
no file an earlier step wrote is lost or changed by a later one (FLARE's simulator empties the workspace it is given).
System tier: three federations through FLARE, a few minutes."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from surgical_aggregation.flare.protocol import NIH_CHEXPERT
from surgical_aggregation.flare.recipe import BUNDLE_RECIPES, write_job
from surgical_aggregation.training.profiles import SCRATCH

from helpers import tiny_recipe, tiny_sites

pytestmark = [pytest.mark.slow, pytest.mark.system]

README = Path(__file__).resolve().parents[1] / "README.md"
# the README's steps that write results, in its order: (what the line starts with, the job it runs)
STEP = re.compile(
    r"(surgical-aggregation simulate(?: --name (?P<name>\w+))? --workspace (?P<workspace>/tmp/[\w-]+)"
    r"|nvflare simulator jobs/(?P<job>\w+) -w (?P<flare>/tmp/[\w-]+))"
)


def readme_steps() -> list[tuple[str, str, str]]:
    """(kind, job, folder) of each step that writes results, in the README's order: ``simulate`` (this bundle's
    command) or ``flare`` (FLARE's own simulator)."""
    steps = []
    for match in STEP.finditer(README.read_text()):
        if match["flare"]:
            steps.append(("flare", match["job"], match["flare"]))
        else:
            steps.append(("simulate", match["name"] or "nih_chexpert", match["workspace"]))
    return steps


def _files(folder: Path) -> dict[str, str]:
    return {
        str(path.relative_to(folder)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in folder.rglob("*")
        if path.is_file()
    }


def test_the_readme_shows_the_steps_this_test_runs():
    kinds = [(kind, job) for kind, job, _ in readme_steps()]
    assert ("simulate", "nih_chexpert") in kinds and ("flare", "nih_chexpert") in kinds
    assert ("simulate", "cxr_consortium") in kinds


def test_following_the_readme_top_to_bottom_loses_no_file_of_an_earlier_step(tmp_path):
    root = tmp_path / "tmp"  # stands for /tmp
    cache = tmp_path / "cache"
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "SURGICAL_AGGREGATION_CACHE": str(cache), "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    kept: dict[str, str] = {}  # every file an earlier step wrote -> its digest
    for number, (kind, job, folder) in enumerate(readme_steps()):
        workspace = root / Path(folder).relative_to("/tmp")
        if kind == "simulate":
            configs = []
            start = {"start": SCRATCH} if job == NIH_CHEXPERT else {}  # the stand-in: a DenseNet121, minutes to build
            for site, config in tiny_sites(BUNDLE_RECIPES[job](**start).site_configs, cache).items():
                path = tmp_path / "configs" / f"{number}-{site}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(config))
                configs += ["--site-config", f"{site}={path}"]
            command = [str(bin_dir / "surgical-aggregation"), "simulate", "--name", job, "--workspace", str(workspace)]
            command += configs + [f"--{name}={value}" for name, value in start.items()]
        else:
            folder_of_job = write_job(tiny_recipe(BUNDLE_RECIPES[job], cache, rounds=1), tmp_path / f"job-{number}")
            command = [str(bin_dir / "nvflare"), "simulator", str(folder_of_job), "-w", str(workspace), "-t", "2"]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1200)
        assert result.returncode == 0, (command, (result.stdout + result.stderr)[-4000:])
        now = _files(root)
        lost = [path for path in kept if path not in now]
        changed = [path for path in kept if path in now and now[path] != kept[path]]
        assert not lost and not changed, (kind, job, folder, lost[:5], changed[:5])
        kept = now
