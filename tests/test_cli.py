from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from surgical_aggregation.cli import HANDLERS, main


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


HEAVY_PACKAGES = ("torch", "pandas", "nvflare", "monai", "sklearn", "transformers")


@pytest.mark.parametrize("command", [None, *HANDLERS])
def test_help_loads_no_heavy_package(command):
    """--help of every subcommand builds the whole parser without importing torch, pandas, FLARE or MONAI (each
    costs seconds on a small machine); the names it lists come from modules that import nothing."""
    arguments = ["--help"] if command is None else [command, "--help"]
    script = (
        "import sys\n"
        "from surgical_aggregation.cli import main\n"
        f"try:\n    main({arguments!r})\nexcept SystemExit:\n    pass\n"
        f"print(sorted(name for name in {HEAVY_PACKAGES!r} if name in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "[]"


def test_the_registries_are_keyed_by_the_names_the_command_line_lists():
    from surgical_aggregation.images.layouts import LOADERS
    from surgical_aggregation.images.names import GENERATED_KINDS, LAYOUT_KINDS, PUBLIC_KINDS
    from surgical_aggregation.images.public import PUBLIC_DATASETS
    from surgical_aggregation.images.synthetic import GENERATED
    from surgical_aggregation.modalities import DATA_KINDS
    from surgical_aggregation.modalities.registry import modality_kinds

    assert tuple(LOADERS) == LAYOUT_KINDS and tuple(GENERATED) == GENERATED_KINDS
    assert tuple(PUBLIC_DATASETS) == PUBLIC_KINDS
    assert modality_kinds() == DATA_KINDS
