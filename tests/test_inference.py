"""predict / evaluate: probabilities by class name, AUROC on the classes a model and a data set share."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import roc_auc_score

from surgical_aggregation.cli import main
from surgical_aggregation.core.errors import DatasetFormatError
from surgical_aggregation.evaluation.inference import (
    HEAD_REFIT_KEY,
    RECALIBRATION_KEY,
    THRESHOLDS_KEY,
    evaluate_and_recalibrate,
    labelled_set,
    save_refit_rows,
    scoring_dataset,
)
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.model import NamedDenseNet
from surgical_aggregation.images.names import NETWORK_KEY, SMOKE_DENSENET
from surgical_aggregation.images.synthetic import generate_nih
from surgical_aggregation.training.checkpoint import load_checkpoint, save_checkpoint
from surgical_aggregation.training.config import load_site_config, site_config_from_dict
from surgical_aggregation.training.head_refit import RefitRow, refit_rows
from surgical_aggregation.training.loops import head_inputs, make_loader
from surgical_aggregation.training.site_data import resolve_table, split_table

MODEL_CLASSES = ["Mass", "Fracture", "Pleural Effusion"]


@pytest.fixture
def model_file(tmp_path):
    torch.manual_seed(0)
    model = NamedDenseNet(MODEL_CLASSES, network=SMOKE_DENSENET)
    preprocessing = {"image_size": 32, "in_channels": 1, "imagenet_normalize": True, NETWORK_KEY: SMOKE_DENSENET}
    return save_checkpoint(tmp_path / "model.pt", model.state_dict(), model.class_names, preprocessing=preprocessing)


def test_predict_writes_one_column_per_class_and_skips_unreadable(model_file, nih_data, tmp_path, capsys):
    images = tmp_path / "images"
    shutil.copytree(nih_data.root / "images", images)
    (images / "broken.png").write_bytes(b"not an image")
    out = tmp_path / "scores.csv"
    cache = ["--cache-dir", str(tmp_path / "cache")]
    assert main(["predict", "--model", str(model_file), "--images", str(images), "--out", str(out), *cache]) == 0
    scores = pd.read_csv(out)
    assert list(scores.columns) == ["path", "status", *MODEL_CLASSES]
    assert len(scores) == nih_data.n_images + 1  # every input has its row, the unreadable one too
    broken = scores[scores["path"].str.endswith("broken.png")]
    assert broken["status"].iloc[0].startswith("cannot decode image") and broken[MODEL_CLASSES].isna().all(axis=None)
    readable = scores[scores["status"] == "ok"]
    assert len(readable) == nih_data.n_images and readable[MODEL_CLASSES].stack().between(0, 1).all()
    output = capsys.readouterr().out
    assert f"scored {nih_data.n_images} of {nih_data.n_images + 1} input(s) for 3 classes" in output
    assert "not scored" in output and "broken.png" in output


def test_evaluate_uses_shared_classes_by_name_and_matches_sklearn(model_file, nih_data, tmp_path, capsys):
    cache = ["--cache-dir", str(tmp_path / "cache")]
    out = tmp_path / "evaluation"
    arguments = ["evaluate", "--model", str(model_file), "--kind", "nih", "--data", str(nih_data.root)]
    assert main([*arguments, "--split", "all", "--out", str(out), "--bootstrap", "50", *cache]) == 0
    table = pd.read_csv(out / "per_class_auroc.csv")
    assert table["class_name"].tolist() == ["Pleural Effusion", "Mass"]  # the data's order; Fracture is not NIH's
    summary = (out / "summary.txt").read_text()
    assert "classes of the data the model does not predict (left out): ['Atelectasis'" in summary
    assert (out / "per_class_auroc.png").stat().st_size > 5_000

    scores_file = tmp_path / "scores.csv"
    main(
        [
            "predict",
            "--model",
            str(model_file),
            "--images",
            str(nih_data.root / "images"),
            "--out",
            str(scores_file),
            *cache,
        ]
    )
    scores = pd.read_csv(scores_file).set_index("path")
    labels = load_table("nih", nih_data.root).frame.set_index("path")
    for row in table.itertuples():
        expected = roc_auc_score(labels.loc[scores.index, row.class_name], scores[row.class_name])
        assert row.auroc == pytest.approx(expected, abs=1e-9)
        assert row.positives == int(labels[row.class_name].sum())
    output = capsys.readouterr().out
    assert "mean AUROC over 2 classes" in output
    assert f"{nih_data.root.name} (nih, all): {nih_data.n_images} images" in output


def test_an_evaluation_title_names_the_kind_once(nih_data, tmp_path):
    (tmp_path / "nih").symlink_to(nih_data.root)
    assert labelled_set(kind="nih", data=tmp_path / "nih", split="all")[1] == "nih (all)"
    assert labelled_set(kind="nih", data=nih_data.root, split="test")[1] == f"{nih_data.root.name} (nih, test)"


def test_evaluate_a_sites_test_split_from_its_config(model_file, nih_data, tmp_path, capsys):
    config = tmp_path / "site.json"
    config.write_text(json.dumps({"data": {"kind": "nih", "location": str(nih_data.root)}, "cache_dir": str(tmp_path)}))
    arguments = ["evaluate", "--model", str(model_file), "--site-config", str(config), "--out", str(tmp_path / "e")]
    assert main([*arguments, "--bootstrap", "20"]) == 0
    site_config = load_site_config(config)
    n_test = len(split_table(resolve_table(site_config), site_config)["test"])
    assert 0 < n_test < nih_data.n_images
    assert f"site (test): {n_test} images" in capsys.readouterr().out


def test_model_without_stored_image_size_needs_one(nih_data, tmp_path, capsys):
    model = NamedDenseNet(MODEL_CLASSES)
    bare = save_checkpoint(tmp_path / "bare.pt", model.state_dict(), model.class_names)
    arguments = [
        "predict",
        "--model",
        str(bare),
        "--images",
        str(nih_data.root / "images"),
        "--out",
        str(tmp_path / "s.csv"),
    ]
    assert main(arguments) == 2
    assert "does not say which image size it was trained at: pass --image-size" in capsys.readouterr().err


def _site_and_thresholds(model: Path, tmp_path: Path) -> tuple[Path, list[str], Path]:
    """A site of 120 embedded NIH-layout patients: its config, the evaluate command on it, and ``model`` with
    thresholds chosen there (``evaluate --thresholds-out``)."""
    nih_data = generate_nih(tmp_path / "nih", n_patients=120, image_size=32, label_source="builtin")
    config = tmp_path / "site.json"
    config.write_text(json.dumps({"data": {"kind": "nih", "location": str(nih_data.root)}, "cache_dir": str(tmp_path)}))
    evaluate = ["evaluate", "--site-config", str(config), "--bootstrap", "20"]
    with_thresholds = tmp_path / "thresholds.pt"
    assert main([*evaluate, "--model", str(model), "--out", str(tmp_path / "t"), "--thresholds-out",
                 str(with_thresholds)]) == 0  # fmt: skip
    return config, evaluate, with_thresholds


def test_a_site_recalibrates_the_federations_model_to_its_own_prevalence(model_file, tmp_path, capsys):
    """``evaluate --recalibrate-out``: each class the site's validation split labels gets the one logit shift that
    makes its mean probability there the split's (smoothed) prevalence, written into the head biases of a copy of the
    model (the weights and the rows the site does not label untouched), fitted on the model's logits, so that a row
    saturated far below any prevalence is reached too; the test split's loss falls where the model's base rates were
    off, its AUROC stays, and thresholds saved with the model move so that every call stays."""
    checkpoint = load_checkpoint(model_file)
    state = {key: value.clone() for key, value in checkpoint.state.items()}
    bias = "class_layers.out.bias"
    state[bias][MODEL_CLASSES.index("Pleural Effusion")] = -30.0  # saturated: its probabilities ~1e-13
    state[bias][MODEL_CLASSES.index("Mass")] = 4.0  # far above any prevalence
    biased = save_checkpoint(tmp_path / "biased.pt", state, MODEL_CLASSES, **checkpoint.meta)
    config, evaluate, with_thresholds = _site_and_thresholds(biased, tmp_path)
    recalibrated = tmp_path / "recalibrated.pt"
    assert main([*evaluate, "--model", str(with_thresholds), "--out", str(tmp_path / "r"), "--recalibrate-out",
                 str(recalibrated)]) == 0  # fmt: skip
    output = capsys.readouterr().out
    assert f"wrote {recalibrated}: the model recalibrated to site (validation split) (2 of its classes)" in output
    assert "mean test loss over 2 classes: " in output

    after = load_checkpoint(recalibrated)
    record = after.meta[RECALIBRATION_KEY]
    shifts = record["shifts"]
    assert set(shifts) == {"Pleural Effusion", "Mass"} and record["fitted_on"] == ["site (validation split)"]
    assert shifts["Pleural Effusion"] > 20 and shifts["Mass"] < 0  # back toward the site's prevalence
    for key, value in state.items():
        if key != bias:
            assert torch.equal(after.state[key], value), key
    expected = torch.tensor([shifts.get(name, 0.0) for name in MODEL_CLASSES])  # Fracture: not NIH's, not moved
    torch.testing.assert_close(after.state[bias] - state[bias], expected, atol=1e-5, rtol=0)

    # independently: the recalibrated file's mean probability over the images labelling a class in the validation
    # split is their smoothed prevalence of it
    site = load_site_config(config)
    val = split_table(resolve_table(site), site)["val"].frame
    listing = tmp_path / "val.csv"
    val[["path"]].to_csv(listing, index=False)
    for model, name in ((recalibrated, "after"), (with_thresholds, "before")):
        out = tmp_path / f"val-{name}.csv"
        assert main(["predict", "--model", str(model), "--input", str(listing), "--out", str(out), "--calls"]) == 0
    scored = pd.read_csv(tmp_path / "val-after.csv").set_index("path")
    table = pd.read_csv(tmp_path / "r" / "per_class_auroc.csv").set_index("class_name")
    for name in shifts:
        labelled = val[val[name].notna()]
        cases, count = labelled[name].sum(), len(labelled)
        assert (table.loc[name, "val_cases"], table.loc[name, "val_labelled"]) == (cases, count)
        assert scored.loc[labelled["path"], name].mean() == pytest.approx((cases + 0.5) / (count + 1), abs=1e-5)
    unmoved = pd.read_csv(tmp_path / "val-before.csv").set_index("path")
    calls = [column for column in scored.columns if column.endswith(" (call)")]
    assert calls and scored[calls].equals(unmoved[calls])  # the thresholds moved with the shifts
    assert after.meta[THRESHOLDS_KEY]["values"] != load_checkpoint(with_thresholds).meta[THRESHOLDS_KEY]["values"]

    assert (table["recalibrated_loss"] < table["loss"]).all()
    plain = tmp_path / "plain"
    assert main([*evaluate, "--model", str(recalibrated), "--out", str(plain)]) == 0
    again = pd.read_csv(plain / "per_class_auroc.csv").set_index("class_name")
    # the model's ranking: the report scores the logits, a file float32 probabilities, which tie more where the smoke
    # network's logits differ by less than float32 resolves after the shift (the saturated row)
    assert again.loc["Mass", "auroc"] == pytest.approx(table.loc["Mass", "auroc"], abs=1e-9)
    assert again.loc["Pleural Effusion", "auroc"] == pytest.approx(table.loc["Pleural Effusion", "auroc"], abs=0.01)

    # refused, one line each: the model read as the one written, --split beside a fit, both fits at once
    capsys.readouterr()
    assert main([*evaluate, "--model", str(biased), "--out", str(plain), "--recalibrate-out", str(biased)]) == 2
    assert "--recalibrate-out" in capsys.readouterr().err and load_checkpoint(biased).meta == checkpoint.meta
    assert main([*evaluate, "--model", str(biased), "--out", str(plain), "--split", "all", "--recalibrate-out",
                 str(tmp_path / "x.pt")]) == 2  # fmt: skip
    assert "--split applies to a plain evaluation; --recalibrate-out fits on val" in capsys.readouterr().err
    both = [*evaluate, "--model", str(biased), "--out", str(plain), "--thresholds-out", "a.pt", "--recalibrate-out"]
    with pytest.raises(SystemExit):
        main([*both, "b.pt"])


def test_a_class_the_validation_split_labels_on_no_image_is_not_recalibrated(model_file, nih_data, tmp_path):
    """A shift needs labelled images: a class the validation split labels nowhere keeps its row and is not counted
    as recalibrated; a split that labels none of the model's classes on any image is refused, naming why."""
    site = site_config_from_dict({"data": {"kind": "nih", "location": str(nih_data.root)}, "cache_dir": str(tmp_path)})
    splits = split_table(resolve_table(site), site)
    unlabelled = splits["val"].frame.copy()
    unlabelled["Mass"] = float("nan")
    partly = {**splits, "val": dataclasses.replace(splits["val"], frame=unlabelled)}
    report, shifts = evaluate_and_recalibrate(model_file, partly, cache_dir=tmp_path, bootstrap=10)
    assert set(shifts) == {"Pleural Effusion"} and report.per_class["class_name"].tolist() == ["Pleural Effusion"]
    unlabelled["Pleural Effusion"] = float("nan")
    with pytest.raises(DatasetFormatError, match="the validation split labels none of the model's classes on any"):
        evaluate_and_recalibrate(model_file, partly, cache_dir=tmp_path, bootstrap=10)


