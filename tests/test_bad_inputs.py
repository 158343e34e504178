"""Nothing lost, nothing refused by surprise: every bad input of a new user or hospital IT, as the command line meets
it (input -> exit code and message), and what is kept."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from surgical_aggregation.cli import main
from surgical_aggregation.core.errors import SiteConfigError, StorageError
from surgical_aggregation.experiments import grids
from surgical_aggregation.flare import simulation
from surgical_aggregation.flare.recipe import SurgicalAggregationRecipe, nih_chexpert_recipe
from surgical_aggregation.flare.simulation import COMPLETED_FILE, _move_aside, one_run_at_a_time, usable_workspace

REPOSITORY = Path(__file__).resolve().parents[1]
MAIN_JOB = REPOSITORY / "jobs" / "nih_chexpert"
TEMPLATE = REPOSITORY / "provisioning" / "site_config.template.json"


@dataclass
class Case:
    """A command run on what ``setup`` wrote in a fresh folder; its exit code, a part of its output, and what must
    hold afterwards."""

    setup: Callable[[Path], list[str]]
    code: int
    message: str
    after: Callable[[Path], None] | None = None


def _csv_site(root: Path, rows: str, header: str = "path,patient_id,Mass") -> Path:
    images = root / "img"
    images.mkdir(parents=True, exist_ok=True)
    for index in range(4):  # textured: a near-constant image is refused as no radiograph
        pixels = np.random.default_rng(index).integers(0, 256, (32, 32), dtype=np.uint8)
        Image.fromarray(pixels).save(images / f"{index}.png")
    csv = root / "labels.csv"
    csv.write_text(f"{header}\n{rows}")
    return csv


def _prepare(csv: Path, root: Path, *extra: str) -> list[str]:
    return ["prepare", "--kind", "csv", "--data", str(csv), "--size", "32", "--cache-dir", str(root / "cache"), *extra]


def _image(root: Path, width: int, height: int, name: str = "0.png") -> Path:
    """A CSV site of one image of this size (a black PNG: large ones compress to little)."""
    csv = _csv_site(root, f"img/{name},p0,1\n")
    Image.new("L", (width, height)).save(root / "img" / name)
    return csv


def _site_config(root: Path, **fields) -> Path:
    """The kit's template for the main job, filled in as the hospital IT guide says (with ``fields`` changed)."""
    config = json.loads(TEMPLATE.read_text())
    data = root / "nih"
    if not data.exists():
        from surgical_aggregation.images.synthetic import generate_nih

        generate_nih(data, n_patients=30, image_size=32, label_source="builtin")
    config["data"]["location"] = str(data)
    config["cache_dir"] = str(root / "cache")
    for name, value in fields.items():
        target = config["data"] if name in config["data"] else config
        target[name] = value
    path = root / "local" / "surgical_aggregation.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(config))
    return path


def _check_site(root: Path, job: Path = MAIN_JOB, **fields) -> list[str]:
    return ["check-site", "--job", str(job), "--config", str(_site_config(root, **fields)), "--site", "site-nih"]


def _scratch_job(root: Path) -> Path:
    """The main job from scratch: FedAvg's backbone, BatchNorm trained (the default job freezes it: FedBN+)."""
    assert main(["write-job", "--start", "scratch", "--out", str(root / "scratch-job")]) == 0
    return root / "scratch-job"


def _user_folder(root: Path) -> list[str]:
    (root / "important").mkdir()
    (root / "important" / "thesis.txt").write_text("precious")
    return ["write-job", "--out", str(root / "important")]


def _edited_job(root: Path) -> list[str]:
    assert main(["write-job", "--out", str(root / "job")]) == 0
    edited = root / "job" / "app_site-nih" / "config" / "site_configs" / "site-nih.json"
    edited.write_text(edited.read_text().replace('"batch_size": 32', '"batch_size": 16'))
    return ["write-job", "--out", str(root / "job")]


def _yaml_aliases(root: Path) -> list[str]:
    (root / "aliases.yaml").write_text("TB: Tuberculosis\nTB: Mass\n")
    return ["write-job", "--out", str(root / "job"), "--label-aliases", str(root / "aliases.yaml")]


