"""End to end through NVIDIA FLARE's simulator, checked from the saved artefacts.

1. The main job's shape (NIH-style + CheXpert-style site, 20-class union), tiny images on the smoke network, 2
   rounds, run as the README runs it (``nvflare simulator <job> -w <ws> -t 2``), with cross-site evaluation.
2. Two sites with the same class set, one round: the global model equals FLARE's own FedAvg
   aggregation (``WeightedAggregationHelper``) of the same client updates.
3. A new hospital, with a finding of its own (a CSV's "Tuberculosis" column), joins a federation that continues
   from its best model.
4. A site whose images are truncated (``on_unreadable: error``) fails every round: the job that never
   made progress exits non-zero, labels no model best and names the sites and reasons.
5. The consortium job: seven datasets, each with its own label scheme; the union of their real label files.
6. The same seed gives the same round history and model on a CPU (the main run's against a run through the recipe
   API), and the in-process federation the same models.
(A hostile site and a model that cannot be used: ``test_flare_hostile_e2e``.)
"""

from __future__ import annotations

import inspect
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from nvflare.app_common.aggregators.weighted_aggregation_helper import WeightedAggregationHelper

from surgical_aggregation.core.head import NAMED_HEAD, extend_head
from surgical_aggregation.core.judging import harm_of
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS
from surgical_aggregation.evaluation.inference import score
from surgical_aggregation.experiments.federation import federate
from surgical_aggregation.flare.audit import AUDIT_FILE, EXCHANGES_DIR, exchange_file_name, read_audit
from surgical_aggregation.flare.client import PUBLISHED_MODEL_FILE
from surgical_aggregation.flare.controller import SurgicalAggregatorShareable
from surgical_aggregation.flare.recipe import (
    CONSORTIUM_PATIENTS,
    TASK_REQUEST_INTERVAL,
    SurgicalAggregationRecipe,
    cxr_consortium_recipe,
    nih_chexpert_recipe,
    write_job,
)
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.names import DENSENET121, SMOKE_DENSENET
from surgical_aggregation.images.synthetic import GENERATED, generate_nih
from surgical_aggregation.images.synthetic_pixels import render_image
from surgical_aggregation.training.checkpoint import (
    initial_global_state,
    load_checkpoint,
)
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.profiles import SCRATCH
from surgical_aggregation.training.site_data import prepare_site_data
from surgical_aggregation.training.trainer import SiteTrainer

from helpers import (
    MAIN_RUN,
    SNIPPET_RUN,
    build_main_run,
    build_snippet_run,
    built_once,
    tiny_recipe,
    tiny_sites,
    union_of_the_seven_label_files,
    write_dicom,
)

pytestmark = pytest.mark.slow
TOL = 1e-6
W, B = NAMED_HEAD.keys
SMOKE_FEATURES = NamedDenseNet(["x"], network=SMOKE_DENSENET).class_layers.out.in_features
SITES = {"site-nih": list(NIH_LABELS), "site-chexpert": list(CHEXPERT_LABELS)}


