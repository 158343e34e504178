"""PadChest, VinDr-CXR, Google's NIH labels, RSNA and SIIM: the real label files' counts under the documented
rules, and the generated datasets in each release layout."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest

from surgical_aggregation.core.errors import DataNotFoundError, DatasetFormatError
from surgical_aggregation.data.table import PATIENT_COLUMN
from surgical_aggregation.images.layouts import load_table
from surgical_aggregation.images.public import KEY_COLUMN, PUBLIC_DATASETS, read_public_labels
from surgical_aggregation.images.synthetic import ensure_generated

from helpers import require_reference, union_of_the_seven_label_files


@functools.cache
def _read(kind: str, options: tuple) -> tuple[pd.DataFrame, pd.DataFrame]:
    return read_public_labels(kind, require_reference(PUBLIC_DATASETS[kind].reference), **dict(options))


def _real(kind: str, **options) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """(raw rows, parsed images, classes) of the real file, each file and option set read once."""
    raw, parsed = _read(kind, tuple(sorted(options.items())))
    classes = [column for column in parsed.columns if column not in (KEY_COLUMN, PATIENT_COLUMN, "path")]
    return raw, parsed, classes


@pytest.mark.parametrize(
    ("kind", "rows", "images", "patients", "classes", "positives"),
    [
        pytest.param(
            *(
                "padchest",
                160_861,
                109_581,
                66_828,
                189,
                {"Copd sign": 14_294, "Cardiomegaly": 9_837, "Tuberculosis": 171},
            ),
            marks=pytest.mark.slow,  # 160,861 rows parsed
        ),
        ("vindr", 67_914, 15_000, 15_000, 14, {"Aortic Enlargement": 2_346, "Pneumothorax": 58, "Nodule or Mass": 405}),
        ("google-nih", 4_376, 4_376, 1_695, 4, {"Lung Opacity": 2_166, "Nodule or Mass": 605, "Fracture": 186}),
        ("rsna", 30_227, 26_684, 26_684, 1, {"Pneumonia": 6_012}),
        ("siim", 12_954, 12_047, 12_047, 1, {"Pneumothorax": 2_669}),
    ],
)
def test_real_label_file_counts(kind, rows, images, patients, classes, positives):
    raw, parsed, names = _real(kind)
    assert (len(raw), len(parsed), parsed[PATIENT_COLUMN].nunique(), len(names)) == (rows, images, patients, classes)
    assert {name: int(parsed[name].sum()) for name in positives} == positives


@pytest.mark.slow
def test_padchest_rules_select_labellers_and_projections():
    assert len(_real("padchest", labelled_by="physician")[1]) == 26_373
    assert len(_real("padchest", labelled_by="model")[1]) == 83_208
    assert len(_real("padchest", projections=("PA",))[1]) == 90_850
    _, parsed, classes = _real("padchest")
    assert not {"Normal", "No Finding", "Exclude", "Unchanged", "Suboptimal study"} & set(classes)
    assert parsed["path"].iloc[0].count("/") == 1  # <ImageDir>/<ImageID>
    with pytest.raises(DatasetFormatError, match="labelled_by must be one of"):
        _real("padchest", labelled_by="radiologist")


def test_vindr_image_labels_need_the_documented_number_of_readers():
    pneumothorax = {readers: int(_real("vindr", min_readers=readers)[1]["Pneumothorax"].sum()) for readers in (1, 2, 3)}
    assert pneumothorax == {1: 96, 2: 58, 3: 45}
    with pytest.raises(DatasetFormatError, match="min_readers must be 1, 2 or 3"):
        _real("vindr", min_readers=4)


@pytest.mark.parametrize("kind", ["vindr", "google-nih", "rsna", "siim"])
def test_generated_data_has_the_release_layout_and_every_class_of_the_file(kind, tmp_path):
    dataset, created = ensure_generated(kind, tmp_path / kind, n_patients=40, image_size=32, seed=0)
    assert created and dataset.n_patients == 40
    assert (dataset.root / PUBLIC_DATASETS[kind].label_files[0]).is_file()
    table = load_table(kind, dataset.root)
    assert table.classes == _real(kind)[2]
    assert all(Path(path).is_file() for path in table.paths)
    assert all(count >= 1 for count in table.positive_counts().values())
    assert ensure_generated(kind, tmp_path / kind, n_patients=40, image_size=32, seed=0)[1] is False  # reused


@pytest.mark.slow
def test_generated_padchest_covers_every_finding_of_the_file(tmp_path):
    dataset, _ = ensure_generated("padchest", tmp_path / "padchest", n_patients=200, image_size=32, seed=0)
    table = load_table("padchest", dataset.root)
    assert table.classes == _real("padchest")[2] and len(table.classes) == 189
    assert Path(table.paths[0]).relative_to(dataset.root).parts[0].isdigit()  # ImageDir folders
    assert table.n_patients == 200 and min(table.positive_counts().values()) >= 1


def test_missing_folders_and_files_are_named(tmp_path):
    with pytest.raises(DataNotFoundError, match="VinDr-CXR data folder not found"):
        load_table("vindr", tmp_path / "nowhere")
    with pytest.raises(DataNotFoundError, match="no SIIM-ACR Pneumothorax Segmentation label file in"):
        load_table("siim", tmp_path)
    (tmp_path / "stage_2_train_labels.csv").write_text("patientId,Target\na,2\n")
    with pytest.raises(DatasetFormatError, match="column 'Target' holds 0 or 1"):
        load_table("rsna", tmp_path)


def test_the_union_of_the_seven_label_files():
    union = union_of_the_seven_label_files()
    assert len(union) == 199
    assert {"Tuberculosis", "Nodule or Mass", "Interstitial Lung Disease", "Aortic Enlargement"} <= union
    assert {"Nodule", "Mass", "Lung Opacity", "Consolidation", "Pleural Effusion"} <= union  # not merged
