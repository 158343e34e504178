"""``export-bundle``: a model as a MONAI Bundle whose files compute what ``predict`` computes.

A tiny image model (32 px, random weights) with thresholds saved in it; images of every kind ``predict`` reads (an
8-bit PNG at the model's size, larger and non-square PNGs, an RGB JPEG, a 16-bit PNG, a DICOM chest film). The
bundle's metadata is validated with MONAI's own verification functions, offline; its TorchScript and ONNX files and
its inference config, run by ``python -m monai.bundle run``, are compared with ``predict`` on the same images. The
exports after a simulator run (the server's union table and history, the report model) are in ``test_flare_e2e.py`` and
``test_reports.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pydicom
import pytest
import torch
from PIL import Image
from pydicom.data import get_testdata_file

from surgical_aggregation.cli import main
from surgical_aggregation.core.errors import ExportError
from surgical_aggregation.deployment import bundle as bundle_module
from surgical_aggregation.deployment.bundle import EXTRA_KEY, TOLERANCE, export_bundle
from surgical_aggregation.evaluation.inference import (
    RECALIBRATION_KEY,
    THRESHOLDS_KEY,
    save_recalibrated,
    save_refit_rows,
    score,
)
from surgical_aggregation.images import grayscale
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.names import DENSENET121, NETWORK_ARGUMENTS, NETWORK_KEY, SMOKE_DENSENET
from surgical_aggregation.training.checkpoint import PREPROCESSING_KEY, load_checkpoint, save_checkpoint
from surgical_aggregation.training.head_refit import RefitRow

pytestmark = pytest.mark.slow  # exports, saves and reloads DenseNets (a MONAI Bundle, TorchScript, ONNX)

CLASSES = ["Pleural Effusion", "Mass", "Tuberculosis"]  # a finding with an alias, one without, one of a site's own
THRESHOLDS = {"Pleural Effusion": 0.5, "Mass": None, "Tuberculosis": 0.45}  # Mass: no threshold chosen
SCHEMA = Path(__file__).parent / "data" / "monai_bundle_metadata.schema.json"
# 3 channels: RepeatChannel too; the smoke network (DenseNet121's export: the command line's test)
PREPROCESSING = {"image_size": 32, "in_channels": 3, "imagenet_normalize": True, NETWORK_KEY: SMOKE_DENSENET}


def _model_file(folder: Path, preprocessing: dict) -> Path:
    torch.manual_seed(0)
    model = NamedDenseNet(CLASSES, in_channels=3, network=preprocessing.get(NETWORK_KEY, DENSENET121))
    with torch.no_grad():
        model.class_layers.out.weight.mul_(20 if model.network == DENSENET121 else 200)  # spread over (0, 1)
    meta = {PREPROCESSING_KEY: preprocessing, "round": 3, "method": "surgical"}
    meta[THRESHOLDS_KEY] = {"values": THRESHOLDS, "chosen_on": "val", "rule": "Youden's J"}
    return save_checkpoint(folder / "model.pt", model.state_dict(), CLASSES, **meta)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return _model_file(tmp_path_factory.mktemp("model"), PREPROCESSING)


@pytest.fixture(scope="module")
def images(nih_data, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("images")
    sources = sorted((nih_data.root / "images").rglob("*.png"))[:4]
    gray = [Image.open(path).convert("L") for path in sources]
    gray[0].resize((32, 32)).save(folder / "a_model_size.png")
    gray[1].resize((70, 50)).save(folder / "b_wide.png")
    gray[2].convert("RGB").resize((120, 120)).save(folder / "c_rgb.jpg", quality=90)
    deep = (np.asarray(gray[3].resize((48, 48))).astype(np.uint16) * 250).astype(np.uint16)
    Image.fromarray(deep).save(folder / "d_16bit.png")
    (folder / "nested").mkdir()
    gray[0].resize((64, 64)).save(folder / "nested" / "e.png")
    film = pydicom.dcmread(get_testdata_file("RG1_UNCR.dcm"))  # a CR chest film: MONOCHROME1, 15 bits, windowed
    pixels = film.pixel_array[::16, ::16].copy()
    film.Rows, film.Columns, film.PixelData = *pixels.shape, pixels.tobytes()
    film.save_as(folder / "f_chest_film.dcm")
    return folder


@pytest.fixture(scope="module")
def exported(model_file, tmp_path_factory):
    return export_bundle(model_file, tmp_path_factory.mktemp("bundle") / "chest_xray")


@pytest.fixture(scope="module")
def predicted(model_file, images, tmp_path_factory) -> pd.DataFrame:
    frame, failures = score(model_file, images, cache_dir=tmp_path_factory.mktemp("cache"), calls=True)
    assert failures == []
    return frame


def _as_the_servers(checkpoint, root: Path, sites: dict[str, str]) -> Path:
    """``checkpoint`` as the server's best model in ``root/app_server``, beside its union table (class -> the sites
    that label it, ``;``-joined)."""
    folder = root / "app_server"
    folder.mkdir()
    rows = [f"{name},{held},{held.count(';') + 1},{'yes' if ';' in held else 'no'}" for name, held in sites.items()]
    (folder / "union_classes.csv").write_text("\n".join(["class,sites,labelled_by,shared", *rows]) + "\n")
    return save_checkpoint(folder / "best_FL_global_model.pt", checkpoint.state, CLASSES, **checkpoint.meta)


def _metadata(root: Path) -> dict:
    return json.loads((root / "configs" / "metadata.json").read_text())


def _run_bundle(root: Path, out: Path, *arguments: str) -> pd.DataFrame:
    """``python -m monai.bundle run --config_file configs/inference.json ...`` from the bundle's folder."""
    command = [sys.executable, "-m", "monai.bundle", "run", "--config_file", "configs/inference.json"]
    env = {**os.environ, "PYTHONPATH": ""}  # the bundle runs without this package on the path
    result = subprocess.run(
        [*command, *arguments, "--output_file", str(out)], cwd=root, env=env, capture_output=True, text=True
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return pd.read_csv(out)


def test_the_bundle_has_monais_layout_and_its_metadata_passes_monais_checks(exported):
    from monai.bundle import verify_metadata, verify_net_in_out

    root = exported.root
    names = {str(path.relative_to(root)) for path in root.rglob("*") if path.is_file()}
    assert names == {
        "configs/metadata.json",
        "configs/inference.json",
        "models/model.pt",
        "models/model.ts",
        "models/model.onnx",
        "scripts/__init__.py",
        "scripts/predictions.py",
        "scripts/grayscale.py",
        "scripts/dicom.py",
        "scripts/bundle_reader.py",
        "docs/README.md",
    }
    meta_file = str(root / "configs" / "metadata.json")
    verify_metadata(meta_file=meta_file, filepath=str(SCHEMA))  # the schema file is there: nothing is downloaded
    verify_net_in_out(  # builds network_def, feeds the declared input shape, checks the declared output channels
        net_id="network_def", meta_file=meta_file, config_file=str(root / "configs" / "inference.json"), device="cpu"
    )
    weights = torch.load(root / "models" / "model.pt", weights_only=True)
    from monai.networks.nets import DenseNet

    network = json.loads((root / "configs" / "inference.json").read_text())["network_def"]
    arguments = {**NETWORK_ARGUMENTS[SMOKE_DENSENET], "block_config": [2, 2, 2, 2]}
    assert network == {"_target_": "DenseNet", "spatial_dims": 2, **arguments, "in_channels": 3, "out_channels": 3}
    DenseNet(spatial_dims=2, in_channels=3, out_channels=3, **arguments).load_state_dict(weights)  # MONAI's own


def test_the_metadata_names_the_classes_in_head_order_with_aliases_thresholds_and_inputs(exported):
    metadata = _metadata(exported.root)
    output = metadata["network_data_format"]["outputs"]["pred"]
    assert output["channel_def"] == {"0": "Pleural Effusion", "1": "Mass", "2": "Tuberculosis"}
    assert (output["type"], output["format"], output["num_channels"], output["value_range"]) == (
        "probabilities",
        "classes",
        3,
        [0, 1],
    )
    image = metadata["network_data_format"]["inputs"]["image"]
    assert (image["num_channels"], image["spatial_shape"], image["dtype"]) == (3, [32, 32], "float32")
    extra = metadata[EXTRA_KEY]
    assert extra["aliases"] == {"Pleural Effusion": ["Effusion"], "Mass": [], "Tuberculosis": []}
    assert extra["thresholds"] == {"Pleural Effusion": 0.5, "Tuberculosis": 0.45}
    assert extra["preprocessing"] == PREPROCESSING and extra["round"] == 3
    assert extra["sites_labelling"] is None and extra["validation"] is None  # no server files next to this model
    assert "not known" in (exported.root / "docs" / "README.md").read_text()
    assert (
        extra["recalibration"] is None
        and "Probabilities are not calibrated." in (exported.root / "docs" / "README.md").read_text()
    )
    assert extra["head_rows_refit"] is None and "refit" not in (exported.root / "docs" / "README.md").read_text()
    assert set(exported.differences) == {"model.ts", "model.onnx"}
    assert all(value <= TOLERANCE for value in exported.differences.values())


def test_the_bundles_scripts_are_the_packages_own_definitions(exported):
    copied = exported.root / "scripts" / "grayscale.py"
    assert copied.read_bytes() == Path(grayscale.__file__).read_bytes()


def test_torchscript_and_onnx_give_predicts_probabilities_on_the_bundles_inputs(exported, images, predicted):
    import onnxruntime
    from monai.bundle import ConfigParser
    from monai.data.torchscript_utils import load_net_with_metadata

    root = exported.root
    parser = ConfigParser()
    parser.read_config(str(root / "configs" / "inference.json"))
    parser.read_meta(str(root / "configs" / "metadata.json"))
    parser["dataset_dir"] = str(images)
    sys.path.insert(0, str(root))  # the config imports the bundle's scripts package
    try:
        batches = [batch["image"].as_tensor() for batch in parser.get_parsed_content("dataloader")]
        rows = parser.get_parsed_content("rows")
    finally:
        sys.path.remove(str(root))
        for name in [name for name in sys.modules if name == "scripts" or name.startswith("scripts.")]:
            del sys.modules[name]
    inputs = torch.cat(batches)
    expected = predicted.set_index("path").loc[rows, CLASSES].to_numpy(np.float64)

    scripted, metadata, _ = load_net_with_metadata(str(root / "models" / "model.ts"))
    assert metadata["network_data_format"]["outputs"]["pred"]["channel_def"]["2"] == "Tuberculosis"
    from_torchscript = scripted(inputs).detach().numpy()
    session = onnxruntime.InferenceSession(str(root / "models" / "model.onnx"), providers=["CPUExecutionProvider"])
    from_onnx = session.run(None, {"image": inputs.numpy()})[0]  # all five images in one batch: its size is free
    assert inputs.shape == (6, 3, 32, 32)
    assert np.abs(from_torchscript - expected).max() <= TOLERANCE
    assert np.abs(from_onnx - expected).max() <= TOLERANCE
    assert expected.min() < 0.3 and expected.max() > 0.7  # a model whose outputs differ between images


def test_monai_bundle_run_writes_predicts_csv(exported, images, predicted, tmp_path):
    written = _run_bundle(exported.root, tmp_path / "bundle.csv", "--dataset_dir", str(images))
    assert list(written.columns) == list(predicted.columns)
    assert list(written.columns)[-2:] == ["Pleural Effusion (call)", "Tuberculosis (call)"]
    assert written["path"].tolist() == predicted["path"].tolist() and set(written["status"]) == {"ok"}
    scores = np.abs(written[CLASSES].to_numpy() - predicted[CLASSES].to_numpy(np.float64))
    assert scores.max() <= TOLERANCE
    calls = ["Pleural Effusion (call)", "Tuberculosis (call)"]
    assert (written[calls].to_numpy() == predicted[calls].to_numpy()).all()


def test_every_file_of_the_input_folder_is_scored_or_listed_with_its_reason_in_one_line(exported, model_file, tmp_path):
    """The bundle and ``predict`` on a hospital's folder: a chest film without a suffix is scored (read by content),
    a CT, an MR, a text file and a truncated PNG are each a row with why not, and a line of stderr, never a
    traceback; the counts add up, and ``accept_non_chest`` scores the CT."""
    folder = tmp_path / "export"
    folder.mkdir()
    film = pydicom.dcmread(get_testdata_file("RG1_UNCR.dcm"))
    pixels = film.pixel_array[::16, ::16].copy()
    film.Rows, film.Columns, film.PixelData = *pixels.shape, pixels.tobytes()
    film.save_as(folder / "1.2.840.10008.1")  # a PACS export: no suffix
    (folder / "ct.dcm").write_bytes(Path(get_testdata_file("CT_small.dcm")).read_bytes())
    (folder / "mr.dcm").write_bytes(Path(get_testdata_file("MR_small.dcm")).read_bytes())
    (folder / "notes.txt").write_text("reviewed by Dr. X\n")
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (40, 40), dtype=np.uint8)).save(folder / "ok.png")
    (folder / "cut.png").write_bytes((folder / "ok.png").read_bytes()[:60])
    command = [sys.executable, "-m", "monai.bundle", "run", "--config_file", "configs/inference.json"]
    result = subprocess.run(
        [*command, "--dataset_dir", str(folder), "--output_file", str(tmp_path / "bundle.csv")],
        cwd=exported.root,
        env={**os.environ, "PYTHONPATH": ""},
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    written = pd.read_csv(tmp_path / "bundle.csv").set_index("path")
    names = ["1.2.840.10008.1", "ct.dcm", "cut.png", "mr.dcm", "notes.txt", "ok.png"]
    assert written.index.tolist() == [str(folder / name) for name in names]
    status = {Path(path).name: text for path, text in written["status"].items()}
    assert status["1.2.840.10008.1"] == "ok" and status["ok.png"] == "ok"
    assert status["ct.dcm"] == "its Modality is CT, not radiography (CR or DX): not a chest radiograph; refused " \
        "(accept_non_chest overrides)"  # fmt: skip
    assert status["mr.dcm"].startswith("its Modality is MR, not radiography")
    assert status["notes.txt"] == "cannot decode image: not PNG, JPEG, TIFF, BMP or DICOM"
    assert status["cut.png"].startswith("cannot decode image (OSError: ")
    assert written.loc[written["status"] != "ok", CLASSES].isna().all().all()
    refused = [line for line in result.stderr.splitlines() if ": not scored: " in line]
    assert sorted(Path(line.split(": not scored: ")[0]).name for line in refused) == sorted(
        ["ct.dcm", "cut.png", "mr.dcm", "notes.txt"]
    )
    assert f"scoring 2 of the 6 file(s) under {folder}" in result.stderr
    assert "Traceback" not in result.stderr
    predicted, failures = score(model_file, folder, cache_dir=tmp_path / "cache")
    assert predicted["path"].tolist() == written.index.tolist()
    assert predicted["status"].tolist() == written["status"].tolist() and len(failures) == 4
    opened, _ = score(model_file, folder, cache_dir=tmp_path / "cache", preprocessing={"accept_non_chest": True})
    assert opened.set_index("path").loc[str(folder / "ct.dcm"), "status"] == "ok"


def test_the_command_line_exports_without_onnx_and_refuses_a_used_folder(tmp_path, capsys):
    """On DenseNet121 (the other tests export the smoke network): MONAI's own ``DenseNet121`` in the bundle."""
    model_file = _model_file(tmp_path, {key: value for key, value in PREPROCESSING.items() if key != NETWORK_KEY})
    out = tmp_path / "exported"
    aliases = tmp_path / "label_aliases.json"
    aliases.write_text(json.dumps({"Fluid": "Pleural Effusion", "TB": "Tuberculosis"}))  # the job's own
    options = ["--no-onnx", "--version", "2.1.0", "--label-aliases", str(aliases)]
    assert main(["export-bundle", str(model_file), "--out", str(out), *options]) == 0
    printed = capsys.readouterr().out
    assert "no model.onnx: not asked for (--no-onnx)" in printed and "model.ts: probabilities within" in printed
    metadata = _metadata(out)
    assert metadata["version"] == "2.1.0" and "model.onnx" not in metadata[EXTRA_KEY]["model_files"]
    assert metadata[EXTRA_KEY]["aliases"] == {
        "Pleural Effusion": ["Effusion", "Fluid"],
        "Mass": [],
        "Tuberculosis": ["TB"],
    }
    assert not (out / "models" / "model.onnx").exists()
    network = json.loads((out / "configs" / "inference.json").read_text())["network_def"]
    assert network == {"_target_": "DenseNet121", "spatial_dims": 2, "in_channels": 3, "out_channels": 3}
    assert main(["export-bundle", str(model_file), "--out", str(out), "--no-onnx"]) == 2
    assert "exists and is not empty" in capsys.readouterr().err
    assert main(["export-bundle", str(model_file), "--out", str(out), "--no-onnx", "--overwrite"]) == 0


def test_without_the_onnx_extra_the_export_says_so_or_refuses_when_onnx_is_required(model_file, tmp_path, monkeypatch):
    monkeypatch.setattr(bundle_module, "_onnx_unavailable", lambda: "onnxscript not installed (pip install ...)")
    exported = export_bundle(model_file, tmp_path / "without")
    assert exported.left_out == {"model.onnx": "onnxscript not installed (pip install ...)"}
    assert not (tmp_path / "without" / "models" / "model.onnx").exists()
    with pytest.raises(ExportError, match="ONNX export asked for, but onnxscript not installed"):
        export_bundle(model_file, tmp_path / "required", onnx=True)
    assert not (tmp_path / "required").exists()  # nothing half-written


def test_an_exported_file_that_computes_other_probabilities_is_refused():
    expected = np.array([[0.2, 0.9]])
    assert bundle_module._difference(expected + 5e-6, expected, "model.ts") == pytest.approx(5e-6)
    with pytest.raises(ExportError, match=r"model\.onnx computes probabilities up to 1\.00e-03"):
        bundle_module._difference(expected + 1e-3, expected, "model.onnx")
    with pytest.raises(ExportError, match=r"model\.ts returned shape"):
        bundle_module._difference(expected[:, :1], expected, "model.ts")


def test_a_class_name_monais_config_parser_would_run_is_refused(tmp_path):
    model = NamedDenseNet(["$__import__('os').system('id')", "Mass"])
    path = save_checkpoint(tmp_path / "model.pt", model.state_dict(), model.class_names, **{PREPROCESSING_KEY: {}})
    with pytest.raises(ExportError, match="MONAI's config parser reads as code"):
        export_bundle(path, tmp_path / "bundle", onnx=False)


def test_the_servers_union_table_and_history_next_to_the_model_are_read(model_file, tmp_path):
    checkpoint = load_checkpoint(model_file)
    server_model = _as_the_servers(
        checkpoint, tmp_path, {"Pleural Effusion": "a;b;c", "Mass": "a;b", "Tuberculosis": "c"}
    )
    folder = server_model.parent
    sites = {
        "a": {"val_auroc/Pleural Effusion": 0.8, "val_auroc/Mass": 0.6},
        "b": {"val_auroc/Pleural Effusion": 0.9, "val_auroc/Mass": 0.7},
        "c": {"val_auroc/Pleural Effusion": 0.7, "val_auroc/Tuberculosis": 0.95},
    }
    validation = {"sites": sites, "mean_val_auroc": 0.81, "mean_val_loss": 0.25}
    (folder / "round_history.json").write_text(json.dumps([{"round": 2}, {"round": 3, "validation": validation}]))
    extra = _metadata(export_bundle(server_model, tmp_path / "bundle", onnx=False).root)[EXTRA_KEY]
    assert extra["sites_labelling"] == {"Pleural Effusion": 3, "Mass": 2, "Tuberculosis": 1}
    per_class = extra["validation"]["per_class"]
    assert per_class["Pleural Effusion"] == {"auroc": pytest.approx(0.8), "sites": 3}
    assert per_class["Mass"] == {"auroc": pytest.approx(0.65), "sites": 2}
    assert per_class["Tuberculosis"] == {"auroc": pytest.approx(0.95), "sites": 1}
    assert (extra["validation"]["round"], extra["validation"]["sites"]) == (3, 3)
    readme = (tmp_path / "bundle" / "docs" / "README.md").read_text()
    assert "| 0 | Pleural Effusion | Effusion | 3 | 0.500 | 0.800 (3) |" in readme
    assert "mean AUROC 0.810" in readme


def _snippets(page: Path) -> list[str]:
    """The python blocks that follow the page's "tested by tests/test_bundle_export.py" markers."""
    text = page.read_text()
    marker = "<!-- tested by tests/test_bundle_export.py"
    return [re.search(r"```python\n(.*?)```", part, re.S).group(1) for part in text.split(marker)[1:]]


def test_the_docs_torchscript_and_onnx_snippets_run_on_an_exported_bundle(exported, model_file):
    network = load_checkpoint(model_file).build_model().eval()
    with torch.inference_mode():
        expected = torch.sigmoid(network(torch.zeros(1, 3, 32, 32))).numpy()  # the snippets feed zeros
    page = Path(__file__).parents[1] / "docs" / "using-the-model.md"
    for snippet, batch in zip(_snippets(page), (2, 4), strict=True):
        namespace: dict = {}
        exec(compile(snippet.replace("chest_xray_bundle", str(exported.root)), str(page), "exec"), namespace)
        probabilities = np.asarray(namespace["probabilities"])
        assert probabilities.shape == (batch, len(CLASSES))
        assert np.abs(probabilities - expected).max() <= TOLERANCE
        assert namespace.get("class_names", CLASSES) == CLASSES


def test_classes_too_few_sites_label_can_be_left_out_of_the_bundle(model_file, tmp_path):
    folder = tmp_path / "app_server"
    folder.mkdir()
    checkpoint = load_checkpoint(model_file)
    server_model = save_checkpoint(folder / "best_FL_global_model.pt", checkpoint.state, CLASSES, **checkpoint.meta)
    with pytest.raises(ExportError, match="needs the union table"):
        export_bundle(server_model, tmp_path / "no_counts", onnx=False, min_sites=2)
    (folder / "union_classes.csv").write_text(
        "class,sites,labelled_by,shared\nPleural Effusion,a;b,2,yes\nMass,a;b;c,3,yes\nTuberculosis,c,1,no\n"
    )
    root = export_bundle(server_model, tmp_path / "bundle", onnx=False, min_sites=2).root
    metadata = _metadata(root)
    assert metadata["network_data_format"]["outputs"]["pred"]["channel_def"] == {"0": "Pleural Effusion", "1": "Mass"}
    extra = metadata[EXTRA_KEY]
    assert extra["classes_left_out"] == {"labelled_by_fewer_sites_than": 2, "count": 1}  # how many, never which
    assert (
        "Tuberculosis" not in json.dumps(metadata) and "Tuberculosis" not in (root / "docs" / "README.md").read_text()
    )
    weights = torch.load(root / "models" / "model.pt", weights_only=True)["class_layers.out.weight"]
    assert torch.equal(weights, checkpoint.state["class_layers.out.weight"][:2])  # the kept rows, unchanged
    with pytest.raises(ExportError, match="no class of the model is labelled by 4 or more sites"):
        export_bundle(server_model, tmp_path / "none", onnx=False, min_sites=4)


def test_a_recalibrated_model_exports_its_shifts_in_its_weights_and_says_so(model_file, tmp_path):
    """A site's model recalibrated by ``evaluate --recalibrate-out``: the bundle's weights carry the shifted biases
    (so TorchScript and ONNX give the recalibrated probabilities, checked as every export is), its metadata the
    shifts of the kept classes only and how many recalibrations they sum, never where they were fitted; its README
    says the probabilities were recalibrated and that the validation loss is the federation's model's."""
    shifts = {"Pleural Effusion": 1.25, "Tuberculosis": -0.5}
    recalibrated = save_recalibrated(model_file, shifts, "site-a (validation split)", tmp_path / "recalibrated.pt")
    checkpoint = load_checkpoint(recalibrated)
    server_model = _as_the_servers(
        checkpoint, tmp_path, {"Pleural Effusion": "a;b", "Mass": "a;b;c", "Tuberculosis": "c"}
    )
    folder = server_model.parent
    history = [{"round": 3, "model": "after round 3", "validation": {"sites": {"a": {"val_loss": 0.4, "val_mean_auroc":
               0.7, "val_auroc": {"Mass": 0.7}}}, "mean_val_loss": 0.4, "mean_val_auroc": 0.7}}]  # fmt: skip
    (folder / "round_history.json").write_text(json.dumps(history))
    exported = export_bundle(server_model, tmp_path / "bundle", min_sites=2)
    root = exported.root
    assert set(exported.differences) <= {"model.ts", "model.onnx"} and "model.ts" in exported.differences
    bias = torch.load(root / "models" / "model.pt", weights_only=True)["class_layers.out.bias"]
    before = load_checkpoint(model_file).state["class_layers.out.bias"]
    torch.testing.assert_close(bias, before[:2] + torch.tensor([1.25, 0.0]), atol=1e-6, rtol=0)
    metadata = _metadata(root)
    assert metadata[EXTRA_KEY]["recalibration"]["shifts"] == {"Pleural Effusion": 1.25}
    assert metadata[EXTRA_KEY]["recalibration"]["recalibrations"] == 1
    assert "Tuberculosis" not in json.dumps(metadata) and "site-a" not in json.dumps(metadata)
    assert checkpoint.meta[RECALIBRATION_KEY]["shifts"] == shifts
    readme = " ".join((root / "docs" / "README.md").read_text().split())
    assert (
        "Probabilities were recalibrated in the large to a site's own validation split (one intercept per finding, "
        "to that split's prevalence, for 1 of them); their spread is not." in readme
    )
    assert "Tuberculosis" not in readme and "site-a" not in readme
    assert "The loss is the federation's model's, before a site recalibrated it (the AUROCs are the same)." in readme
    # a bundle none of whose classes was shifted (the one that was is left out): not calibrated, as it was
    only = save_recalibrated(model_file, {"Tuberculosis": -0.5}, "site-c (validation split)", folder / "tb.pt")
    plain = export_bundle(only, tmp_path / "plain", onnx=False, min_sites=2)
    assert _metadata(plain.root)[EXTRA_KEY]["recalibration"] is None
    assert "Probabilities are not calibrated." in (plain.root / "docs" / "README.md").read_text()
    with pytest.raises(ValueError, match="must be finite numbers"):
        save_recalibrated(model_file, {"Mass": float("nan")}, "x", tmp_path / "nan.pt")


def test_a_model_whose_rows_a_site_refitted_exports_them_and_says_its_validation_is_the_federations(
    model_file, tmp_path
):
    """A site's copy with head rows refitted by ``evaluate --refit-rows-out``: the bundle's weights carry the refitted
    row, its metadata names the kept classes refitted and the rule, never where nor a class left out; its README marks
    those findings' validation AUROCs as the federation's model's, before the refit, and says so under its limits."""
    features = load_checkpoint(model_file).state["class_layers.out.weight"].shape[1]
    rows = {
        "Pleural Effusion": RefitRow(np.linspace(-1.0, 1.0, features), 0.75, 0.1),
        "Tuberculosis": RefitRow(np.full(features, 0.25), -0.5, 1.0),
    }
    refitted = save_refit_rows(model_file, rows, "site-a (training and validation splits)", tmp_path / "refit.pt")
    checkpoint = load_checkpoint(refitted)
    server_model = _as_the_servers(
        checkpoint, tmp_path, {"Pleural Effusion": "a;b", "Mass": "a;b;c", "Tuberculosis": "c"}
    )
    sites = {"a": {"val_auroc/Pleural Effusion": 0.8, "val_auroc/Mass": 0.7}}
    history = [{"round": 3, "validation": {"sites": sites, "mean_val_loss": 0.4, "mean_val_auroc": 0.75}}]
    (server_model.parent / "round_history.json").write_text(json.dumps(history))
    root = export_bundle(server_model, tmp_path / "bundle", onnx=False, min_sites=2).root
    weights = torch.load(root / "models" / "model.pt", weights_only=True)
    torch.testing.assert_close(
        weights["class_layers.out.weight"][0], torch.linspace(-1.0, 1.0, features, dtype=torch.float32)
    )
    assert float(weights["class_layers.out.bias"][0]) == 0.75
    metadata = _metadata(root)
    refit = metadata[EXTRA_KEY]["head_rows_refit"]
    assert refit == {"classes": ["Pleural Effusion"], "rule": checkpoint.meta["head_rows_refit"]["rule"]}
    assert "Tuberculosis" not in json.dumps(metadata) and "site-a" not in json.dumps(metadata)
    readme = (root / "docs" / "README.md").read_text()
    assert "| 0 | Pleural Effusion | Effusion | 2 | - | 0.800 (1), before the refit |" in readme
    assert "| 1 | Mass | - | 3 | - | 0.700 (1) |" in readme
    said = " ".join(readme.split())
    assert (
        "- Validated only on the sites' validation splits, not on an external test set. The head rows of 1 "
        "finding(s) were refitted to a site's own images after the federation trained them" in said
    )
    assert "every validation figure here is the federation's model's, before that refit." in said
    assert "Tuberculosis" not in readme and "site-a" not in readme
    both = save_recalibrated(server_model, {"Mass": 0.5}, "site-b (validation split)", server_model.parent / "both.pt")
    readme = (export_bundle(both, tmp_path / "both", onnx=False, min_sites=2).root / "docs" / "README.md").read_text()
    assert "before a site recalibrated it (the AUROCs are the same, but the refitted findings')." in " ".join(
        readme.split()
    )
    # without the server's history: no validation figure to speak of; every refitted row left out: nothing refitted
    (server_model.parent / "round_history.json").unlink()
    unvalidated = export_bundle(server_model, tmp_path / "alone", onnx=False, min_sites=2).root / "docs" / "README.md"
    said = " ".join(unvalidated.read_text().split())
    assert "| 0 | Pleural Effusion | Effusion | 2 | - | refitted at a site |" in unvalidated.read_text()
    assert (
        "after the federation trained them (`evaluate --refit-rows-out`: they no longer carry what other sites " in said
    )
    assert "before that refit" not in said
    only = save_refit_rows(model_file, {"Tuberculosis": rows["Tuberculosis"]}, "site-c", server_model.parent / "tb.pt")
    plain = export_bundle(only, tmp_path / "plain", onnx=False, min_sites=2).root
    assert (
        _metadata(plain)[EXTRA_KEY]["head_rows_refit"] is None
        and "refit" not in (plain / "docs" / "README.md").read_text()
    )


def test_the_offline_metadata_check_runs_as_the_docs_write_it(exported):
    """docs/using-the-model.md's verify_metadata command, as written (the bundle's folder put for
    ``chest_xray_bundle``), from the repository's root with every proxy pointing nowhere: it passes without a
    download."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "using-the-model.md").read_text()
    [command] = [
        block.replace("\\\n", " ").strip()
        for block in re.findall(r"```bash\n(.*?)```", page, re.DOTALL)
        if "verify_metadata" in block
    ]
    command = command.replace("chest_xray_bundle/", f"{exported.root}/").replace("python ", f"{sys.executable} ", 1)
    nowhere = "http://127.0.0.1:9"
    proxies = {name: nowhere for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY")}
    env = {**os.environ, **proxies, "NO_PROXY": "", "no_proxy": ""}
    repository = Path(__file__).resolve().parents[1]
    result = subprocess.run(command, shell=True, cwd=repository, env=env, capture_output=True, text=True)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "verified" in (result.stdout + result.stderr).lower()
