"""Report labelling: IU XML parsing, the MeSH map, the report CSV, the embedding cache, the MLP
under surgical aggregation, Youden metrics, and a one-round report job through FLARE's simulator."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from surgical_aggregation.core.aggregation import Contribution, SurgicalAggregator
from surgical_aggregation.core.errors import DatasetFormatError
from surgical_aggregation.core.head import NAMED_HEAD, numpy_state, slice_for_client
from surgical_aggregation.data.reference import reference_file
from surgical_aggregation.evaluation.inference import score
from surgical_aggregation.evaluation.metrics import threshold_metrics, youden_threshold
from surgical_aggregation.flare.audit import read_audit
from surgical_aggregation.flare.recipe import SurgicalAggregationRecipe, report_labeling_recipe, write_job
from surgical_aggregation.reports.data import (
    IU_ARCHIVE,
    label_counts,
    load_iu_reports,
    load_report_csv,
    mesh_findings,
    parse_iu_report,
)
from surgical_aggregation.reports.embeddings import EmbeddingCache
from surgical_aggregation.reports.model import ReportMLP
from surgical_aggregation.training.checkpoint import initial_global_state, load_checkpoint

TOL = 1e-6
REPOSITORY = Path(__file__).resolve().parents[1]


def iu_xml(uid: str, findings: str, impression: str, majors: list[str]) -> str:
    tags = "".join(f"<major>{tag}</major>" for tag in majors)
    return f"""<?xml version="1.0" encoding="utf-8"?>
