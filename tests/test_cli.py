from __future__ import annotations

import shutil
from pathlib import Path

import torch

from surgical_aggregation.cli import main


def test_generate_then_prepare(tmp_path, capsys):
    arguments = ["generate", "--kind", "nih", "--out", str(tmp_path / "data"), "--patients", "8", "--size", "16"]
    arguments += ["--labels", "builtin"]
    assert main(arguments) == 0
    assert "generated embedded nih dataset" in capsys.readouterr().out
    assert main(arguments) == 0
    assert "already present: embedded nih dataset" in capsys.readouterr().out

    cache = ["--cache-dir", str(tmp_path / "cache"), "--size", "16", "--no-progress"]
    assert main(["prepare", "--kind", "nih", "--data", str(tmp_path / "data"), *cache]) == 0  # one kind: --out itself
    output = capsys.readouterr().out
    assert "0 reused" in output and "0 unreadable" in output and "images ready for training" in output


def test_prepare_reports_unreadable_images(nih_data, tmp_path, capsys):
    root = tmp_path / "nih"
    shutil.copytree(nih_data.root, root)
    broken = sorted((root / "images").iterdir())[2]
    broken.write_bytes(b"not a png")
    cache = ["--cache-dir", str(tmp_path / "cache"), "--size", "16", "--no-progress"]
    assert main(["prepare", "--kind", "nih", "--data", str(root), *cache]) == 2
    assert f"error: {broken}:" in capsys.readouterr().err
    assert main(["prepare", "--kind", "nih", "--data", str(root), "--on-error", "skip", *cache]) == 0
    output = capsys.readouterr().out
    assert f"skipped {broken}: cannot decode image" in output
    assert f"{nih_data.n_images - 1} images ready for training" in output


def test_missing_data_folder_is_a_clear_error(tmp_path, capsys):
    assert main(["prepare", "--kind", "chexpert", "--data", str(tmp_path / "nowhere")]) == 2
    nowhere = Path(tmp_path / "nowhere")
    assert capsys.readouterr().err.strip() == (
        f"error: data.location '{nowhere}': CheXpert data folder not found: {nowhere}"
    )


def test_predict_with_a_file_that_is_not_a_model_says_so_in_one_line(nih_data, tmp_path, capsys):
    text, image, code = tmp_path / "model.txt", tmp_path / "model.png", tmp_path / "model.pt"
    text.write_text("hello\n")
    shutil.copy(nih_data.root / "images" / sorted((nih_data.root / "images").iterdir())[0].name, image)
    torch.save({"model": {}, "class_names": ["Mass"], "hook": print}, code)  # more than tensors: never unpickled
    images = ["--images", str(nih_data.root / "images"), "--out", str(tmp_path / "scores.csv")]
    for model, reason in [
        (text, "one is written by torch.save (a zip archive), this file starts with b'hell'"),
        (image, "one is written by torch.save (a zip archive), this file starts with b'\\x89PNG'"),
        (code, "it holds objects other than tensors, names and numbers, which are not loaded"),
    ]:
        assert main(["predict", "--model", str(model), *images]) == 2
        error = capsys.readouterr().err.strip()
        assert error.startswith(f"error: {model}: not a model file") and reason in error
        assert "\n" not in error and "weights_only" not in error