def _run_simulator(job: Path, workspace: Path, cache: Path, *extra: str) -> tuple[int, str]:
    """``nvflare simulator <job> -w <workspace>``: (exit code, output)."""
    nvflare = Path(sys.executable).parent / "nvflare"
    env = {**os.environ, "SURGICAL_AGGREGATION_CACHE": str(cache), "PATH": f"{nvflare.parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(nvflare), "simulator", str(job), "-w", str(workspace), *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    log = result.stdout + result.stderr
    (workspace.parent / "simulator.log").write_text(log)
    return result.returncode, log


def _simulate(job: Path, workspace: Path, cache: Path, *extra: str) -> Path:
    code, log = _run_simulator(job, workspace, cache, *extra)
    assert code == 0, log[-5000:]
    return workspace / "server" / "simulate_job"


def _app(workspace: Path, site: str) -> Path:
    return workspace / site / "simulate_job" / f"app_{site}"


def _exchange(workspace: Path, site: str, round_number: int, direction: str, task: str = "train") -> dict:
    path = _app(workspace, site) / EXCHANGES_DIR / exchange_file_name(task, round_number, direction)
    return torch.load(path, weights_only=True)


def _rows(record: dict) -> dict[str, np.ndarray]:
    state = record["state"]
    return {
        name: np.append(state[W][i].double().numpy(), state[B][i].double().item())
        for i, name in enumerate(record["class_names"])
    }


def _surgical_mean(records: dict[str, dict]) -> dict[str, np.ndarray]:
    """By hand: each class's row = mean of the submitted rows of the sites holding it."""
    submitted = {site: _rows(record) for site, record in records.items()}
    names = {name for rows in submitted.values() for name in rows}
    return {name: np.mean([rows[name] for rows in submitted.values() if name in rows], axis=0) for name in names}


@pytest.fixture(scope="module")
def snippet_run(tmp_path_factory) -> Path:
    """``docs/library.md``'s recipe snippet's run (``test_docs`` reads it too)."""
    return built_once(tmp_path_factory, SNIPPET_RUN, build_snippet_run)


@pytest.fixture(scope="module")
def main_run(tmp_path_factory):
    code, output, workspace = built_once(tmp_path_factory, MAIN_RUN, build_main_run)
    assert code == 0, output[-5000:]
    return workspace, workspace / "server" / "simulate_job"


def test_global_model_has_the_20_class_union(main_run):
    _, server = main_run
    latest = load_checkpoint(server / "app_server" / "FL_global_model.pt")
    best = load_checkpoint(server / "app_server" / "best_FL_global_model.pt")
    assert len(latest.class_names) == 20 and set(latest.class_names) == set(NIH_LABELS) | set(CHEXPERT_LABELS)
    assert len(set(NIH_LABELS) & set(CHEXPERT_LABELS)) == 7
    assert latest.state[W].shape == (20, SMOKE_FEATURES)
    assert latest.meta["round"] == 1
    assert latest.meta["preprocessing"] == {
        "image_size": 32,
        "in_channels": 1,
        "imagenet_normalize": True,
        "network": SMOKE_DENSENET,
    }
    assert best.class_names == latest.class_names


def test_sites_ask_for_their_next_task_at_the_jobs_interval_not_flares_two_seconds(main_run):
    """The job's server config sets FLARE's ``task_request_interval``; FLARE's site worker logs the wait it was told
    after each task it ran."""
    workspace, _ = main_run
    for site in SITES:
        log = (workspace / site / "log.txt").read_text()
        waits = re.findall(r"task run for client: \S+ interval: (\S+) task_processed: True", log)
        assert waits and set(waits) == {str(TASK_REQUEST_INTERVAL)}, (site, waits)


def test_each_site_received_exactly_its_classes_in_its_order(main_run):
    workspace, _ = main_run
    for site, classes in SITES.items():
        for round_number in (0, 1):
            received = _exchange(workspace, site, round_number, "received")
            assert received["class_names"] == classes
            assert received["state"][W].shape == (len(classes), SMOKE_FEATURES)
            assert _exchange(workspace, site, round_number, "sent")["class_names"] == classes


def test_rows_are_means_over_holders_and_slices_follow_the_global_model(main_run):
    workspace, server = main_run
    latest = load_checkpoint(server / "app_server" / "FL_global_model.pt")
    global_rows = _rows({"state": latest.state, "class_names": latest.class_names})
    expected = _surgical_mean({site: _exchange(workspace, site, 1, "sent") for site in SITES})
    for name, row in expected.items():
        np.testing.assert_allclose(global_rows[name], row, atol=TOL, rtol=0, err_msg=name)
    unique = {"Hernia": "site-nih", "Support Devices": "site-chexpert"}
    for name, owner in unique.items():
        np.testing.assert_allclose(global_rows[name], _rows(_exchange(workspace, owner, 1, "sent"))[name], atol=TOL)
    # round 1 handed each site exactly its rows of the round-0 aggregate
    after_round_0 = _surgical_mean({site: _exchange(workspace, site, 0, "sent") for site in SITES})
    for site in SITES:
        for name, row in _rows(_exchange(workspace, site, 1, "received")).items():
            np.testing.assert_allclose(row, after_round_0[name], atol=TOL, err_msg=f"{site} {name}")


def _as_they_are(metrics: dict[str, float]) -> dict[str, float]:
    """A site's figures without those recalibrated in the large."""
    return {name: value for name, value in metrics.items() if "recalibrated" not in name}


def test_run_artefacts(main_run):
    workspace, server = main_run
    history = json.loads((server / "app_server" / "round_history.json").read_text())
    assert [r["round"] for r in history] == [-1, 0, 1]  # one entry per global model: before training, rounds 0, 1
    assert history[0]["initial_model"] == {"origin": "random initialisation (seed 0)", "backbone_strategy": "fedavg"}
    assert all(set(r["validation"]["sites"]) == set(SITES) for r in history)  # round 1's by the final validation
    assert all(set(r["aggregation"]["accepted"]) == set(SITES) for r in history[1:])
    for entry in history[1:]:  # each site's harm test of a trained round's model, on its losses both ways
        for site, metrics in entry["validation"]["sites"].items():
            harm = harm_of(metrics)
            assert harm is not None and harm.recalibrated is not None, (entry["round"], site)
            assert harm.p == max(harm_of(_as_they_are(metrics)).p, harm.recalibrated.p)
    assert (server / "app_server" / "training_curves.png").stat().st_size > 10_000
    cross = json.loads((server / "cross_site_val" / "cross_val_results.json").read_text())
    for site in SITES:  # the server's models, each site on its own slice; no site's model goes to another
        assert set(cross[site]) == {"SRV_FL_global_model.pt", "SRV_best_FL_global_model.pt"}
        assert 0 <= cross[site]["SRV_FL_global_model.pt"]["val_mean_auroc"] <= 1
    assert {p.name for p in (server / "tb_events").iterdir()} == set(SITES)
    best = load_checkpoint(server / "app_server" / "best_FL_global_model.pt")
    for site in SITES:
        meta = json.loads((workspace / site / "simulate_job" / "meta.json").read_text())
        assert {client["name"] for client in meta["job_clients"]} == set(SITES)  # FLARE tells each site who takes part
        assert (_app(workspace, site) / "local_model.pt").is_file()  # a restarted site process resumes from it
        published = load_checkpoint(_app(workspace, site) / PUBLISHED_MODEL_FILE)
        assert published.class_names == best.class_names and published.meta["round"] == best.meta["round"]
        assert torch.equal(published.state[W], best.state[W])


def test_the_servers_best_model_exports_as_a_monai_bundle_with_site_counts_and_validation(main_run, tmp_path):
    from surgical_aggregation.cli import main

    _, server = main_run
    app = server / "app_server"
    assert main(["export-bundle", str(app / "best_FL_global_model.pt"), "--out", str(tmp_path / "b"), "--no-onnx"]) == 0
    metadata = json.loads((tmp_path / "b" / "configs" / "metadata.json").read_text())
    best = load_checkpoint(app / "best_FL_global_model.pt")
    channels = metadata["network_data_format"]["outputs"]["pred"]["channel_def"]
    assert [channels[str(index)] for index in range(len(channels))] == best.class_names
    extra = metadata["surgical_aggregation"]
    both = set(NIH_LABELS) & set(CHEXPERT_LABELS)  # by hand: a class both sites label was labelled by two
    assert extra["sites_labelling"] == {name: 2 if name in both else 1 for name in best.class_names}
    history = json.loads((app / "round_history.json").read_text())
    entry = next(each for each in history if each["round"] == best.meta["round"])
    assert extra["validation"]["mean_val_auroc"] == entry["validation"]["mean_val_auroc"]
    assert extra["validation"]["sites"] == len(SITES)


def test_before_publication_no_site_receives_or_keeps_another_sites_class_names(main_run):
    workspace, _ = main_run
    union = set(NIH_LABELS) | set(CHEXPERT_LABELS)
    for site, own in SITES.items():
        records = read_audit(_app(workspace, site))
        tasks = [record["task"] for record in records]
        published = tasks.index("publish")
        assert set(tasks[:published]) == {"describe", "train", "validate"} and tasks[published + 1 :] == ["publish"]
        for record in records[:published]:  # every task of every type, received and sent
            assert set(record["class_names"]) <= set(own), record
            assert record["head_shapes"].get(W, [len(own)])[0] == len(own), record
        assert set(records[published]["class_names"]) == union and records[published]["direction"] == "received"
        foreign = union - set(own)
        for path in sorted((workspace / site).rglob("*")):  # the site's whole workspace: files and logs
            if not path.is_file() or path.name == PUBLISHED_MODEL_FILE:
                continue
            if path.suffix == ".pt":
                payload = torch.load(path, weights_only=True)
                if payload.get("task") != "publish":  # the published model's exchange record is publication
                    assert not foreign & set(payload.get("class_names", [])), path
                continue
            text = path.read_text(errors="replace")
            if path.name == AUDIT_FILE:
                text = "\n".join(text.splitlines()[:published])
            assert not [name for name in foreign if name in text], path


def test_same_class_sets_give_flares_own_fedavg(tmp_path):
    """On DenseNet121 (the other simulator tests run the smoke network): its 28 MB updates go through FLARE's
    streaming, the smoke network's through plain messages."""
    nih = tiny_sites(nih_chexpert_recipe(start=SCRATCH).site_configs, tmp_path / "cache", DENSENET121)["site-nih"]
    sites = {
        "site-a": {**nih, "record_exchanges": "full"},
        "site-b": {**nih, "record_exchanges": "full", "seed": 7, "embedded": {**nih["embedded"], "seed": 1}},
    }  # other data, same labels
    controller = {"num_rounds": 1, "final_validation": False}
    write_job(SurgicalAggregationRecipe("fedavg", sites, controller, publish_global_model=False), tmp_path / "job")
    server = _simulate(tmp_path / "job", tmp_path / "ws", tmp_path / "cache", "-t", "2")

    helper = WeightedAggregationHelper()
    for site in ("site-a", "site-b"):
        sent = _exchange(tmp_path / "ws", site, 0, "sent")
        assert sent["class_names"] == list(NIH_LABELS)
        helper.add({k: v.numpy() for k, v in sent["state"].items()}, 1.0, site, 0)
    flare_fedavg = helper.get_result()
    ours_model = load_checkpoint(server / "app_server" / "FL_global_model.pt")
    ours = ours_model.state
    assert set(ours) == set(flare_fedavg) and sorted(ours_model.class_names) == sorted(NIH_LABELS)
    # FLARE averages by position (both sites list the classes alike); the union lists them by name
    by_name = [list(NIH_LABELS).index(name) for name in ours_model.class_names]
    for key in (W, B):
        flare_fedavg[key] = flare_fedavg[key][by_name]
    for key, value in flare_fedavg.items():
        if ours[key].dtype == torch.int64:  # BatchNorm counters: FLARE averages as float, we round back
            assert ours[key].item() == round(float(value)), key
        else:
            np.testing.assert_allclose(ours[key].numpy(), value, atol=TOL, rtol=0, err_msg=key)


def _csv_site_with_tuberculosis(root: Path, patients: int = 30, size: int = 32) -> Path:
    """A hospital's own CSV (path, patient_id, Tuberculosis, Effusion) over generated images exported from its PACS
    as DICOM (half MONOCHROME1): Tuberculosis is in no built-in vocabulary and no other site's label set."""
    rng = np.random.default_rng(5)
    rows = []
    for index in range(patients):
        findings = {"Tuberculosis": float(index % 3 == 0), "Pleural Effusion": float(index % 4 == 0)}
        image = render_image(findings, size, GENERATED["nih"].style, rng)
        (root / "img").mkdir(parents=True, exist_ok=True)
        write_dicom(image, root / "img" / f"{index}.dcm", monochrome1=index % 2 == 1)
        tuberculosis, effusion = int(findings["Tuberculosis"]), int(findings["Pleural Effusion"])
        rows.append(f"img/{index}.dcm,p{index},{tuberculosis},{effusion}")
    (root / "labels.csv").write_text("path,patient_id,Tuberculosis,Effusion\n" + "\n".join(rows) + "\n")
    return root / "labels.csv"


@pytest.mark.system
def test_a_new_hospital_with_its_own_finding_joins_a_federation_that_continues_from_its_best_model(
    tmp_path, monkeypatch
):
    base = tiny_sites(nih_chexpert_recipe(start=SCRATCH).site_configs, tmp_path / "cache")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # one process per site (-t), sharing the cores

    def site(kind: str, labels: list[str], seed: int = 0) -> dict:
        config = base[f"site-{kind}"]
        return {
            **config,
            "data": {**config["data"], "labels": labels},
            "embedded": {**config["embedded"], "seed": seed},
        }

    first_sites = {
        "site-a": site("nih", ["Atelectasis", "Mass", "Effusion"]),
        "site-b": site("chexpert", ["Atelectasis", "Lung Opacity", "Pleural Effusion"]),
    }
    write_job(SurgicalAggregationRecipe("first", first_sites, {"num_rounds": 1}), tmp_path / "job1")
    first = _simulate(tmp_path / "job1", tmp_path / "ws1", tmp_path / "cache", "-t", "2")
    best = first / "app_server" / "best_FL_global_model.pt"
    # the newcomer: a CSV whose "Tuberculosis" column no vocabulary and no other site has
    csv = _csv_site_with_tuberculosis(tmp_path / "hospital")
    newcomer_data = {"kind": "csv", "location": str(csv), "options": {"new_classes": ["Tuberculosis"]}}  # declared
    newcomer = {**base["site-nih"], "data": {**base["site-nih"]["data"], **newcomer_data}}
    joined = {**first_sites, "site-c": newcomer}
    recipe = SurgicalAggregationRecipe("second", joined, {"num_rounds": 1}, initial_model=str(best))
    write_job(recipe, tmp_path / "job2")
    second = _simulate(tmp_path / "job2", tmp_path / "ws2", tmp_path / "cache", "-t", "3")

    earlier = load_checkpoint(best)
    final = second / "app_server" / "FL_global_model.pt"
    later = load_checkpoint(final)
    assert earlier.class_names == ["Atelectasis", "Lung Opacity", "Mass", "Pleural Effusion"]
    assert later.class_names == [*earlier.class_names, "Tuberculosis"]  # the union grows by the new finding
    learned = _rows({"state": earlier.state, "class_names": earlier.class_names})
    for name in ("site-a", "site-b"):  # round 0 of the second job starts from the first job's rows
        for class_name, row in _rows(_exchange(tmp_path / "ws2", name, 0, "received")).items():
            np.testing.assert_allclose(row, learned[class_name], atol=TOL, err_msg=f"{name} {class_name}")
    # only the newcomer's head starts from scratch, so only it warms up
    warmed_up = {name: "head warm-up" in (tmp_path / "ws2" / name / "log.txt").read_text() for name in joined}
    assert warmed_up == {"site-a": False, "site-b": False, "site-c": True}
    # the saved global model predicts Tuberculosis, by name
    one = tmp_path / "one.csv"
    one.write_text(f"path\n{csv.parent / 'img' / '1.dcm'}\n")
    scores, failures = score(final, one, cache_dir=tmp_path / "cache")
    assert failures == [] and list(scores.columns) == ["path", "status", *later.class_names]
    assert 0 < scores["Tuberculosis"].iloc[0] < 1


@pytest.mark.system
def test_the_consortium_of_seven_datasets_learns_the_union_of_their_label_files(tmp_path, monkeypatch):
    """``jobs/cxr_consortium`` as ``nvflare simulator`` runs it (one process per site), tiny: its global model's
    classes are the union of the seven real label files, computed without the bundle's loaders."""
    expected = union_of_the_seven_label_files()
    recipe = cxr_consortium_recipe(start=SCRATCH)  # tiny images: no stand-in ships at their size
    sites = tiny_sites(recipe.site_configs, tmp_path / "cache")
    sites["site-padchest"]["embedded"]["patients"] = CONSORTIUM_PATIENTS["padchest"]  # every PadChest finding
    tiny = SurgicalAggregationRecipe(recipe.name, sites, controller={**recipe.controller_args, "num_rounds": 1})
    write_job(tiny, tmp_path / "job")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # seven site processes share the cores
    server = _simulate(tmp_path / "job", tmp_path / "ws", tmp_path / "cache", "-t", str(len(sites)))
    final = load_checkpoint(server / "app_server" / "FL_global_model.pt")
    assert set(final.class_names) == expected and len(final.class_names) == len(expected) == 199
    assert final.class_names == sorted(final.class_names)  # a fresh union: rows in name order
    union = (server / "app_server" / "union_classes.csv").read_text().splitlines()
    assert union[0] == "class,sites,labelled_by,shared" and len(union) == 1 + 199
    assert union[1] == "Pneumothorax,site-chexpert;site-google;site-nih;site-padchest;site-siim;site-vindr,6,yes"


def test_a_job_that_never_made_progress_fails_and_says_why(tmp_path):
    data = generate_nih(tmp_path / "nih", n_patients=30, image_size=32).root
    for image in sorted((data / "images").glob("*.png"))[:3]:  # 3 truncated files
        image.write_bytes(image.read_bytes()[:100])
    recipe = tiny_recipe(nih_chexpert_recipe, tmp_path / "cache", rounds=1)
    sites = dict(recipe.site_configs)
    sites["site-nih"] = {**sites["site-nih"], "data": {**sites["site-nih"]["data"], "location": str(data)}}
    sites["site-nih"]["on_unreadable"] = "error"
    write_job(SurgicalAggregationRecipe("nih_chexpert", sites, recipe.controller_args), tmp_path / "job")

    code, output = _run_simulator(tmp_path / "job", tmp_path / "ws", tmp_path / "cache", "-t", "2")
    assert code == 2, output[-3000:]  # the simulator's exit code when the workflow fails
    server = tmp_path / "ws" / "server" / "simulate_job" / "app_server"
    assert not (server / "best_FL_global_model.pt").exists()
    assert load_checkpoint(server / "FL_global_model.pt").meta["trained"] is False  # the initial weights, marked
    history = json.loads((server / "round_history.json").read_text())
    failed = history[1]["aggregation"]["failed"]  # FLARE's return code
    assert list(failed) == ["site-nih"] and history[1]["aggregation"]["accepted"] == ["site-chexpert"]
    server_log = (tmp_path / "ws" / "server" / "log.txt").read_text()
    assert f"site-nih: its training task failed ({failed['site-nih']})" in server_log
    assert "site-chexpert: its result was valid, but no round had 2 valid contributions" in server_log
    assert "the federation made no progress: in 1 round(s) none aggregated 2 valid contribution(s)" in server_log
    site_log = (tmp_path / "ws" / "site-nih" / "log.txt").read_text()
    cause = [line for line in site_log.splitlines() if "site-nih cannot go on: its train task failed" in line]
    assert len(cause) == 1 and "3 unreadable image(s)" in cause[0]  # one line names the cause
    assert "surgical_aggregation/flare/client.py" not in site_log  # not FLARE's tracebacks of the script


@pytest.mark.system
def test_a_site_training_on_two_processes_takes_part_like_any_other(tmp_path):
    recipe = tiny_recipe(nih_chexpert_recipe, tmp_path / "cache", rounds=1)
    sites = dict(recipe.site_configs)
    sites["site-nih"] = {**sites["site-nih"], "gpus": 2, "device": "cpu", "cpu_threads": 1}  # gloo on a CPU
    write_job(SurgicalAggregationRecipe("nih_chexpert", sites, recipe.controller_args), tmp_path / "job")

    server = _simulate(tmp_path / "job", tmp_path / "ws", tmp_path / "cache", "-t", "2")
    history = json.loads((server / "app_server" / "round_history.json").read_text())
    assert [entry["aggregation"]["accepted"] for entry in history[1:]] == [["site-chexpert", "site-nih"]]
    model = load_checkpoint(server / "app_server" / "FL_global_model.pt")
    assert set(model.class_names) == set(NIH_LABELS) | set(CHEXPERT_LABELS)
    site_log = (tmp_path / "ws" / "site-nih" / "log.txt").read_text()
    assert "training on 2 processes (gloo backend)" in site_log


def test_a_site_config_mistake_is_one_line_naming_the_job_file(tmp_path):
    job = write_job(tiny_recipe(nih_chexpert_recipe, tmp_path / "cache", rounds=1), tmp_path / "job")
    config_file = job / "app_site-nih" / "config" / "site_configs" / "site-nih.json"
    config = json.loads(config_file.read_text())
    config["batch_size"] = str(config["batch_size"])  # "4" instead of 4, as a hand edit might leave it
    config_file.write_text(json.dumps(config))

    code, output = _run_simulator(job, tmp_path / "ws", tmp_path / "cache", "-t", "2")
    assert code == 2, output[-3000:]
    mistake = f"batch_size must be a whole number, got '{config['batch_size']}'"
    lines = [line for line in output.splitlines() if mistake in line]
    assert len(lines) == 1, output  # said once, not in three tracebacks
    assert "site-nih cannot start" in lines[0]
    assert "correct it in the job folder" in lines[0] and "app_site-nih/config/site_configs/site-nih.json" in lines[0]
    assert "surgical_aggregation/flare/client.py" not in output  # no traceback through the site's script
    assert "only 1 site(s) answered the handshake (['site-chexpert']); 2 needed" in output


def _without_timings(value):
    if isinstance(value, dict):
        return {key: _without_timings(item) for key, item in value.items() if key != "seconds"}
    if isinstance(value, list):
        return [_without_timings(item) for item in value]
    return value


def test_the_same_seed_gives_the_same_round_history_on_a_cpu(main_run, snippet_run, tmp_path):
    """Two runs of one tiny job, the main run's (``nvflare simulator -t 2``, every exchange recorded in full) and the
    docs' recipe snippet's (FLARE's SimEnv through the recipe API, tracked with MLflow; results arriving in any
    order): every validation, aggregation and model choice is the same; only the seconds differ. The in-process
    federation of the benchmark grids (``experiments.federation``) on the same site configs gives the same global
    models and validations, to float round-off (one process instead of one per site)."""
    histories, models = [], []
    recipe = tiny_recipe(nih_chexpert_recipe, tmp_path / "cache", rounds=2)
    for server in (
        main_run[1] / "app_server",
        snippet_run / "nih_chexpert" / "server" / "simulate_job" / "app_server",
    ):
        histories.append(_without_timings(json.loads((server / "round_history.json").read_text())))
        models.append(load_checkpoint(server / "FL_global_model.pt").state)
    assert histories[0] == histories[1]
    assert all(torch.equal(models[0][key], models[1][key]) for key in models[0])

    configs = {
        site: site_config_from_dict({**values, "cpu_threads": 1}) for site, values in recipe.site_configs.items()
    }
    trainers = {site: SiteTrainer(config, prepare_site_data(config), site) for site, config in configs.items()}
    union = sorted({name for trainer in trainers.values() for name in trainer.class_names})
    persistor = recipe.persistor_args
    state = initial_global_state(persistor["architecture"], persistor["preprocessing"], persistor.get("seed", 0))
    initial, _ = extend_head(state, [], union)
    controller = recipe.controller_args
    arguments = inspect.signature(SurgicalAggregatorShareable.__init__).parameters
    patience, min_delta = (controller.get(name, arguments[name].default) for name in ("patience", "min_delta"))
    result = federate(trainers, initial, union, controller, 2, patience, min_delta)
    flare_model = load_checkpoint(server / "FL_global_model.pt")  # the second run's: the same as the first's
    assert result.last.class_names == flare_model.class_names
    for key, value in flare_model.state.items():
        np.testing.assert_allclose(np.asarray(result.last.state[key], dtype=np.float64), value.double().numpy(),
                                   atol=2e-4, rtol=0, err_msg=key)  # fmt: skip
    flare_validation = [entry["validation"]["mean_val_loss"] for entry in histories[0] if "validation" in entry]
    ours = [entry["validation"]["mean_val_loss"] for entry in result.history if "validation" in entry]
    np.testing.assert_allclose(ours, flare_validation, atol=1e-4)
