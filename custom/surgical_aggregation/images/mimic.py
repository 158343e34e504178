"""MIMIC-CXR-JPG: ``mimic-cxr-2.0.0-chexpert.csv`` + ``-metadata.csv`` and the nested ``files/`` tree.

Images live at ``files/p10/p10000032/s50414267/<dicom_id>.jpg``. Frontal (AP/PA) only;
labels from the CheXpert labeler, uncertain values by the uncertainty policy. A label file that carries more
finding columns than the labeler's 14 (e.g. CXR-LT's labels of the same studies merged in) has them read too, by
the same rules.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..core.errors import DataNotFoundError
from ..core.labels import BUILTIN_VOCABULARY, MIMIC_LABELS, NO_FINDING, Vocabulary
from ..data.table import (
    PATH_COLUMN,
    PATIENT_COLUMN,
    LabelTable,
    UncertaintyPolicy,
    apply_uncertainty,
    find_file,
    read_label_csv,
)

LABEL_FILE = "mimic-cxr-2.0.0-chexpert.csv"
METADATA_FILE = "mimic-cxr-2.0.0-metadata.csv"
FRONTAL_VIEWS = ("AP", "PA")


def mimic_image_path(root: Path, subject_id: str, study_id: str, dicom_id: str) -> Path:
    return root / "files" / f"p{subject_id[:2]}" / f"p{subject_id}" / f"s{study_id}" / f"{dicom_id}.jpg"


def load_mimic(
    root: str | Path, uncertainty: UncertaintyPolicy = "zeros", vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> LabelTable:
    root = Path(root)
    if not root.is_dir():
        raise DataNotFoundError(f"MIMIC-CXR-JPG data folder not found: {root}")
    keys = ["subject_id", "study_id"]
    labels = read_label_csv(find_file(root, [LABEL_FILE], "MIMIC label file"), [*keys, *MIMIC_LABELS], blank_only=True)
    others = [column for column in labels.columns if column not in (*keys, *MIMIC_LABELS, NO_FINDING)]
    columns = [*MIMIC_LABELS, *others]
    metadata_path = find_file(root, [METADATA_FILE], "MIMIC metadata file")
    metadata = read_label_csv(metadata_path, ["dicom_id", "subject_id", "study_id", "ViewPosition"])
    metadata = metadata[metadata["ViewPosition"].str.strip().isin(FRONTAL_VIEWS)]
    merged = metadata.merge(labels, on=["subject_id", "study_id"], how="inner", validate="many_to_one")
    frame = pd.DataFrame(
        {
            PATH_COLUMN: [
                str(mimic_image_path(root, s, t, d))
                for s, t, d in zip(merged["subject_id"], merged["study_id"], merged["dicom_id"], strict=True)
            ],
            PATIENT_COLUMN: merged["subject_id"].str.strip(),
        }
    )
    for name in columns:
        frame[name] = apply_uncertainty(merged[name], uncertainty, f"{root / LABEL_FILE} column {name!r}")
    table = LabelTable(source="mimic", root=root, classes=columns, frame=frame)
    return table.renamed(vocabulary.renaming(columns, f"{root / LABEL_FILE} columns"))
