"""The training-throughput benchmark runs end to end (a smoke test: no speed thresholds, see benchmarks/)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(name, BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_train_throughput_measures_the_three_paths_and_writes_them(tmp_path: Path) -> None:
    out = tmp_path / "throughput.json"
    arguments = ["--size", "32", "--batch", "4", "--batches", "2", "--repeats", "2", "--device", "cpu"]
    results = _load("train_throughput").main([*arguments, "--out", str(out)])

    assert json.loads(out.read_text()) == results
    assert (results["image_size"], results["batch_size"], results["repeats"]) == (32, 4, 2)
    assert (results["precision"], results["loader_workers"], results["compile"]) == ("float32", 0, "off")
    for path in ("ceiling_images_per_s", "train_images_per_s", "validation_images_per_s"):
        assert 0 < results[path]["median"] <= results[path]["best"]
    assert results["train_over_ceiling"] == pytest.approx(
        results["train_images_per_s"]["median"] / results["ceiling_images_per_s"]["median"]
    )


def test_the_poc_benchmark_reads_each_sites_local_epochs_once_from_its_logs(tmp_path: Path) -> None:
    """benchmarks/poc_speed.py's rate: every local epoch once (a POC writes a line to the site's and the job's
    log), the head warm-up left out, images over seconds summed per site."""
    line = (
        "2026-11-26 11:15:51,976 - {0} - INFO - {0} round {1} {2} epoch 1/1: loss 0.4854 on {3} images in {4} s (x/s)"
    )
    site_log = "\n".join(
        [
            line.format("site-nih", 0, "head warm-up", 500, "1.0"),
            line.format("site-nih", 0, "training", 240, "20.0"),
            line.format("site-nih", 1, "training", 260, "30.0"),
            line.format("site-chexpert", 0, "training", 100, "4.0"),
        ]
    )
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "log.txt").write_text(site_log)
    (tmp_path / "site" / "job").mkdir()
    (tmp_path / "site" / "job" / "log.txt").write_text(site_log)  # the same epochs in the job's log
    assert _load("poc_speed").site_rates(tmp_path) == {"site-chexpert": 25.0, "site-nih": 10.0}