def test_a_site_refits_the_rows_of_its_classes_on_its_own_images(model_file, tmp_path, capsys):
    """``evaluate --refit-rows-out``: the head row of each class the site labels becomes the logistic regression of
    its training and validation images on the model's features (C chosen on validation); a row pushed far (as a
    backdoor's would be) is gone, the backbone and the rows of classes the site does not label are untouched, the
    thresholds of the refitted classes are dropped and the file says what was refitted where."""
    checkpoint = load_checkpoint(model_file)
    state = {key: value.clone() for key, value in checkpoint.state.items()}
    weight, bias = "class_layers.out.weight", "class_layers.out.bias"
    state[weight][MODEL_CLASSES.index("Mass")] = 50.0
    state[bias][MODEL_CLASSES.index("Mass")] = 9.0
    pushed = save_checkpoint(tmp_path / "pushed.pt", state, MODEL_CLASSES, **checkpoint.meta)
    config, evaluate, with_thresholds = _site_and_thresholds(pushed, tmp_path)
    refitted = tmp_path / "refitted.pt"
    capsys.readouterr()
    assert main([*evaluate, "--model", str(with_thresholds), "--out", str(tmp_path / "r"), "--refit-rows-out",
                 str(refitted)]) == 0  # fmt: skip
    output = capsys.readouterr().out
    assert f"wrote {refitted}: the model with 2 head rows refitted on site (training and validation splits)" in output
    assert "mean test AUROC over 2 classes: " in output

    # independently: the rows are scikit-learn's fits on the model's features of the site's splits
    site = load_site_config(config)
    splits = split_table(resolve_table(site), site)
    model = checkpoint.build_model()
    read = {}
    for split in ("train", "val"):
        dataset, kept = scoring_dataset([checkpoint], splits[split], cache_dir=tmp_path)
        features = head_inputs(model, make_loader(dataset, 64, False), torch.device("cpu"))[0].double().numpy()
        read[split] = (features, *kept.label_matrix(["Mass", "Pleural Effusion"], "unlabelled"))
    expected = refit_rows(read["train"], read["val"], refit_on_both=True)
    after = load_checkpoint(refitted)
    for column, name in enumerate(["Mass", "Pleural Effusion"]):
        row = MODEL_CLASSES.index(name)
        np.testing.assert_allclose(after.state[weight][row].double().numpy(), expected[column].weights, atol=1e-5)
        assert after.state[bias][row].item() == pytest.approx(expected[column].bias, abs=1e-5)
    assert after.state[weight][0].abs().max() < 5.0  # the pushed row is gone
    for key, value in state.items():
        if key not in (weight, bias):
            assert torch.equal(after.state[key], value), key
    fracture = MODEL_CLASSES.index("Fracture")  # not NIH's: not refitted
    assert torch.equal(after.state[weight][fracture], state[weight][fracture])
    record = after.meta[HEAD_REFIT_KEY]
    table = pd.read_csv(tmp_path / "r" / "per_class_auroc.csv").set_index("class_name")
    refit_c = {name: float(table.loc[name, "refit_c"]) for name in ("Mass", "Pleural Effusion")}
    assert refit_c == {"Mass": expected[0].strength, "Pleural Effusion": expected[1].strength}
    assert record["classes"] == ["Mass", "Pleural Effusion"]
    assert record["fitted_on"] == ["site (training and validation splits)"]
    assert load_checkpoint(with_thresholds).meta[THRESHOLDS_KEY]["values"].keys() == {"Mass", "Pleural Effusion"}
    assert THRESHOLDS_KEY not in after.meta  # set for the old rows, every one refitted
    assert after.meta[HEAD_REFIT_KEY]["c"] == {name: table_c for name, table_c in refit_c.items()}

    plain = tmp_path / "plain"
    assert main([*evaluate, "--model", str(pushed), "--out", str(plain)]) == 0
    before = pd.read_csv(plain / "per_class_auroc.csv").set_index("class_name")
    assert table.loc["Mass", "auroc_before"] == pytest.approx(before.loc["Mass", "auroc"], abs=1e-9)
    again = tmp_path / "again"
    assert main([*evaluate, "--model", str(refitted), "--out", str(again)]) == 0
    assert pd.read_csv(again / "per_class_auroc.csv").set_index("class_name").loc["Mass", "auroc"] == pytest.approx(
        table.loc["Mass", "auroc"], abs=1e-6
    )

    capsys.readouterr()
    assert main([*evaluate, "--model", str(pushed), "--out", str(plain), "--split", "all", "--refit-rows-out",
                 str(tmp_path / "x.pt")]) == 2  # fmt: skip
    assert "--split applies to a plain evaluation; --refit-rows-out fits on train and val" in capsys.readouterr().err
    assert main([*evaluate, "--model", str(pushed), "--out", str(plain), "--refit-rows-out", str(pushed)]) == 2