<eCitation><uId id="{uid}"/><MedlineCitation><Article><Abstract>
<AbstractText Label="COMPARISON">None.</AbstractText>
<AbstractText Label="INDICATION">Cough.</AbstractText>
<AbstractText Label="FINDINGS">{findings}</AbstractText>
<AbstractText Label="IMPRESSION">{impression}</AbstractText>
</Abstract></Article></MedlineCitation><MeSH>{tags}<automatic>Pneumothorax</automatic></MeSH></eCitation>"""


def write_archive(path: Path, reports: dict[str, str]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for name, xml in reports.items():
            data = xml.encode()
            info = tarfile.TarInfo(f"ecgen-radiology/{name}.xml")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


FIXTURE = {
    "1": iu_xml("CXR1", "Heart  size is\nenlarged.", "Cardiomegaly.", ["Cardiomegaly/mild"]),
    "2": iu_xml(
        "CXR2", "Left basilar opacity.", "Small effusion.", ["Opacity/lung/base/left", "Pleural Effusion/left"]
    ),
    "3": iu_xml("CXR3", "", "", ["normal"]),  # no text: skipped and counted
    "4": iu_xml("CXR4", "", "Pleural thickening, calcified aorta.", ["Thickening/pleura", "Calcinosis/aorta"]),
    "5": iu_xml("CXR5", "Lungs are clear.", "No acute disease.", ["normal", "Thickening/lung", "Lung/hypoinflation"]),
}


def test_iu_archive_parsing_text_labels_and_skips(tmp_path):
    table, summary = load_iu_reports(write_archive(tmp_path / "reports.tgz", FIXTURE))
    assert (summary.read, summary.kept, summary.skipped_no_text) == (5, 4, 1)
    assert table.paths == ["CXR1", "CXR2", "CXR4", "CXR5"]
    text = dict(zip(table.paths, table.frame["text"], strict=True))
    assert text["CXR1"] == "Heart size is enlarged. Cardiomegaly."  # findings then impression, whitespace normalised
    assert text["CXR4"] == "Pleural thickening, calcified aorta."
    positives = {name: sorted(table.frame.loc[table.frame[name] == 1, "path"]) for name in table.classes}
    assert {name: ids for name, ids in positives.items() if ids} == {
        "Cardiomegaly": ["CXR1"],
        "Lung Opacity": ["CXR2"],
        "Pleural Effusion": ["CXR2"],
        "Pleural Thickening": ["CXR4"],
        "Calcification of the Aorta": ["CXR4"],
    }  # "automatic" tags are not used; "Thickening/lung", "Lung/...", "normal" give no finding
    assert table.frame["patient_id"].tolist() == table.paths  # a report is its own patient for splits


def test_mesh_map_uses_the_qualifier_where_it_decides():
    assert mesh_findings(["Opacity/lung/base/left/mild"]) == {"Lung Opacity"}
    assert mesh_findings(["Thickening/pleura/right", "Thickening/lung"]) == {"Pleural Thickening"}
    assert mesh_findings(["Aorta/tortuous", "Aorta/prominent"]) == {"Tortuous Aorta"}
    assert mesh_findings(["Catheters, Indwelling", "Hernia, Hiatal/large"]) == {"Support Devices", "Hernia"}
    assert mesh_findings(["normal", "Spine/degenerative", "Granulomatous Disease"]) == set()


def test_bad_xml_names_the_file(tmp_path):
    archive = write_archive(tmp_path / "bad.tgz", {"7": "<eCitation><uId id='CXR7'/>"})
    with pytest.raises(DatasetFormatError, match=r"bad.tgz:ecgen-radiology/7.xml: not valid XML"):
        load_iu_reports(archive)
    with pytest.raises(DatasetFormatError, match=r"r.xml: no <uId id=...> element"):
        parse_iu_report("<eCitation/>", "r.xml")


@pytest.mark.skipif(reference_file(IU_ARCHIVE) is None, reason="torchxrayvision's data folder is not installed")
def test_the_real_iu_reports_give_the_documented_counts():
    table, summary = load_iu_reports()
    assert (summary.read, summary.kept, summary.skipped_no_text) == (3955, 3927, 28)
    counts = label_counts(table)
    assert len(counts) == 19 and list(counts) == table.classes  # most frequent first
    assert {name: counts[name] for name in table.classes[:5]} == {
        "Lung Opacity": 586,
        "Cardiomegaly": 395,
        "Support Devices": 379,
        "Atelectasis": 332,
        "Tortuous Aorta": 250,
    }
    assert counts["Mass"] == 17 and counts["Pleural Thickening"] == 47
    # docs/report-labeling/README.md: the archive's counts and the table of findings, row by row
    page = (Path(__file__).resolve().parents[1] / "docs" / "report-labeling" / "README.md").read_text()
    prose = " ".join(page.split())
    assert f"holds the {summary.read:,} Indiana University" in prose
    skipped = f"{summary.skipped_no_text} reports have neither section; they are skipped and counted"
    assert f"{skipped}, leaving **{summary.kept:,}**" in prose
    rows = [line.strip("|").split("|") for line in page.splitlines() if line.startswith("| ") and line.count("|") == 4]
    assert [(row[0].strip(), int(row[2])) for row in rows[2:]] == list(counts.items())


def test_report_csv_matches_columns_by_name_and_skips_empty_text(tmp_path):
    path = tmp_path / "reports.csv"
    path.write_text('report_id,report,Effusion,cardiomegaly\nr1,"Small  effusion.",1,0\nr2,,0,1\nr3,Big heart.,0,1\n')
    table, summary = load_report_csv(path)
    assert table.classes == ["Pleural Effusion", "Cardiomegaly"]
    assert table.paths == ["r1", "r3"] and table.frame["text"].tolist() == ["Small effusion.", "Big heart."]
    assert (summary.read, summary.skipped_no_text) == (3, 1)
    assert table.frame["Cardiomegaly"].tolist() == [0.0, 1.0]
    path.write_text("report,Edema\nA,2\n")
    with pytest.raises(DatasetFormatError, match=r"column 'Edema' must hold 0 or 1, found 2"):
        load_report_csv(path)
    path.write_text("report,Effusion,Pleural Effusion\nA,1,1\n")
    with pytest.raises(DatasetFormatError, match="name the same finding twice"):
        load_report_csv(path)
    path.write_text("report,Heart Things\nA,1\n")
    with pytest.raises(DatasetFormatError, match="column 'Heart Things' is not a finding this bundle knows"):
        load_report_csv(path)  # outside the built-in vocabulary and not declared
    assert load_report_csv(path, new_classes=["heart things"])[0].classes == ["Heart thing"]  # declared: its own
    with pytest.raises(DatasetFormatError, match="no text column 'text'"):
        load_report_csv(path, text_column="text")


class CountingEncoder:
    """A deterministic stand-in for the sentence encoder that counts what it is asked to embed."""

    dimension = 4

    def __init__(self, key: str = "counting-v1") -> None:
        self.key = key
        self.calls: list[str] = []

    def encode(self, texts):
        self.calls += list(texts)
        return np.array([[len(t), t.count("a"), t.count("e"), hash(self.key) % 7] for t in texts], np.float32)


class SlowCountingEncoder(CountingEncoder):
    """Slow enough that two sites starting together would both compute everything without the cache's lock."""

    def encode(self, texts):
        time.sleep(0.2)
        return super().encode(texts)