def _relative_location(root: Path) -> list[str]:
    config = json.loads(TEMPLATE.read_text())
    config["data"]["location"] = "data/NIH"  # relative: from the config file's folder, local/
    path = root / "local" / "surgical_aggregation.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(config))
    return ["check-site", "--job", str(MAIN_JOB), "--config", str(path), "--site", "site-nih"]


def _dicom_named_png(root: Path) -> list[str]:
    from surgical_aggregation.images.model import NamedDenseNet
    from surgical_aggregation.training.checkpoint import save_checkpoint

    images = root / "img"
    images.mkdir()
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (32, 32), dtype=np.uint8)).save(images / "fine.png")
    (images / "scan.png").write_bytes(b"\x00" * 128 + b"DICM" + b"\x00" * 64)  # a DICOM file's preamble
    model = NamedDenseNet(["Mass"])
    preprocessing = {"image_size": 32, "in_channels": 1, "imagenet_normalize": True}
    save_checkpoint(root / "model.pt", model.state_dict(), model.class_names, preprocessing=preprocessing)
    cache = ["--cache-dir", str(root / "cache")]
    return ["predict", "--model", str(root / "model.pt"), "--input", str(images), "--out", str(root / "s.csv"), *cache]


def _scores_list_every_input(root: Path) -> None:
    import pandas as pd

    scores = pd.read_csv(root / "s.csv").set_index("path")
    assert scores.loc[str(root / "img" / "fine.png"), "status"] == "ok"
    assert scores.loc[str(root / "img" / "scan.png"), "status"] == "a DICOM object with no pixel data (not an image)"


def _predict_into_a_folder(root: Path) -> list[str]:
    (root / "out").mkdir()
    return ["predict", "--model", str(root / "m.pt"), "--input", str(root), "--out", str(root / "out")]


def _csv_config(root: Path, header: str = "path,patient_id,Mass", **options) -> list[str]:
    """check-site on a csv site with this ``header`` (its label columns 1, 0, 1, 0 each) and ``options``."""
    labels = header.count(",") - 1
    rows = "".join(f"img/{index}.png,p{index}" + f",{1 - index % 2}" * labels + "\n" for index in range(4))
    csv = _csv_site(root, rows, header)
    config = {"data": {"kind": "csv", "location": str(csv), "options": options}, "image_size": 64}
    (root / "site.json").write_text(json.dumps(config))
    return ["check-site", "--job", str(MAIN_JOB), "--config", str(root / "site.json"), "--site", "site-nih"]


def _model(root: Path) -> Path:
    from surgical_aggregation.images.model import NamedDenseNet
    from surgical_aggregation.training.checkpoint import save_checkpoint

    model = NamedDenseNet(["Mass"])
    preprocessing = {"image_size": 32, "in_channels": 1, "imagenet_normalize": True}
    return save_checkpoint(root / "model.pt", model.state_dict(), model.class_names, preprocessing=preprocessing)


def _predict_one_image(root: Path) -> list[str]:
    _csv_site(root, "")
    cache = ["--cache-dir", str(root / "cache")]
    image = str(root / "img" / "2.png")
    return ["predict", "--model", str(_model(root)), "--input", image, "--out", str(root / "s.csv"), *cache]


