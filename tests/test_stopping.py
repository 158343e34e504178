"""Clean stops (stopping): SIGTERM or SIGINT to a long command ends every process it started, says "interrupted" and
exits 128 + the signal; the simulated federation's processes are all gone after a SIGTERM mid-round."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.stopping import CommandInterrupted, stopped_cleanly
from surgical_aggregation.training.profiles import SCRATCH

from helpers import tiny_sites


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_ends_what_the_block_started_and_says_interrupted(signal_number):
    with pytest.raises(CommandInterrupted) as raised, stopped_cleanly():
        started = [subprocess.Popen(["sleep", "60"]), subprocess.Popen(["sh", "-c", "sleep 60 & wait"])]
        time.sleep(0.2)
        os.kill(os.getpid(), signal_number)
        time.sleep(5)  # the handler interrupts this
    assert raised.value.exit_code == 128 + signal_number
    assert f"interrupted ({signal.Signals(signal_number).name}): ended the 3 process(es)" in str(raised.value)
    assert all(process.poll() is not None for process in started)
    assert psutil.Process().children(recursive=True) == []
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are given back


@pytest.mark.slow
def test_sigterm_mid_round_leaves_no_process_of_the_simulated_federation(tmp_path):
    sites = tiny_sites(nih_chexpert_recipe(start=SCRATCH).site_configs, tmp_path / "cache")
    arguments = []
    for name, config in sites.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(config))
        arguments += ["--site-config", f"{name}={tmp_path / f'{name}.json'}"]
    command = [
        sys.executable,
        "-m",
        "surgical_aggregation",
        "simulate",
        "--workspace",
        str(tmp_path / "ws"),
        "--start",
        SCRATCH,
        *arguments,
    ]
    run = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    server_log = tmp_path / "ws" / "nih_chexpert" / "server" / "log.txt"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and "round 1" not in (server_log.read_text() if server_log.exists() else ""):
        assert run.poll() is None, run.stdout.read()[-3000:]
        time.sleep(1)
    started = psutil.Process(run.pid).children(recursive=True)
    assert len(started) >= 3  # FLARE's simulator, its server and site workers
    run.send_signal(signal.SIGTERM)
    output, _ = run.communicate(timeout=120)
    assert run.returncode == 128 + signal.SIGTERM, output[-3000:]
    assert "simulate: interrupted (SIGTERM): ended the" in output and "Traceback" not in output
    assert [process.pid for process in started if process.is_running() and process.status() != "zombie"] == []
    kept = Path(tmp_path / "ws" / "nih_chexpert" / "server" / "simulate_job" / "app_server")
    assert (kept / "FL_global_model.pt").is_file()  # the last saved global model stays on disk
