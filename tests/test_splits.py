from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from surgical_aggregation.core.labels import NIH_LABELS
from surgical_aggregation.data.reference import NIH_LABEL_FILE
from surgical_aggregation.data.splits import patient_split, patient_strata
from surgical_aggregation.data.table import LabelTable
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.nih import read_nih_labels
from surgical_aggregation.training.config import site_config_from_dict
from surgical_aggregation.training.site_data import prepare_site_data, resolve_table, split_table

from helpers import require_reference


def _patients(split: LabelTable) -> set[str]:
    return set(split.frame["patient_id"])


def _assert_partition(table: LabelTable, splits: dict[str, LabelTable]) -> None:
    patient_sets = [_patients(s) for s in splits.values()]
    for i, first in enumerate(patient_sets):
        for second in patient_sets[i + 1 :]:
            assert not first & second, "a patient is in two splits"
    assert sum(len(s) for s in splits.values()) == len(table)
    assert set().union(*patient_sets) == _patients(table)


@pytest.fixture(scope="module")
def real_nih() -> LabelTable:
    return read_nih_labels(require_reference(NIH_LABEL_FILE))


def test_real_nih_label_file_counts_and_patient_level_split(real_nih):
    assert len(real_nih) == 112_120
    assert real_nih.n_patients == 30_805
    assert real_nih.positive_counts()["Pleural Effusion"] == 13_317  # NIH "Effusion"
    assert real_nih.positive_counts()["Hernia"] == 227
    splits = patient_split(real_nih, seed=0)
    _assert_partition(real_nih, splits)
    n_patients = {name: split.n_patients for name, split in splits.items()}
    assert sum(n_patients.values()) == 30_805
    for name, fraction in (("train", 0.7), ("val", 0.1), ("test", 0.2)):
        assert abs(n_patients[name] - fraction * 30_805) <= 1, n_patients
    # stratified: every finding's patients are spread 70/10/20 too (within 2 points)
    for name in NIH_LABELS:
        positives = {s: int(split.frame.groupby("patient_id")[name].max().sum()) for s, split in splits.items()}
        total = sum(positives.values())
        assert abs(positives["train"] / total - 0.7) < 0.02, (name, positives)
        assert abs(positives["test"] / total - 0.2) < 0.02, (name, positives)


def test_split_is_seeded(nih_data):
    table = load_table("nih", nih_data.root)
    first = patient_split(table, seed=1)
    again = patient_split(table, seed=1)
    other = patient_split(table, seed=2)
    _assert_partition(table, first)
    assert all(_patients(first[k]) == _patients(again[k]) for k in first)
    assert any(_patients(first[k]) != _patients(other[k]) for k in first)


def test_strata_pick_the_rarest_finding():
    frame = pd.DataFrame(
        {
            "path": ["a", "b", "c", "d", "e"],
            "patient_id": ["1", "1", "2", "3", "4"],
            "Mass": [1.0, 0.0, 1.0, 1.0, 0.0],
            "Hernia": [0.0, 1.0, 0.0, 0.0, 0.0],
        }
    )
    table = LabelTable("csv", root=Path("."), classes=["Mass", "Hernia"], frame=frame)
    strata = patient_strata(table)
    assert strata.to_dict() == {"1": 1, "2": 0, "3": 0, "4": -1}  # Hernia (1) is rarer than Mass (0)


def test_custom_fractions_and_errors(nih_data):
    table = load_table("nih", nih_data.root)
    halves = patient_split(table, fractions=(0.5, 0.5), names=("a", "b"), seed=0)
    assert abs(halves["a"].n_patients - halves["b"].n_patients) <= 1
    with pytest.raises(ValueError, match="must be non-negative and sum to 1"):
        patient_split(table, fractions=(0.7, 0.2, 0.2))
    with pytest.raises(ValueError, match="2 split names for 3 fractions"):
        patient_split(table, names=("a", "b"))
    assert np.isclose(sum(s.n_patients for s in halves.values()), table.n_patients)


def test_unreadable_images_leave_the_split_the_handshake_counted_less_those_images(nih_data, tmp_path):
    root = tmp_path / "nih"
    shutil.copytree(nih_data.root, root)
    broken = sorted((root / "images").iterdir())[1:9:2]  # 4 files, wherever their patients fell
    for path in broken:
        path.write_bytes(b"truncated")
    values = {"data": {"kind": "nih", "location": str(root)}, "image_size": 32, "on_unreadable": "skip"}
    config = site_config_from_dict({**values, "cache_dir": str(tmp_path / "cache")})
    handshake = split_table(resolve_table(config), config)  # what the site reports before the cache is built
    data = prepare_site_data(config)
    unreadable = {str(path) for path in broken}
    for name, dataset in (("train", data.train), ("val", data.val), ("test", data.test)):
        assert dataset.paths == [path for path in handshake[name].paths if path not in unreadable]
    assert sum(len(handshake[name]) for name in handshake) - len(broken) == len(data.train) + len(data.val) + len(
        data.test
    )