CASES = {
    "write-job into a folder holding a user's file": Case(
        _user_folder,
        2,
        "holds files write-job did not write (thesis.txt): write-job replaces only an empty folder or a job folder it "
        "wrote; choose another --out, or pass --force",
        lambda root: (root / "important" / "thesis.txt").read_text() == "precious" or pytest.fail("lost"),
    ),
    "write-job over a job folder someone edited": Case(
        _edited_job, 2, "holds files added or changed since write-job wrote it (app_site-nih/config/site_configs/"
    ),
    "a header-only CSV": Case(
        lambda root: _prepare(_csv_site(root, ""), root), 2, "no images in this csv data (an empty label file?)"
    ),
    "NA as a label value": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,NA\n"), root),
        2,
        "column 'Mass': value 'NA' in data row 1; expected 1, 0, -1 or blank",
    ),
    "an image of 81 megapixels": Case(
        lambda root: _prepare(_image(root, 9000, 9000), root, "--on-error", "error"),
        2,
        "9000 x 9000 pixels, more than the 64,000,000 an image may have",
    ),
    "an image of 81 megapixels, left out": Case(
        lambda root: _prepare(_image(root, 9000, 9000), root, "--on-error", "skip"),
        2,  # the only image is left out: nothing to prepare
        "9000 x 9000 pixels, more than the 64,000,000 an image may have",
    ),
    "a 1 x 1 image": Case(
        lambda root: _prepare(_image(root, 1, 1), root, "--on-error", "error"),
        2,
        "1 x 1 pixels, a side below the minimum of 16",
    ),
    "a bookkeeping 0/1 column": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1,0\n", "path,patient_id,Mass,Reviewed"), root),
        2,
        "labels.csv: column 'Reviewed' is not a finding this bundle knows; a column that is not a label: list the "
        "label columns (data.options.label_columns); a finding of your own: declare it (data.options.new_classes)",
    ),
    "a repeated header": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1,0\n", "path,patient_id,Atelectasis,Atelectasis"), root),
        2,
        "labels.csv: the header repeats the column 'Atelectasis' (columns 3 and 4)",
    ),
    "a Latin plural of a finding": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1\n", "path,patient_id,pneumothoraces"), root),
        2,
        "column 'pneumothoraces' is not a finding this bundle knows (likely 'Pneumothorax': rename the column or map "
        "it in an alias file)",
    ),
    "a semicolon-separated CSV": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png;p0;1\n", "path;patient_id;Mass"), root),
        2,
        "its header is one column 'path;patient_id;Mass': the file looks separated by semicolons, not commas",
    ),
    "a bookkeeping column at check-site": Case(
        lambda root: _csv_config(root, header="path,patient_id,Mass,Reviewed"),
        2,
        "column 'Reviewed' is not a finding this bundle knows",
    ),
    "a DICOM file named .png": Case(_dicom_named_png, 0, "not scored", _scores_list_every_input),
    "predict --out a folder": Case(_predict_into_a_folder, 2, "is a folder; give the file to write"),
    "a repeated key in a YAML alias file": Case(
        _yaml_aliases, 2, "entry 'TB' appears twice, mapped to 'Tuberculosis' and 'Mass'"
    ),
    "gpus: 2 on a machine without a GPU": Case(
        lambda root: _check_site(root, gpus=2),
        2,
        'gpus: 2, but this machine has no GPU (device \'auto\' found none): set "gpus": 1, or "device": "cpu"',
    ),
    "generate --patients 0": Case(
        lambda root: ["generate", "--out", str(root), "--patients", "0"], 2, "must be at least 1"
    ),
    "a relative data.location": Case(
        _relative_location,
        2,
        "local/data/NIH",  # tried from the config file's folder, shown absolute
    ),
    "the template's placeholder left in": Case(
        lambda root: ["check-site", "--job", str(MAIN_JOB), "--config", str(TEMPLATE), "--site", "site-nih"],
        2,
        "data.location still holds the template's placeholder",
    ),
    "DP-SGD at a site of a job whose BatchNorm trains": Case(
        lambda root: _check_site(
            root, _scratch_job(root), differential_privacy={"epsilon": 8, "noise_multiplier": 1.1}
        ),
        2,
        "this site: differential_privacy needs BatchNorm that does not learn from batch statistics (a batch's "
        "statistics mix its images, which per-image clipping cannot bound), but the job's backbone strategy 'fedavg' "
        "trains BatchNorm: run the job with backbone_strategy 'fedbn_plus' (BatchNorm frozen and in eval mode; only "
        "the rest trains)",
    ),
    "an uncertainty policy that does not exist": Case(
        lambda root: _csv_config(root, uncertainty="zero"),
        2,
        "data.options.uncertainty must be one of ['zeros', 'ones', 'ignore'], got 'zero'",
    ),
    "rows with a blank patient id": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,,1\nimg/1.png,p1,0\nimg/2.png, ,1\n"), root),
        2,
        "2 data row(s) with a blank 'patient_id' (rows 1, 3): every image needs its patient",
    ),
    "an image listed under two patients": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1\nimg/1.png,p1,0\nimg/0.png,p9,1\n"), root),
        2,
        "/img/0.png (rows 1, 3: patients p0, p9); give each image its one patient",
    ),
    "an image listed twice with other labels": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1\nimg/1.png,p1,0\nimg/0.png,p0,0\n"), root),
        0,
        "/img/0.png (rows 1, 3)",
    ),
    "a folder for kind csv": Case(
        lambda root: _prepare(_csv_site(root, "img/0.png,p0,1\n").parent, root),
        2,
        "is a folder, not a label file: give the CSV file itself (it holds labels.csv)",
    ),
    "predict on one image file": Case(_predict_one_image, 0, "scored 1 of 1 input(s) for 1 classes"),
    "an --initial-model that is not there": Case(
        lambda root: ["write-job", "--out", str(root / "job"), "--initial-model", str(root / "best.pt")],
        2,
        "best.pt: not found; give the model file (e.g. an earlier job's best_FL_global_model.pt)",
    ),
    "simulate --workspace on a file": Case(
        lambda root: (root / "ws").write_text("") or ["simulate", "--workspace", str(root / "ws")],
        2,
        "ws is a file, not a folder",
    ),
    "a site config at another image size than the job's": Case(
        lambda root: _check_site(root, image_size=224),
        2,
        "image_size 224 (the federation's: 64); one preprocessing per federation, so the model can be used on every "
        'site\'s data: set "image_size": 64 in its site config',
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_bad_input_gets_one_clear_line(case, tmp_path, capsys):
    expected = CASES[case]
    arguments = expected.setup(tmp_path)
    try:
        code = main(arguments)
    except SystemExit as exit:  # argparse's own refusals
        code = exit.code
    output = capsys.readouterr()
    text = output.out + output.err
    assert code == expected.code, text
    assert expected.message in text, text
    assert "Traceback" not in text
    if expected.after is not None:
        expected.after(tmp_path)


def test_write_job_replaces_its_own_unchanged_folder_and_force_replaces_anything(tmp_path):
    assert main(["write-job", "--out", str(tmp_path / "job")]) == 0
    assert main(["write-job", "--out", str(tmp_path / "job")]) == 0  # its own, unchanged: replaced
    (tmp_path / "job" / "notes.txt").write_text("mine")
    assert main(["write-job", "--out", str(tmp_path / "job")]) == 2
    assert main(["write-job", "--out", str(tmp_path / "job"), "--force"]) == 0  # asked for
    assert not (tmp_path / "job" / "notes.txt").exists()


def test_a_job_with_min_clients_above_its_sites_is_refused_when_written():
    with pytest.raises(SiteConfigError, match=r"min_clients 3 is more than its 2 site\(s\)"):
        nih_chexpert_recipe(controller={"min_clients": 3})
    bundle = nih_chexpert_recipe()
    SurgicalAggregationRecipe("two", bundle.site_configs, controller={"min_clients": 2})  # as many as sites: fine


def test_a_workspace_of_an_earlier_run_is_kept_and_a_partial_one_is_named_so(tmp_path):
    earlier = tmp_path / "nih_chexpert"
    (earlier / "server").mkdir(parents=True)
    (earlier / "server" / "log.txt").write_text("the earlier run")
    (earlier / COMPLETED_FILE).write_text("2026-11-26")
    moved = _move_aside(earlier)
    assert moved.name.startswith("nih_chexpert.earlier-") and (moved / "server" / "log.txt").read_text() == (
        "the earlier run"
    )
    assert not earlier.exists() and _move_aside(earlier) is None
    (earlier / "server" / "app_server").mkdir(parents=True)  # a run stopped before its end: no COMPLETED
    (earlier / "server" / "app_server" / "best_FL_global_model.pt").write_bytes(b"a round's model")
    assert _move_aside(earlier).name.startswith("nih_chexpert.incomplete-")


def test_a_second_run_into_a_workspace_in_use_is_refused_naming_the_first(tmp_path):
    in_use = rf"in use by a running 'nih_chexpert' \(process {os.getpid()}, started"
    first, second = one_run_at_a_time(tmp_path, "nih_chexpert"), one_run_at_a_time(tmp_path, "nih_chexpert")
    with first, pytest.raises(StorageError, match=in_use), second:
        pass
    with one_run_at_a_time(tmp_path, "nih_chexpert"):  # free again once the first has ended
        pass


def test_a_workspace_that_is_a_file_or_cannot_be_written_is_a_clear_error(tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    with pytest.raises(StorageError, match=r"a_file is a file, not a folder"):
        usable_workspace(tmp_path / "a_file")
    with pytest.raises(StorageError, match=r"cannot create the workspace .*a_file/ws: Not a directory"):
        usable_workspace(tmp_path / "a_file" / "ws")
    monkeypatch.setattr(simulation.os, "access", lambda *_: False)  # as a read-only folder is to a user (not root)
    with pytest.raises(StorageError, match=r"cannot write in the workspace .*ws \(permission denied\)"):
        usable_workspace(tmp_path / "ws")


def test_check_site_passes_the_filled_in_template_and_lists_what_it_read(tmp_path, capsys):
    assert main(_check_site(tmp_path)) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"site config {tmp_path / 'local' / 'surgical_aggregation.json'}: every field is valid"
    assert lines[1].startswith("data: nih layout, local data, ") and "patient-level splits: train " in lines[1]
    assert lines[2].startswith("labels, as the server reads them: 14 classes: Atelectasis, ")
    assert lines[3] == "preprocessing: image_size 64, in_channels 1, imagenet_normalize true, the federation's"
    assert lines[-1] == f"site-nih passes the handshake of job 'nih_chexpert' ({MAIN_JOB})"


def test_check_site_names_a_new_class_and_unreadable_images(tmp_path, capsys):
    csv = _csv_site(tmp_path, "img/0.png,p0,1\nimg/1.png,p1,0\nimg/2.png,p2,1\nimg/3.png,p3,0\n", "path,patient_id,TB")
    (tmp_path / "img" / "3.png").write_bytes(b"broken")
    config = json.loads(TEMPLATE.read_text())
    config["data"] = {
        **config["data"],
        "kind": "csv",
        "location": str(csv),
        "split_fractions": [0.5, 0.25, 0.25],
        "options": {"new_classes": ["TB"]},  # a finding of its own, declared
    }
    config["on_unreadable"] = "error"
    path = tmp_path / "site.json"
    path.write_text(json.dumps(config))
    assert main(["check-site", "--job", str(MAIN_JOB), "--config", str(path), "--site", "site-x"]) == 2
    output = capsys.readouterr().out
    assert "new to the built-in vocabulary (each joins as a class of its own): Tb" in output
    assert f"PROBLEM: unreadable: {tmp_path / 'img' / '3.png'}: cannot decode image" in output
    assert "site-x would be refused at the handshake of job 'nih_chexpert'" in output


def test_evaluate_help_says_95_percent_once(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "95% CI" in capsys.readouterr().out.replace("\n", " ")


@pytest.mark.slow
def test_a_dry_run_writes_its_plan(tmp_path):
    out = tmp_path / "plan"
    assert main(["experiment", "--grid", "small", "--out", str(out), "--dry-run"]) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["grid"] == "small" and [s["name"] for s in plan["settings"]] == [
        "nih-K4-psi0of14-N1",
        "nih-K4-psi12of14-N1",
    ]
    assert (out / "site_label_counts.csv").is_file()
    assert plan["embedded_labels"] == "real label rows of torchxrayvision's data files"


def test_a_grid_on_embedded_data_refuses_to_draw_its_labels_without_the_label_files(tmp_path, monkeypatch, capsys):
    # the grids' embedded labels are real NIH and CheXpert rows: without the files (a lent GPU machine) they would be
    # drawn finding by finding, another dataset under the same grid's name, as one GPU session's levers were
    monkeypatch.setattr(grids, "reference_file", lambda name: None)
    out = tmp_path / "grid"
    assert main(["experiment", "--grid", "small", "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "Data_Entry_2017_v2020.csv.gz, chexpert_train.csv.gz of torchxrayvision's data folder not installed" in error
    assert "--builtin-labels" in error and not out.exists()
    # an embedded CheXpert-layout set also draws its NIH-only findings from NIH's rows: both files, even beside real NIH
    assert grids.DataSources(nih="/data/nih").missing_label_files() == [
        "Data_Entry_2017_v2020.csv.gz",
        "chexpert_train.csv.gz",
    ]
    assert grids.DataSources("/data/nih", "/data/chexpert", "/data/mimic").missing_label_files() == []
    monkeypatch.setattr(grids, "reference_file", lambda name: None if name == "chexpert_train.csv.gz" else Path(name))
    assert grids.DataSources().embedded_labels() == (
        "built-in frequencies, each finding on its own (chexpert_train.csv.gz not installed)"
    )
