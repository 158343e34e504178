from __future__ import annotations

import shutil
from pathlib import Path

from surgical_aggregation.cli import main


def test_generate_then_prepare(tmp_path, capsys):
    arguments = ["generate", "--kind", "nih", "--out", str(tmp_path / "data"), "--patients", "8", "--size", "16"]
    arguments += ["--labels", "builtin"]
    assert main(arguments) == 0
    assert "generated embedded nih dataset" in capsys.readouterr().out
    assert main(arguments) == 0
    assert "already present: embedded nih dataset" in capsys.readouterr().out

    cache = ["--cache-dir", str(tmp_path / "cache"), "--size", "16", "--no-progress"]
    assert main(["prepare", "--kind", "nih", "--data", str(tmp_path / "data" / "nih"), *cache]) == 0
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
    assert f"error: CheXpert data folder not found: {Path(tmp_path / 'nowhere')}" in capsys.readouterr().err
