"""Five more public chest X-ray datasets, each with its own label scheme: PadChest, VinDr-CXR, Google's expert
labels of NIH images, RSNA pneumonia and SIIM pneumothorax.

Each is read from its real release layout (label file and image folder, below); label names go through the
site's vocabulary like any other, so PadChest's ~180 findings join as classes of their own next to the
built-in ones. The DICOM releases (VinDr-CXR, RSNA, SIIM) are read as shipped, and so are their PNG conversions
(the widely shared Kaggle ones): an image whose PNG path below is not there is looked up by name among the data
folder's DICOM files (``.dcm``, ``.dicom``; VinDr-CXR's ``train/<image_id>.dicom``, RSNA's
``stage_2_train_images/<patientId>.dcm``, SIIM's ``dicom-images-train/<study>/<series>/<ImageId>.dcm``).

=============  ==========================================================  ============================================
kind           label file (in the data folder)                              images
=============  ==========================================================  ============================================
``padchest``   ``PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv``      ``<ImageDir>/<ImageID>`` (folders 0 ... 54)
               (or ``.csv.gz``): one row per image, ``Labels`` a list
``vindr``      ``train.csv``: one row per radiologist's box (3 readers      ``train/<image_id>.png``
               per image)
``google-nih`` ``google2019_nih-chest-xray-labels.csv`` (or ``.csv.gz``):   NIH's ``images/<Image Index>`` (or
               YES/NO for 4 findings                                         ``images_001/images/`` ...)
``rsna``       ``stage_2_train_labels.csv``: one row per box, ``Target``    ``stage_2_train_images/<patientId>.png``
``siim``       ``train-rle.csv``: one row per mask, ``-1`` for none          ``images/<ImageId>.png``
=============  ==========================================================  ============================================

Rules, each an option of the loader (``data.options`` in a site config):

* PadChest: frontal projections only (``projections``: PA, AP, AP_horizontal); labels by physicians and by
  the report-labelling model alike (``labelled_by``: ``all``, ``physician`` or ``model``); "normal" is No
  Finding (dropped); "exclude", "suboptimal study" and "unchanged" are remarks, not findings: images marked
  "exclude" are left out, the others are kept without those labels; images without a label list are left out.
* VinDr-CXR: a finding is positive on an image when at least ``min_readers`` (default 2, a majority of the
  3) radiologists marked it, negative otherwise; "No finding" is dropped. No patient ids: each image is its
  own patient.
* Google's NIH labels: YES positive, NO negative; NIH's patient ids.
* RSNA: "Pneumonia" is positive when any box of the image has ``Target`` 1 (the challenge's "lung opacity
  suggestive of pneumonia"); each image (``patientId``) is its own patient.
* SIIM: "Pneumothorax" is positive when any mask of the image is not ``-1``; each image its own patient.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import DataNotFoundError, DatasetFormatError
from ..core.labels import BUILTIN_VOCABULARY, NO_FINDING, Vocabulary
from ..data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable, find_file, read_label_csv
from .dicom import DICOM_SUFFIXES
from .nih import nih_image_index

KEY_COLUMN = "key"  # a parsed frame's link back to the raw rows it came from (an image id)

IMAGES_AS_PATIENTS = ("vindr", "rsna", "siim")  # releases without patient ids: each image is its own patient
PADCHEST_PROJECTIONS = ("PA", "AP", "AP_horizontal")
PADCHEST_REMARKS = ("exclude", "suboptimal study", "unchanged")  # labels that are not findings
PADCHEST_LABELLERS = {"all": None, "physician": "Physician", "model": "RNN_model"}
VINDR_NO_FINDING = "No finding"


def _positives_by_name(
    keys: pd.Series, patients: pd.Series, tokens: pd.Series, where: str, vocabulary: Vocabulary
) -> pd.DataFrame:
    """Images x classes (1.0 / 0.0) from each image's list of raw label names, classes in name order."""
    canonical = vocabulary.renaming(sorted({name for names in tokens for name in names}), where)
    classes = sorted({name for name in canonical.values() if name != NO_FINDING})
    column_of = {name: column for column, name in enumerate(classes)}
    positives = np.zeros((len(tokens), len(classes)), np.float32)  # one pass over the names, not one per class
    for row, names in enumerate(tokens):
        for name in names:
            if canonical[name] != NO_FINDING:
                positives[row, column_of[canonical[name]]] = 1.0
    columns = {name: positives[:, column] for name, column in column_of.items()}
    return pd.DataFrame({KEY_COLUMN: keys.to_numpy(), PATIENT_COLUMN: patients.astype(str).to_numpy(), **columns})


