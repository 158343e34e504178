"""Session fixtures: tiny generated datasets in the real layouts, built once."""

from __future__ import annotations

import os

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