def test_two_sites_of_one_machine_embed_each_text_once(tmp_path):
    texts = [f"report number {index} with an effusion" for index in range(40)]
    encoders = [SlowCountingEncoder(), SlowCountingEncoder()]
    caches = [EmbeddingCache(tmp_path, encoder) for encoder in encoders]  # both opened before either computed
    results: dict[int, tuple] = {}
    threads = [
        threading.Thread(target=lambda i=i: results.__setitem__(i, caches[i].embed(texts, progress=False, chunk=8)))
        for i in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(len(encoder.calls) for encoder in encoders) == [0, 40]  # one site computed, the other read
    assert sorted(computed for _, computed in results.values()) == [0, 40]
    np.testing.assert_array_equal(results[0][0], results[1][0])


def test_embedding_cache_computes_each_text_once_per_model(tmp_path):
    encoder = CountingEncoder()
    cache = EmbeddingCache(tmp_path, encoder)
    vectors, computed = cache.embed(["a cat", "the edema", "a cat"], progress=False)
    assert computed == 2 and encoder.calls == ["a cat", "the edema"]
    np.testing.assert_array_equal(vectors[0], vectors[2])
    again = CountingEncoder()
    reopened = EmbeddingCache(tmp_path, again)  # a new process: the shards on disk are read back
    vectors_again, computed = reopened.embed(["the edema", "a cat", "new text"], progress=False)
    assert computed == 1 and again.calls == ["new text"]
    np.testing.assert_array_equal(vectors_again[:2], vectors[[1, 0]])
    other = CountingEncoder("other-model")
    _, computed = EmbeddingCache(tmp_path, other).embed(["a cat"], progress=False)
    assert computed == 1 and other.calls == ["a cat"]  # keyed by model as well as by text
    assert len(EmbeddingCache(tmp_path, CountingEncoder())) == 3


@pytest.mark.slow
def test_minilm_embeds_offline():
    from surgical_aggregation.reports.embeddings import MiniLMEncoder

    vectors = MiniLMEncoder().encode(["No acute cardiopulmonary process.", "Cardiomegaly with effusions."])
    assert vectors.shape == (2, 384) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert float(vectors[0] @ vectors[1]) < 0.9
    assert os.environ["HF_HUB_OFFLINE"] == "1"


def test_mlp_shape_and_named_head():
    model = ReportMLP(["Edema", "Pleural Effusion"], in_features=384)
    state = model.state_dict()
    assert model.class_names == ["Edema", "Pleural Effusion"]
    assert [tuple(state[k].shape) for k in ("features.0.weight", "features.3.weight")] == [(512, 384), (256, 512)]
    assert tuple(state[NAMED_HEAD.weight_key].shape) == (2, 256)
    assert [m.p for m in model.features if isinstance(m, torch.nn.Dropout)] == [0.2, 0.2]
    assert model(torch.zeros(3, 384)).shape == (3, 2)
    empty = initial_global_state(architecture="report_mlp", preprocessing={"embedding_model": "all-MiniLM-L6-v2"})
    assert empty[NAMED_HEAD.weight_key].shape == (0, 256) and "features.0.weight" in empty


def test_mlp_hidden_layers_are_averaged_and_rows_matched_by_name():
    classes = {"site-a": ["Edema", "Cardiomegaly"], "site-b": ["Cardiomegaly", "Hernia"]}
    states = {}
    for seed, (site, names) in enumerate(classes.items()):
        torch.manual_seed(seed)
        states[site] = numpy_state(ReportMLP(names, in_features=8).state_dict())
    empty_head = slice_for_client(ReportMLP(["Mass"], in_features=8).state_dict(), ["Mass"], [])  # union starts empty
    aggregator = SurgicalAggregator(numpy_state(empty_head), [])
    for site, names in classes.items():
        aggregator.add(Contribution(site, states[site], names, num_samples=10))
    result = aggregator.finalize()
    a, b = states["site-a"], states["site-b"]
    for key in ("features.0.weight", "features.0.bias", "features.3.weight", "features.3.bias"):
        np.testing.assert_allclose(result.state[key], (a[key] + b[key]) / 2, atol=TOL, rtol=0)
    rows = dict(zip(result.class_names, result.state[NAMED_HEAD.weight_key], strict=True))
    weight = NAMED_HEAD.weight_key
    np.testing.assert_allclose(rows["Cardiomegaly"], (a[weight][1] + b[weight][0]) / 2, atol=TOL, rtol=0)
    np.testing.assert_allclose(rows["Edema"], a[weight][0], atol=TOL, rtol=0)
    np.testing.assert_allclose(rows["Hernia"], b[weight][1], atol=TOL, rtol=0)


def test_youden_threshold_and_metrics_by_hand():
    labels = np.array([0, 0, 1, 1, 0, 1])
    scores = np.array([0.1, 0.4, 0.35, 0.8, 0.2, 0.9])
    # J = 2/3 at 0.35 (sens 1, spec 2/3) and at 0.8 (sens 2/3, spec 1): the tie goes to the more specific
    assert youden_threshold(labels, scores) == 0.8
    metrics = threshold_metrics(labels, scores, 0.8)
    assert (metrics.accuracy, metrics.sensitivity, metrics.specificity) == pytest.approx((5 / 6, 2 / 3, 1.0))
    metrics = threshold_metrics(labels, scores, 0.35)
    assert (metrics.accuracy, metrics.sensitivity, metrics.specificity) == pytest.approx((5 / 6, 1.0, 2 / 3))
    assert np.isnan(youden_threshold(np.zeros(4), np.arange(4.0)))
    assert np.isnan(threshold_metrics(labels, scores, float("nan")).accuracy)


FINDING_SENTENCES = {
    "Cardiomegaly": ("The heart is enlarged.", "Cardiomegaly"),
    "Pleural Effusion": ("There is a small pleural effusion.", "Pleural Effusion/left"),
    "Lung Opacity": ("Patchy opacity in the left base.", "Opacity/lung/base/left"),
    "Atelectasis": ("Subsegmental atelectasis.", "Pulmonary Atelectasis/base"),
}


def fixture_reports(count: int) -> dict[str, str]:
    """``count`` small reports; report i mentions finding j when bit j of i is set."""
    reports = {}
    names = list(FINDING_SENTENCES)
    for index in range(count):
        present = [name for bit, name in enumerate(names) if index >> bit & 1]
        findings = " ".join(FINDING_SENTENCES[name][0] for name in present) or "The lungs are clear."
        majors = [FINDING_SENTENCES[name][1] for name in present] or ["normal"]
        reports[str(index)] = iu_xml(f"CXR{index}", findings, f"Report {index}.", majors)
    return reports


@pytest.mark.slow
@pytest.mark.system
def test_one_round_report_job_through_the_simulator(tmp_path):
    archive = write_archive(tmp_path / "reports.tgz", fixture_reports(64))
    bundle = report_labeling_recipe()
    labels = {"site-a": ["Cardiomegaly", "Pleural Effusion", "Lung Opacity"], "site-b": ["Lung Opacity", "Atelectasis"]}
    sites = bundle.site_configs
    for site, config in sites.items():
        config["data"].update(location=str(archive), labels=labels[site])
        # five epochs: one round that lowers the sites' loss by more than DP-SGD's noise moves it (in the profile's
        # one epoch the round's change was within 2e-4 of 0, and the secure noise, never the same twice, decided
        # whether the job published)
        config.update(cache_dir=str(tmp_path / "cache"), batch_size=8, device="cpu", local_epochs=5)
    # DP-SGD at one site; its output biases start at the fixture's prevalence (each finding is in half its reports),
    # so that one round can beat the initial model, as the controller requires before it publishes anything
    sites["site-a"]["differential_privacy"] = {"epsilon": 100.0, "noise_multiplier": 1.0, "prior_prevalence": 0.5}
    controller = {
        **bundle.controller_args,
        "num_rounds": 1,
        "handshake_timeout": 300,
        "train_timeout": 300,
        "validate_timeout": 300,
        "export_bundle": True,  # the server writes the best model as a MONAI Bundle at the end
    }
    # FLARE's ExcludeVars on every site's update: site-a's Cardiomegaly row (no other site labels it) stays home
    withheld = {"path": "exclude_vars", "args": {"exclude_vars": "^class_layers\\.out/Cardiomegaly$"}}
    recipe = SurgicalAggregationRecipe(bundle.name, sites, controller, update_privacy=withheld)
    job = write_job(recipe, tmp_path / "job")
    nvflare = Path(sys.executable).parent / "nvflare"
    env = {**os.environ, "PATH": f"{nvflare.parent}:{os.environ['PATH']}"}
    result = subprocess.run(
        [str(nvflare), "simulator", str(job), "-w", str(tmp_path / "ws")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    app = tmp_path / "ws" / "server" / "simulate_job" / "app_server"
    model = load_checkpoint(app / "FL_global_model.pt")
    assert model.architecture == "report_mlp" and model.meta["round"] == 0
    assert model.class_names == ["Atelectasis", "Cardiomegaly", "Lung Opacity", "Pleural Effusion"]  # by name
    assert model.state["features.0.weight"].shape == (512, 384)
    assert model.build_model()(torch.zeros(1, 384)).shape == (1, 4)
    cross = json.loads((app.parent / "cross_site_val" / "cross_val_results.json").read_text())
    assert set(cross) == {"site-a", "site-b"}
    # each site embedded its own reports once; the cache is keyed by text and model
    assert list((tmp_path / "cache" / "report-embeddings").iterdir())
    _the_servers_monai_bundle_labels_reports_as_predict_does(app, tmp_path)
    # site-a trained with DP-SGD: the epsilon it spent is in its audit and, by round, in the server's history
    history = json.loads((app / "round_history.json").read_text())
    reported = next(entry for entry in history if entry["round"] == 0)["aggregation"]["privacy"]
    audit = read_audit(tmp_path / "ws" / "site-a" / "simulate_job" / "app_site-a")
    [sent] = [entry for entry in audit if entry["task"] == "train" and entry["direction"] == "sent"]
    privacy = sent["privacy"]
    assert set(reported) == {"site-a"} and reported["site-a"]["epsilon"] == privacy["epsilon"] > 0
    assert (
        privacy["noise_multiplier"] == 1.0
        and privacy["steps"] > 0
        and privacy["unit"] == "patient"
        and not privacy["stopped"]
    )
    _the_excluded_row_reached_the_server_as_received(audit, model, tmp_path / "ws" / "site-a" / "simulate_job")


def _the_excluded_row_reached_the_server_as_received(audit: list[dict], model, site_a: Path) -> None:
    """The global Cardiomegaly row after round 0 is the row site-a received, to the bit; its other row moved."""
    [filtered] = [entry for entry in audit if entry["task"] == "train" and entry["direction"] == "filtered"]
    assert filtered["note"].startswith("ExcludeVars: of ") and " 0 altered" in filtered["note"]
    exchange = torch.load(site_a / "app_site-a" / "exchanges" / "train-round-000-received.pt")
    received = dict(zip(exchange["class_names"], exchange["state"]["class_layers.out.weight"], strict=True))
    rows = dict(zip(model.class_names, torch.as_tensor(model.state["class_layers.out.weight"]), strict=True))
    assert torch.equal(rows["Cardiomegaly"], received["Cardiomegaly"])
    assert not torch.equal(rows["Pleural Effusion"], received["Pleural Effusion"])


def _the_servers_monai_bundle_labels_reports_as_predict_does(app: Path, tmp_path: Path) -> None:
    """The report model's bundle, exported by the server: its site counts, and `monai.bundle run` on a CSV of
    reports (one without text) writes predict's CSV."""
    root = app / "monai_bundle"
    metadata = json.loads((root / "configs" / "metadata.json").read_text())
    extra = metadata["surgical_aggregation"]
    assert extra["sites_labelling"] == {"Atelectasis": 1, "Cardiomegaly": 1, "Lung Opacity": 2, "Pleural Effusion": 1}
    assert metadata["network_data_format"]["inputs"]["embedding"]["num_channels"] == 384
    assert "all-MiniLM-L6-v2" in extra["input_produced_by"]
    reports = tmp_path / "to_label.csv"
    reports.write_text(
        "report_id,report\nr1,Large right pleural effusion.\nr2,\nr3,Cardiomegaly with   basilar atelectasis.\n"
    )
    expected, failures = score(_server_model(app), reports, cache_dir=tmp_path / "cache")
    assert failures == [("r2", "no text")]
    out = tmp_path / "bundle.csv"
    command = [sys.executable, "-m", "monai.bundle", "run", "--config_file", "configs/inference.json"]
    result = subprocess.run(
        [*command, "--input_csv", str(reports), "--output_file", str(out)], cwd=root, capture_output=True, text=True
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    written = pd.read_csv(out, dtype={"report_id": str})
    assert list(written.columns) == list(expected.columns) and written["status"].tolist() == ["ok", "no text", "ok"]
    assert written["report_id"].tolist() == expected["report_id"].tolist() == ["r1", "r2", "r3"]
    classes = list(expected.columns[2:])
    difference = np.abs(written[classes].to_numpy() - expected[classes].to_numpy(np.float64))
    assert np.isnan(difference[1]).all() and np.nanmax(difference) <= 1e-5


def _server_model(app: Path) -> Path:
    best = app / "best_FL_global_model.pt"
    return best if best.is_file() else app / "FL_global_model.pt"


def test_the_report_job_sites_label_different_subsets():
    sites = report_labeling_recipe().site_configs  # the committed job is its export (tests/test_recipe.py)
    a, b = (set(sites[site]["data"]["labels"]) for site in ("site-a", "site-b"))
    assert len(a & b) == 4 and len(a | b) == 14 and a != b  # different label subsets, 4 shared


@pytest.mark.slow
def test_prepare_embeds_a_report_csv_once(tmp_path, capsys):
    from surgical_aggregation.cli import main

    csv = tmp_path / "reports.csv"
    csv.write_text("report,Edema\nMild pulmonary edema.,1\nClear lungs.,0\n,0\n")
    arguments = ["prepare", "--kind", "report_csv", "--data", str(csv), "--cache-dir", str(tmp_path / "cache")]
    assert main([*arguments, "--no-progress"]) == 0
    assert "3 reports, 2 with text, 1 without (skipped)" in capsys.readouterr().out
    shards = list((tmp_path / "cache" / "report-embeddings").rglob("shard-*.npz"))
    assert len(shards) == 1 and np.load(shards[0])["vectors"].shape == (2, 384)
    assert main([*arguments, "--no-progress"]) == 0  # nothing new to embed: no new shard
    assert list((tmp_path / "cache" / "report-embeddings").rglob("shard-*.npz")) == shards
    assert main(["prepare", "--kind", "nih"]) == 2  # images still need --data


def test_report_evaluation_thresholds_on_validation_and_scores_the_test_split(tmp_path):
    from surgical_aggregation.evaluation.inference import evaluate_with_thresholds
    from surgical_aggregation.reports.data import report_table
    from surgical_aggregation.reports.dataset import ReportDataset
    from surgical_aggregation.training.checkpoint import save_checkpoint

    rng = np.random.default_rng(0)
    frame = pd.DataFrame({"report_id": [f"r{i}" for i in range(40)], "text": ["x"] * 40})
    frame["Edema"] = rng.integers(0, 2, 40)
    frame["Hernia"] = rng.integers(0, 2, 40)
    table = report_table(frame, "fixture", tmp_path, ["Edema", "Hernia"])
    vectors = {f"r{i}": rng.normal(size=8).astype(np.float32) for i in range(40)}
    val = ReportDataset(replace(table, frame=table.frame.iloc[:20].reset_index(drop=True)), vectors)
    test = ReportDataset(replace(table, frame=table.frame.iloc[20:].reset_index(drop=True)), vectors)
    torch.manual_seed(0)
    model = ReportMLP(["Hernia", "Edema"], in_features=8).eval()  # the model's own row order
    meta = {"architecture": "report_mlp", "preprocessing": {"in_features": 8}}  # a toy encoder's 8-d vectors
    path = save_checkpoint(tmp_path / "m.pt", model.state_dict(), model.class_names, **meta)
    report = evaluate_with_thresholds([path], val, test, bootstrap=10, device="cpu")

    def scores(dataset: ReportDataset) -> np.ndarray:
        with torch.no_grad():
            return torch.sigmoid(model(dataset.inputs)).numpy()

    for name in ("Edema", "Hernia"):
        row = report.per_class.set_index("class_name").loc[name]
        column = model.class_names.index(name)
        threshold = youden_threshold(val.table.frame[name].to_numpy(), scores(val)[:, column])
        expected = threshold_metrics(test.table.frame[name].to_numpy(), scores(test)[:, column], threshold)
        assert row["threshold"] == pytest.approx(threshold, abs=TOL)
        assert (row["accuracy"], row["sensitivity"], row["specificity"]) == pytest.approx(
            (expected.accuracy, expected.sensitivity, expected.specificity), abs=TOL
        )


@pytest.mark.slow
def test_a_report_model_is_usable_from_the_command_line(tmp_path, capsys):
    """evaluate and predict read a report model's inputs through its modality: a report CSV in (embedded by the
    model's encoder), per-finding probabilities out; thresholds chosen on the validation split travel with a copy
    of the model, and predict --calls applies them."""
    from surgical_aggregation.cli import main
    from surgical_aggregation.evaluation.inference import THRESHOLDS_KEY
    from surgical_aggregation.training.checkpoint import save_checkpoint

    rng = np.random.default_rng(0)
    texts = ["pulmonary edema and an enlarged heart", "the heart is enlarged", "edema in both lungs", "clear lungs"]
    rows = [texts[i % 4] for i in range(60)]
    labelled = pd.DataFrame(
        {
            "report_id": [f"r{i}" for i in range(60)],
            "report": rows,
            "Edema": [int("edema" in text) for text in rows],
            "Cardiomegaly": [int("heart" in text) for text in rows],
        }
    )
    labelled_csv = tmp_path / "labelled.csv"
    labelled.to_csv(labelled_csv, index=False)
    torch.manual_seed(int(rng.integers(100)))
    model = ReportMLP(["Cardiomegaly", "Edema"], in_features=384)
    meta = {"architecture": "report_mlp", "preprocessing": {"embedding_model": "all-MiniLM-L6-v2", "in_features": 384}}
    model_file = save_checkpoint(tmp_path / "model.pt", model.state_dict(), model.class_names, **meta)
    cache = ["--cache-dir", str(tmp_path / "cache")]

    evaluate = ["evaluate", "--model", str(model_file), "--kind", "report_csv", "--data", str(labelled_csv)]
    assert main([*evaluate, "--split", "all", "--out", str(tmp_path / "all"), "--bootstrap", "20", *cache]) == 0
    assert "labelled.csv (report_csv, all): 60 reports" in capsys.readouterr().out
    table = pd.read_csv(tmp_path / "all" / "per_class_auroc.csv")
    assert table["class_name"].tolist() == ["Edema", "Cardiomegaly"]

    with_thresholds = tmp_path / "model-thresholds.pt"
    arguments = [*evaluate, "--out", str(tmp_path / "t"), "--thresholds-out", str(with_thresholds), "--bootstrap", "20"]
    assert main([*arguments, *cache]) == 0
    saved = load_checkpoint(with_thresholds).meta[THRESHOLDS_KEY]
    assert set(saved["values"]) == {"Edema", "Cardiomegaly"} and saved["rule"] == "Youden's J"
    assert saved["chosen_on"] == "labelled.csv (report_csv, validation split)"

    to_score = tmp_path / "new.csv"
    pd.DataFrame({"report": ["edema again", "", "a normal study"]}).to_csv(to_score, index=False)
    out = tmp_path / "scores.csv"
    predict = ["predict", "--model", str(with_thresholds), "--input", str(to_score), "--out", str(out), "--calls"]
    assert main([*predict, *cache]) == 0
    scores = pd.read_csv(out, dtype={"report_id": str})
    assert list(scores.columns) == [
        "report_id",
        "status",
        "Cardiomegaly",
        "Edema",
        "Cardiomegaly (call)",
        "Edema (call)",
    ]
    assert scores["status"].tolist() == ["ok", "no text", "ok"]
    for name in ("Cardiomegaly", "Edema"):
        expected = (scores[name] >= saved["values"][name]).where(scores[name].notna())
        assert scores[f"{name} (call)"].tolist()[0] == int(expected.iloc[0])
    assert main(["predict", "--model", str(model_file), "--input", str(to_score), "--out", str(out), "--calls"]) == 2
    assert "has no thresholds to call positives with" in capsys.readouterr().err
