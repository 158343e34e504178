"""Each on-disk layout read into a LabelTable: paths, patients, labels, policies, and clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from surgical_aggregation.core.errors import DatasetFormatError, SiteConfigError
from surgical_aggregation.core.labels import CHEXPERT_LABELS, NIH_LABELS, Vocabulary
from surgical_aggregation.images.chexpert import resolve_chexpert_path
from surgical_aggregation.images.layouts import load_table


def test_nih_layout(nih_data):
    table = load_table("nih", nih_data.root)
    raw = pd.read_csv(nih_data.root / "Data_Entry_2017.csv")
    assert len(table) == len(raw) == nih_data.n_images
    assert table.classes == list(NIH_LABELS)
    assert all(Path(p).is_file() for p in table.paths)
    for row, findings in enumerate(raw["Finding Labels"]):
        tokens = set(findings.split("|"))
        assert table.frame.loc[row, "Pleural Effusion"] == float("Effusion" in tokens)
        assert table.frame.loc[row, "Pleural Thickening"] == float("Pleural_Thickening" in tokens)
        assert table.frame.loc[row, "Mass"] == float("Mass" in tokens)
    assert table.frame["patient_id"].tolist() == raw["Patient ID"].astype(str).tolist()


def test_every_layout_names_its_classes_by_the_vocabulary_it_is_given(nih_data, chexpert_data, mimic_data, tmp_path):
    # a job that calls NIH's "Effusion" "Pleural fluid" and CheXpert's "Lung Opacity" "Opacity of the lung"
    vocabulary = Vocabulary([({"Effusion": "Pleural fluid", "Lung Opacity": "Opacity of the lung"}, "the job")])
    nih, nih_default = load_table("nih", nih_data.root, vocabulary), load_table("nih", nih_data.root)
    assert nih.classes == [name if name != "Pleural Effusion" else "Pleural fluid" for name in NIH_LABELS]
    assert nih.frame["Pleural fluid"].tolist() == nih_default.frame["Pleural Effusion"].tolist()
    for kind, data in (("chexpert", chexpert_data), ("mimic", mimic_data)):
        table, default = load_table(kind, data.root, vocabulary), load_table(kind, data.root)
        renamed = [name if name != "Lung Opacity" else "Opacity of the lung" for name in CHEXPERT_LABELS]
        assert table.classes[: len(CHEXPERT_LABELS)] == renamed  # (MIMIC: the NIH-only findings after them)
        assert table.frame["Opacity of the lung"].tolist() == default.frame["Lung Opacity"].tolist()
    pd.DataFrame({"path": ["a.png"], "patient_id": ["p1"], "Effusion": [1], "Mass": [0]}).to_csv(tmp_path / "l.csv")
    assert load_table("csv", tmp_path / "l.csv", vocabulary, label_columns=["Effusion", "Mass"]).classes == [
        "Pleural fluid",
        "Mass",
    ]
    with pytest.raises(SiteConfigError, match=r"takes no data.options \['vocabulary'\]"):
        load_table("nih", nih_data.root, vocabulary, vocabulary=None)  # a data.option cannot replace the site's


def test_nih_kaggle_split_folders(nih_data, tmp_path):
    root = tmp_path / "nih"
    images = sorted((nih_data.root / "images").iterdir())
    for index, image in enumerate(images):
        folder = root / f"images_{1 + index % 2:03d}" / "images"
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy(image, folder / image.name)
    shutil.copy(nih_data.root / "Data_Entry_2017.csv", root)
    table = load_table("nih", root)
    assert all(Path(p).is_file() for p in table.paths)
    assert {Path(p).parent.parent.name for p in table.paths} == {"images_001", "images_002"}


def test_nih_errors_name_the_problem(nih_data, tmp_path):
    with pytest.raises(FileNotFoundError, match="no NIH label file in"):
        load_table("nih", tmp_path)
    (tmp_path / "Data_Entry_2017.csv").write_text("Image Index,Patient ID\na.png,1\n")
    with pytest.raises(DatasetFormatError, match=r"Data_Entry_2017.csv: missing column\(s\) \['Finding Labels'\]"):
        load_table("nih", tmp_path, image_dir=tmp_path)
    (tmp_path / "Data_Entry_2017.csv").write_text("Image Index,Finding Labels,Patient ID\na.png,Mass|Tumour,1\n")
    with pytest.raises(DatasetFormatError, match=r"Data_Entry_2017.csv: 'Tumour' is not an NIH ChestX-ray14 finding"):
        load_table("nih", tmp_path, image_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="no NIH image folder"):
        load_table("nih", tmp_path)


def test_chexpert_layout_frontal_only(chexpert_data):
    table = load_table("chexpert", chexpert_data.root)
    raw = pd.concat([pd.read_csv(chexpert_data.root / name) for name in ("train.csv", "valid.csv")])
    frontal = raw[raw["Frontal/Lateral"] == "Frontal"]
    assert len(table) == len(frontal) > 0
    assert (raw["Frontal/Lateral"] == "Lateral").any()  # the fixture does contain laterals to drop
    assert table.classes == list(CHEXPERT_LABELS)
    assert all(Path(p).is_file() and "frontal" in p for p in table.paths)
    assert table.frame["patient_id"].str.fullmatch(r"patient\d{5}").all()
    assert any("/valid/" in p for p in table.paths)


def _write_chexpert(root: Path, values: dict[str, list]) -> None:
    root.mkdir(parents=True, exist_ok=True)
    n = len(next(iter(values.values())))
    frame = pd.DataFrame(
        {
            "Path": [f"CheXpert-v1.0-small/train/patient{i:05d}/study1/view1_frontal.jpg" for i in range(n)],
            "Sex": "Female",
            "Age": 50,
            "Frontal/Lateral": "Frontal",
            "AP/PA": "AP",
            "No Finding": np.nan,
            **{name: values.get(name, [0.0] * n) for name in CHEXPERT_LABELS},
        }
    )
    frame.to_csv(root / "train.csv", index=False)


@pytest.mark.parametrize(
    ("policy", "expected_labels", "expected_mask"),
    [
        ("zeros", [1, 0, 0, 0], [1, 1, 1, 1]),
        ("ones", [1, 0, 1, 0], [1, 1, 1, 1]),
        ("ignore", [1, 0, 0, 0], [1, 1, 0, 1]),
    ],
)
def test_chexpert_uncertainty_policies(tmp_path, policy, expected_labels, expected_mask):
    _write_chexpert(tmp_path / "renamed-folder", {"Edema": [1.0, 0.0, -1.0, np.nan]})
    table = load_table("chexpert", tmp_path / "renamed-folder", uncertainty=policy)
    labels, mask = table.label_matrix(["Edema"])
    assert labels[:, 0].tolist() == expected_labels
    assert mask[:, 0].tolist() == expected_mask
    # the CSV's archive-name prefix is replaced by the actual folder
    assert table.paths[0] == str(tmp_path / "renamed-folder/train/patient00000/study1/view1_frontal.jpg")


def test_chexpert_bad_value_names_file_column_and_row(tmp_path):
    _write_chexpert(tmp_path / "cx", {"Fracture": [0.0, 2.0]})
    with pytest.raises(DatasetFormatError, match=r"train.csv column 'Fracture': value '2.0' in data row 2"):
        load_table("chexpert", tmp_path / "cx")
    with pytest.raises(
        SiteConfigError, match=r"data.options.uncertainty must be one of \['zeros', 'ones', 'ignore'\], got 'maybe'"
    ):
        load_table("chexpert", tmp_path / "cx", uncertainty="maybe")


def test_resolve_chexpert_path_variants(tmp_path):
    assert resolve_chexpert_path(tmp_path, "CheXpert-v1.0/valid/patient1/study1/view1_frontal.jpg") == (
        tmp_path / "valid/patient1/study1/view1_frontal.jpg"
    )
    assert resolve_chexpert_path(tmp_path, "train\\patient1\\study2\\view1_frontal.jpg") == (
        tmp_path / "train/patient1/study2/view1_frontal.jpg"
    )


def test_mimic_layout_frontal_views_and_nested_paths(mimic_data):
    table = load_table("mimic", mimic_data.root)
    metadata = pd.read_csv(mimic_data.root / "mimic-cxr-2.0.0-metadata.csv.gz", dtype=str)
    labels = pd.read_csv(mimic_data.root / "mimic-cxr-2.0.0-chexpert.csv.gz", dtype=str)
    frontal = metadata[metadata["ViewPosition"].isin(["AP", "PA"])]
    assert len(table) == len(frontal) < len(metadata)
    for path, (_, meta) in zip(table.paths, frontal.iterrows(), strict=True):
        subject, study = meta["subject_id"], meta["study_id"]
        assert path == str(mimic_data.root / f"files/p{subject[:2]}/p{subject}/s{study}/{meta['dicom_id']}.jpg")
        assert Path(path).is_file()
    first = frontal.iloc[0]
    study_labels = labels[labels["study_id"] == first["study_id"]].iloc[0]
    expected = 1.0 if study_labels["Edema"] == "1.0" else 0.0
    assert table.frame.loc[0, "Edema"] == expected
    assert table.frame.loc[0, "patient_id"] == first["subject_id"]


def test_generic_csv_with_aliases_and_relative_paths(tmp_path):
    (tmp_path / "img").mkdir()
    pd.DataFrame(
        {
            "file": ["img/a.png", "img/b.png", "/abs/c.png"],
            "mrn": ["p1", "p1", "p2"],
            "Effusion": [1, 0, -1],
            "Pleural_Thickening": [0, 1, ""],
            "No Finding": [0, 0, 0],
        }
    ).to_csv(tmp_path / "labels.csv", index=False)
    table = load_table("csv", tmp_path / "labels.csv", image_column="file", patient_column="mrn", uncertainty="ones")
    assert table.classes == ["Pleural Effusion", "Pleural Thickening"]  # "No Finding" dropped
    assert table.paths == [str(tmp_path / "img/a.png"), str(tmp_path / "img/b.png"), "/abs/c.png"]
    labels, mask = table.label_matrix()
    assert labels.tolist() == [[1, 0], [0, 1], [1, 0]]
    assert mask.tolist() == [[1, 1]] * 3
    assert table.n_patients == 2


def test_generic_csv_errors(tmp_path):
    # a finding outside the built-in vocabulary is a class of its own once declared, refused until then; a declared
    # column that holds no labels is named
    pd.DataFrame({"path": ["a.png"], "patient_id": ["1"], "pneumonitis": [1]}).to_csv(tmp_path / "l.csv", index=False)
    with pytest.raises(DatasetFormatError, match=r"l.csv: column 'pneumonitis' is not a finding this bundle knows"):
        load_table("csv", tmp_path / "l.csv")
    assert load_table("csv", tmp_path / "l.csv", new_classes=["Pneumonitis"]).classes == ["Pneumonitis"]
    pd.DataFrame({"path": ["a.png"], "patient_id": ["1"], "Mass": [1], "Sex": ["F"]}).to_csv(
        tmp_path / "s.csv", index=False
    )
    with pytest.raises(DatasetFormatError, match=r"s.csv: column 'Sex' is not a finding this bundle knows"):
        load_table("csv", tmp_path / "s.csv")
    with pytest.raises(DatasetFormatError, match=r"s.csv column 'Sex'"):
        load_table("csv", tmp_path / "s.csv", label_columns=["Mass", "Sex"])
    pd.DataFrame({"path": ["a.png"], "patient_id": ["1"], "Mass": [1]}).to_csv(tmp_path / "i.csv")  # with its index
    with pytest.raises(DatasetFormatError, match=r"i.csv: column 'Unnamed: 0' is a header cell left empty \(a table's"):
        load_table("csv", tmp_path / "i.csv")
    both = {"path": ["a.png"], "patient_id": ["1"], "Effusion": [1], "Mass": [0], "Pleural Effusion": [1]}
    pd.DataFrame(both).to_csv(tmp_path / "e.csv", index=False)
    with pytest.raises(DatasetFormatError) as caught:
        load_table("csv", tmp_path / "e.csv")
    assert str(caught.value) == (
        f"{tmp_path / 'e.csv'}: columns 'Effusion' and 'Pleural Effusion' both mean 'Pleural Effusion'"
    )
    pd.DataFrame({"image": ["a.png"], "Mass": [1]}).to_csv(tmp_path / "m.csv", index=False)
    with pytest.raises(DatasetFormatError, match=r"m.csv: missing column\(s\) \['path', 'patient_id'\]"):
        load_table("csv", tmp_path / "m.csv")
    with pytest.raises(SiteConfigError, match=r"takes no data.options \['image_dir'\]"):
        load_table("csv", tmp_path / "m.csv", image_dir="x")
    with pytest.raises(ValueError, match="unknown dataset kind 'dicom'"):
        load_table("dicom", tmp_path)


def test_label_matrix_for_missing_classes(nih_data):
    table = load_table("nih", nih_data.root)
    with pytest.raises(KeyError, match="nih data has no label 'Fracture'"):
        table.label_matrix(["Mass", "Fracture"])
    labels, mask = table.label_matrix(["Fracture", "Mass"], missing="negative")
    assert labels[:, 0].sum() == 0 and mask[:, 0].all()
    labels, mask = table.label_matrix(["Fracture", "Mass"], missing="unlabelled")
    assert not mask[:, 0].any() and mask[:, 1].all()
    np.testing.assert_array_equal(labels[:, 1], table.frame["Mass"].to_numpy())