def test_a_second_refit_adds_its_rows_to_the_first_ones_record(model_file, tmp_path):
    """Refitting a refitted file again: the rows refitted the first time and not the second keep their fit, and the
    meta names every row refitted, each one's latest C, and both fits' places in order."""
    names = load_checkpoint(model_file).class_names
    width = load_checkpoint(model_file).state["class_layers.out.weight"].shape[1]
    first, second = names[0], names[1]
    once = save_refit_rows(
        model_file, {first: RefitRow(np.full(width, 0.5), 1.0, 0.1)}, "site (first)", tmp_path / "1.pt"
    )
    rows = {first: RefitRow(np.full(width, 0.25), 2.0, 10.0), second: RefitRow(np.full(width, -0.5), 3.0, 1.0)}
    twice = load_checkpoint(save_refit_rows(once, {second: rows[second]}, "site (second)", tmp_path / "2.pt"))
    weight = twice.state["class_layers.out.weight"]
    assert torch.equal(weight[0], torch.full((width,), 0.5, dtype=weight.dtype))  # the first fit, kept
    assert torch.equal(weight[1], torch.full((width,), -0.5, dtype=weight.dtype))
    assert twice.meta[HEAD_REFIT_KEY]["classes"] == sorted([first, second])
    assert twice.meta[HEAD_REFIT_KEY]["c"] == {first: 0.1, second: 1.0}
    assert twice.meta[HEAD_REFIT_KEY]["fitted_on"] == ["site (first)", "site (second)"]
    again = load_checkpoint(save_refit_rows(tmp_path / "2.pt", {first: rows[first]}, "site (third)", tmp_path / "3.pt"))
    assert again.meta[HEAD_REFIT_KEY]["c"] == {first: 10.0, second: 1.0}
    assert float(again.state["class_layers.out.bias"][0]) == 2.0
    # a file refitted before the record was a list names its one place as a string: read as that place
    earlier = load_checkpoint(once)
    single = {**earlier.meta, HEAD_REFIT_KEY: {**earlier.meta[HEAD_REFIT_KEY], "fitted_on": "site (first)"}}
    old = save_checkpoint(tmp_path / "old.pt", earlier.state, earlier.class_names, **single)
    later = load_checkpoint(save_refit_rows(old, {second: rows[second]}, "site (second)", tmp_path / "4.pt"))
    assert later.meta[HEAD_REFIT_KEY]["fitted_on"] == ["site (first)", "site (second)"]
