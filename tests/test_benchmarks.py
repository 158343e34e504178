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