def parse_padchest(
    raw: pd.DataFrame,
    where: str,
    vocabulary: Vocabulary,
    projections: Sequence[str] = PADCHEST_PROJECTIONS,
    labelled_by: str = "all",
) -> pd.DataFrame:
    if labelled_by not in PADCHEST_LABELLERS:
        raise DatasetFormatError(f"{where}: labelled_by must be one of {list(PADCHEST_LABELLERS)}, got {labelled_by!r}")
    rows = raw[raw["Projection"].isin(list(projections)) & raw["Labels"].notna()]
    if PADCHEST_LABELLERS[labelled_by] is not None:
        rows = rows[rows["MethodLabel"] == PADCHEST_LABELLERS[labelled_by]]

    def names(text: str) -> list[str]:
        try:
            listed = ast.literal_eval(text)
        except (ValueError, SyntaxError):
            raise DatasetFormatError(f"{where}: Labels {text!r} is not a list of names") from None
        return [name.strip() for name in listed if isinstance(name, str) and name.strip()]

    # each distinct list parsed once: the 160,861 rows hold about 29,000 distinct ones
    tokens = rows["Labels"].map({text: names(text) for text in rows["Labels"].unique()})
    kept = ~tokens.map(lambda found: "exclude" in found)
    rows, tokens = rows[kept], tokens[kept].map(lambda found: [n for n in found if n not in PADCHEST_REMARKS])
    parsed = _positives_by_name(rows["ImageID"], rows["PatientID"], tokens, f"{where} column 'Labels'", vocabulary)
    parsed[PATH_COLUMN] = (rows["ImageDir"].astype(int).astype(str) + "/" + rows["ImageID"]).to_numpy()
    return parsed


def parse_vindr(raw: pd.DataFrame, where: str, vocabulary: Vocabulary, min_readers: int = 2) -> pd.DataFrame:
    if not isinstance(min_readers, int) or not 1 <= min_readers <= 3:
        raise DatasetFormatError(f"{where}: min_readers must be 1, 2 or 3, got {min_readers!r}")
    readers = raw.groupby(["image_id", "class_name"])["rad_id"].nunique()
    positive = readers[readers >= min_readers].reset_index().groupby("image_id")["class_name"].agg(list)
    images = pd.Series(sorted(raw["image_id"].unique()))
    found = images.map(lambda image: positive.get(image, []))
    parsed = _positives_by_name(images, images, found, f"{where} column 'class_name'", vocabulary)
    labelled = sorted(set(raw["class_name"]) - {VINDR_NO_FINDING})
    for name in vocabulary.canonical_list(labelled, f"{where} column 'class_name'"):
        if name not in parsed:  # labelled by the dataset, positive on none of these images
            parsed[name] = np.float32(0)
    parsed[PATH_COLUMN] = [f"train/{image}.png" for image in images]
    return parsed


GOOGLE_FINDINGS = ("Fracture", "Pneumothorax", "Airspace opacity", "Nodule or mass")


def parse_google_nih(raw: pd.DataFrame, where: str, vocabulary: Vocabulary) -> pd.DataFrame:
    values = raw[list(GOOGLE_FINDINGS)].apply(lambda column: column.astype(str).str.strip().str.upper())
    unexpected = sorted(set(values.to_numpy().ravel()) - {"YES", "NO"})
    if unexpected:
        raise DatasetFormatError(f"{where}: the findings' columns hold YES or NO, found {unexpected[:3]}")
    classes = vocabulary.canonical_list(GOOGLE_FINDINGS, f"{where} columns")
    parsed = pd.DataFrame({KEY_COLUMN: raw["Image Index"].to_numpy(), PATIENT_COLUMN: raw["Patient ID"].astype(str)})
    for column, name in zip(GOOGLE_FINDINGS, classes, strict=True):
        parsed[name] = (values[column] == "YES").to_numpy(np.float32)
    parsed[PATH_COLUMN] = parsed[KEY_COLUMN]
    return parsed.reset_index(drop=True)


