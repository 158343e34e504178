"""End to end through NVIDIA FLARE's simulator: a hostile site (its client script wrapped by
``benchmarks/hostile_site.py``) sends negative running variances every round, with FLARE's site-to-site evaluation at
the end; and a job whose initial model cannot be used. Its own module, so that its job is made beside
``test_flare_e2e``'s."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.flare.audit import read_audit
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.recipe import nih_chexpert_recipe
from surgical_aggregation.flare.simulation import FederationFailed, simulate
from surgical_aggregation.images.modality import MODALITY as IMAGES
from surgical_aggregation.training.checkpoint import load_checkpoint, probe_outputs, save_checkpoint
from test_flare_e2e import SITES, _app, _run_simulator

from helpers import built_once, load_benchmark, tiny_recipe

pytestmark = pytest.mark.slow


# --- a hostile site, and a model that cannot be used ---------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    """One tiny job for several tests: site-chexpert sends four negative running variances with every result (before
    the server checked BatchNorm statistics, every output of the global model became NaN and the simulator still
    exited 0); FLARE's evaluation of the sites' models on each other's data runs at the end."""

    def build(root: Path) -> tuple[int, str, Path]:
        recipe = tiny_recipe(
            nih_chexpert_recipe, root / "cache", rounds=1, site_to_site_evaluation=True, controller={"min_clients": 1}
        )
        job = load_benchmark("hostile_site").write_hostile_job(recipe, root / "job", "negative_running_var")
        code, output = _run_simulator(job, root / "ws", root / "cache", "-t", "2")
        return code, output, root / "ws"

    return built_once(tmp_path_factory, "e2e-hostile-run", build)


def test_a_site_sending_negative_running_variances_is_rejected_and_the_published_model_is_usable(hostile_run):
    code, output, workspace = hostile_run
    assert code == 0, output[-3000:]
    server = workspace / "server" / "simulate_job" / "app_server"
    history = json.loads((server / "round_history.json").read_text())
    for entry in history[1:]:
        assert entry["aggregation"]["accepted"] == ["site-nih"]
        assert "running_var' has 4 value(s) at or below 0" in entry["aggregation"]["rejected"]["site-chexpert"]
    published = load_checkpoint(_app(workspace, "site-nih") / PUBLISHED_MODEL_FILE)
    assert all(bool(torch.isfinite(value.double()).all()) for value in published.state.values())
    outputs = probe_outputs(published.architecture, published.preprocessing)(published.state, published.class_names)
    assert outputs.shape == (2, 20) and np.isfinite(outputs).all()
    site_log = (workspace / "site-chexpert" / "log.txt").read_text()
    assert "round 0: the server did NOT aggregate this site's result (rejected): " in site_log


def test_site_to_site_evaluation_results_are_in_the_results_file_one_exchange_file_per_model(hostile_run):
    _, _, workspace = hostile_run
    cross = json.loads(
        (workspace / "server" / "simulate_job" / "cross_site_val" / "cross_val_results.json").read_text()
    )
    for site in SITES:
        owners = set(cross[site])
        assert owners == {"SRV_FL_global_model.pt", "SRV_best_FL_global_model.pt", "site-nih", "site-chexpert"}
        # not written over each other (site-chexpert's own model is not the global one: its results were rejected)
        assert cross[site]["site-chexpert"] != cross[site]["SRV_best_FL_global_model.pt"]
        received = [
            r for r in read_audit(_app(workspace, site)) if r["task"] == "validate" and r["direction"] == "received"
        ]
        files = [record["tensors"] for record in received]
        # the last global model (and the best, when it is another) and both sites' models, each in its own file
        assert len(received) >= 3 and len(set(files)) == len(files)
        assert all((_app(workspace, site) / name).is_file() for name in files)


def test_a_job_whose_global_model_cannot_be_used_fails_in_one_line(tmp_path):
    """Started from a model with a NaN: the job fails before any site trains, with one line naming the reason (the
    simulate command prints it as "error: ..." and exits 2), never exit code 0."""
    preprocessing = {"image_size": 32, "in_channels": 1, "imagenet_normalize": True}
    classes = list(NIH_LABELS)
    state = IMAGES.build_model(classes, preprocessing).state_dict()
    state["features.conv0.weight"][0, 0, 0, 0] = float("nan")
    initial = save_checkpoint(
        tmp_path / "earlier.pt", state, classes, architecture="densenet121", preprocessing=preprocessing
    )
    recipe = tiny_recipe(nih_chexpert_recipe, tmp_path / "cache", rounds=1, initial_model=str(initial))
    with pytest.raises(FederationFailed) as failed:
        simulate(recipe, tmp_path / "ws", log_file=tmp_path / "simulator.log")
    message = str(failed.value)
    assert message.startswith(
        "the federation 'nih_chexpert' failed: the global model this job starts from (before training) cannot be "
        "used: 'features.conv0.weight' has 1 non-finite value(s) (NaN/Inf) (server log: "
    )
    assert "\n" not in message
    server = tmp_path / "ws" / "nih_chexpert" / "server"
    assert not (server / "simulate_job" / "app_server" / "best_FL_global_model.pt").exists()
    assert "Round 0 started" not in (server / "log.txt").read_text()  # no site was sent the model
