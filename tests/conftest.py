"""Session fixtures: tiny generated datasets in the real layouts, built once."""

from __future__ import annotations

import os

# Under pytest-xdist (the README's test command: -n 2) each worker gets its share of the cores before torch starts
# its thread pool; workers that each take every core oversubscribe them (at -n 3 without this, a fixture of 23 s took
# 280 s). A value already set is kept, and the simulator's site processes inherit it.
if "PYTEST_XDIST_WORKER_COUNT" in os.environ:
    os.environ.setdefault(
        "OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    )

import pytest

from surgical_aggregation.images.synthetic import GeneratedDataset, generate_chexpert, generate_mimic, generate_nih


@pytest.fixture(scope="session", autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """No test writes to the user's cache (~/.cache/surgical_aggregation)."""
    os.environ["SURGICAL_AGGREGATION_CACHE"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="session")
def nih_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_nih(tmp_path_factory.mktemp("nih"), n_patients=40, image_size=32, label_source="builtin")


@pytest.fixture(scope="session")
def chexpert_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_chexpert(tmp_path_factory.mktemp("chexpert"), n_patients=40, image_size=32, label_source="builtin")


@pytest.fixture(scope="session")
def mimic_data(tmp_path_factory: pytest.TempPathFactory) -> GeneratedDataset:
    return generate_mimic(tmp_path_factory.mktemp("mimic"), n_patients=30, image_size=32, label_source="builtin")