def _any_per_image(
    keys: pd.Series, positive: pd.Series, name: str, where: str, folder: str, vocabulary: Vocabulary
) -> pd.DataFrame:
    per_image = positive.groupby(keys.to_numpy()).any()
    classes = vocabulary.canonical(name, where)
    return pd.DataFrame(
        {
            KEY_COLUMN: per_image.index,
            PATIENT_COLUMN: per_image.index.astype(str),
            classes: per_image.to_numpy(np.float32),
            PATH_COLUMN: [f"{folder}/{key}.png" for key in per_image.index],
        }
    )


def parse_rsna(raw: pd.DataFrame, where: str, vocabulary: Vocabulary) -> pd.DataFrame:
    target = pd.to_numeric(raw["Target"], errors="coerce")
    if target.isna().any() or not target.isin([0, 1]).all():
        raise DatasetFormatError(f"{where}: column 'Target' holds 0 or 1")
    return _any_per_image(raw["patientId"], target == 1, "Pneumonia", where, "stage_2_train_images", vocabulary)


SIIM_MASK_COLUMN = "EncodedPixels"


def parse_siim(raw: pd.DataFrame, where: str, vocabulary: Vocabulary) -> pd.DataFrame:
    masks = raw[SIIM_MASK_COLUMN].astype(str).str.strip()
    return _any_per_image(raw["ImageId"], masks != "-1", "Pneumothorax", where, "images", vocabulary)


