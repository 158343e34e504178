"""A site's data said at entry (data.quality): images listed twice, under two patients, classes one-sided in a
split; and a ``~`` in a site config's paths is the user's home."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from surgical_aggregation.core.errors import DatasetFormatError
from surgical_aggregation.data.quality import duplicate_images, one_sided_classes
from surgical_aggregation.data.table import LabelTable
from surgical_aggregation.training.config import load_site_config


def _table(rows: list[tuple[str, str, float, float]]) -> LabelTable:
    frame = pd.DataFrame(rows, columns=["path", "patient_id", "Mass", "Effusion"])
    return LabelTable(source="csv", root=None, classes=["Mass", "Effusion"], frame=frame)


def test_duplicates_are_told_apart_and_counted_and_an_image_of_two_patients_is_refused():
    rows = [("a.png", "p1", 1, 0), ("b.png", "p2", 0, 0), ("a.png", "p1", 0, 0), ("c.png", "p3", 1, 1)]
    rows += [("c.png", "p3", 1, 1), ("d.png", "p4", 0, 1), ("d.png", "p4", 0, 1)]
    assert duplicate_images(_table(rows), "labels.csv") == [
        "labels.csv: 1 image(s) listed more than once with different labels (each row trains as given): "
        "a.png (rows 1, 3)",
        "labels.csv: 2 image(s) listed more than once with the same labels (each counts once per row): "
        "c.png (rows 4, 5); d.png (rows 6, 7)",
    ]
    assert duplicate_images(_table(rows[:2]), "labels.csv") == []
    leaking = [*rows, ("b.png", "p9", 0, 0)]
    with pytest.raises(DatasetFormatError, match=r"labels.csv: 1 image\(s\) listed under more than one patient, which "
                       r"would put a patient's image in two splits: b.png \(rows 2, 8: patients p2, p9\)"):  # fmt: skip
        duplicate_images(_table(leaking), "labels.csv")


def test_classes_without_positives_or_negatives_are_named_per_split():
    train = _table([("a", "p1", 1, 0), ("b", "p2", 0, 0)])
    test = _table([("c", "p3", 1, 1), ("d", "p4", 1, float("nan"))])
    assert one_sided_classes({"train": train, "test": test}, "data") == [
        "data: 1 class(es) with no positive image in the train split (2 images): Effusion",
        "data: 2 class(es) with no negative image in the test split (2 images): Mass, Effusion",
    ]


def test_a_tilde_in_a_site_configs_paths_is_the_users_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = {"data": {"kind": "nih", "location": "~/data/NIH"}, "cache_dir": "~/cache"}
    (tmp_path / "site.json").write_text(json.dumps(config))
    loaded = load_site_config(tmp_path / "site.json")
    assert loaded.data.location == str(tmp_path / "data" / "NIH") and loaded.cache_dir == str(tmp_path / "cache")