def read_public_labels(
    kind: str, label_file: Path, vocabulary: Vocabulary = BUILTIN_VOCABULARY, **options
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(raw rows, parsed images) of a public dataset's label file, its names read through ``vocabulary``;
    ``options`` go to its rule."""
    dataset = PUBLIC_DATASETS[kind]
    raw = read_label_csv(label_file, dataset.required)
    parsed = dataset.parse(raw, str(label_file), vocabulary, **options)
    if parsed.empty:
        raise DatasetFormatError(f"{label_file}: no usable {dataset.title} images under these options {options}")
    return raw, parsed


def as_released(located: Sequence[Path], root: Path) -> list[Path]:
    """Each image where it is: at its listed path, or else the DICOM file of the same name under ``root`` (the
    release as shipped); a path found in neither place is kept, for the cache to report as missing."""
    located = list(located)
    present = [path.is_file() for path in located]
    if all(present):
        return located
    dicoms = {path.stem: path for path in root.rglob("*") if path.suffix.lower() in DICOM_SUFFIXES}
    return [path if found else dicoms.get(path.stem, path) for path, found in zip(located, present, strict=True)]


def _load(kind: str, root: str | Path, label_file: str | Path | None, vocabulary: Vocabulary, **options) -> LabelTable:
    dataset = PUBLIC_DATASETS[kind]
    root = Path(root)
    if not root.is_dir():
        raise DataNotFoundError(f"{dataset.title} data folder not found: {root}")
    path = Path(label_file) if label_file else find_file(root, dataset.label_files, f"{dataset.title} label file")
    _, parsed = read_public_labels(kind, path, vocabulary, **options)
    if kind == "google-nih":  # NIH's image folders
        index = nih_image_index(root)
        if index is None:
            raise DataNotFoundError(f"no NIH image folder under {root}: expected images/ or images_001/images/ ...")
        if isinstance(index, dict):
            located = [index.get(name, root / "images" / name) for name in parsed[PATH_COLUMN]]
        else:
            located = [index / name for name in parsed[PATH_COLUMN]]
    else:
        located = [root / relative for relative in parsed[PATH_COLUMN]]
    parsed[PATH_COLUMN] = [str(path) for path in as_released(located, root)]
    classes = [column for column in parsed.columns if column not in (KEY_COLUMN, PATIENT_COLUMN, PATH_COLUMN)]
    known = kind not in IMAGES_AS_PATIENTS
    table = parsed.drop(columns=KEY_COLUMN)
    return LabelTable(source=kind, root=root, classes=classes, frame=table, patients_known=known)


def load_padchest(
    root: str | Path,
    label_file: str | Path | None = None,
    projections: Sequence[str] = PADCHEST_PROJECTIONS,
    labelled_by: str = "all",
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> LabelTable:
    """PadChest (see the module docstring): frontal images, every finding of its label lists a class."""
    return _load("padchest", root, label_file, vocabulary, projections=tuple(projections), labelled_by=labelled_by)


def load_vindr(
    root: str | Path,
    label_file: str | Path | None = None,
    min_readers: int = 2,
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> LabelTable:
    """VinDr-CXR's training set: image-level labels from the radiologists' boxes (``min_readers`` agree)."""
    return _load("vindr", root, label_file, vocabulary, min_readers=min_readers)


def load_google_nih(
    root: str | Path, label_file: str | Path | None = None, vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> LabelTable:
    """Google's expert labels (4 findings) of NIH ChestX-ray14 images."""
    return _load("google-nih", root, label_file, vocabulary)


def load_rsna(
    root: str | Path, label_file: str | Path | None = None, vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> LabelTable:
    """RSNA Pneumonia Detection's training labels: one class, Pneumonia."""
    return _load("rsna", root, label_file, vocabulary)


def load_siim(
    root: str | Path, label_file: str | Path | None = None, vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> LabelTable:
    """SIIM-ACR Pneumothorax's training masks as image labels: one class, Pneumothorax."""
    return _load("siim", root, label_file, vocabulary)


@dataclass(frozen=True)
class PublicDataset:
    """One public dataset's release layout: where its labels are and how they are read."""

    kind: str
    title: str
    label_files: tuple[str, ...]  # accepted names in the data folder (each also .gz); generated data: the first
    reference: str  # the same file in torchxrayvision's data folder (real label rows for embedded data)
    key_column: str  # the raw column that names an image
    required: tuple[str, ...]  # raw columns the parser reads
    parse: Callable[..., pd.DataFrame]
    load: Callable[..., LabelTable]  # the loader (its options: its keyword parameters)


PUBLIC_DATASETS: dict[str, PublicDataset] = {
    dataset.kind: dataset
    for dataset in (
        PublicDataset(
            "padchest",
            "PadChest",
            ("PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv",),
            "PADCHEST_chest_x_ray_images_labels_160K_01.02.19.csv.gz",
            "ImageID",
            ("ImageID", "ImageDir", "PatientID", "Projection", "MethodLabel", "Labels"),
            parse_padchest,
            load_padchest,
        ),
        PublicDataset(
            "vindr",
            "VinDr-CXR",
            ("train.csv",),
            "vinbigdata-train.csv.gz",
            "image_id",
            ("image_id", "class_name", "rad_id"),
            parse_vindr,
            load_vindr,
        ),
        PublicDataset(
            "google-nih",
            "Google's expert labels of NIH ChestX-ray14 images",
            ("google2019_nih-chest-xray-labels.csv",),
            "google2019_nih-chest-xray-labels.csv.gz",
            "Image Index",
            ("Image Index", "Patient ID", *GOOGLE_FINDINGS),
            parse_google_nih,
            load_google_nih,
        ),
        PublicDataset(
            "rsna",
            "RSNA Pneumonia Detection",
            ("stage_2_train_labels.csv", "stage_2_train_labels.csv.zip"),
            "kaggle_stage_2_train_labels.csv.zip",
            "patientId",
            ("patientId", "Target"),
            parse_rsna,
            load_rsna,
        ),
        PublicDataset(
            "siim",
            "SIIM-ACR Pneumothorax Segmentation",
            ("train-rle.csv",),
            "siim-pneumothorax-train-rle.csv.gz",
            "ImageId",
            ("ImageId", SIIM_MASK_COLUMN),
            parse_siim,
            load_siim,
        ),
    )
}
