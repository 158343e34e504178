"""NIH ChestX-ray14: ``Data_Entry_2017.csv`` plus a flat image folder.

Accepted image layouts: ``<root>/images/*.png`` (the extracted archives merged), or the
Kaggle layout ``<root>/images_001/images/*.png`` ... ``images_012/images/``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import DataNotFoundError, DatasetFormatError
from ..core.labels import BUILTIN_VOCABULARY, NIH_LABELS, NIH_RAW_LABELS, NO_FINDING, Vocabulary
from ..data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable, find_file, read_label_csv

LABEL_FILE_NAMES = ("Data_Entry_2017.csv", "Data_Entry_2017_v2020.csv")
IMAGE_COLUMN = "Image Index"
FINDINGS_COLUMN = "Finding Labels"
PATIENT_ID_COLUMN = "Patient ID"


def read_nih_labels(
    label_file: str | Path, image_dir: str | Path | None = None, vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> LabelTable:
    """Parse the NIH label file; image paths are ``image_dir/<Image Index>`` (bare names if None), its 14 findings
    named as ``vocabulary`` says."""
    label_file = Path(label_file)
    where = f"{label_file} column {FINDINGS_COLUMN!r}"
    raw = read_label_csv(label_file, [IMAGE_COLUMN, FINDINGS_COLUMN, PATIENT_ID_COLUMN])
    findings = raw[FINDINGS_COLUMN].fillna(NO_FINDING).str.split("|")
    known: dict[str, str] = {}  # each token as the built-in NIH finding it spells
    for token in findings.explode().unique():
        finding = BUILTIN_VOCABULARY.canonical(token, where)
        if finding != NO_FINDING and finding not in NIH_LABELS:
            raise DatasetFormatError(f"{label_file}: {token!r} is not an NIH ChestX-ray14 finding")
        known[token] = finding
    # each built-in finding -> the class its NIH spelling means in ``vocabulary``
    classes = dict(zip(NIH_LABELS, vocabulary.canonical_list(NIH_RAW_LABELS, where), strict=True))
    frame = pd.DataFrame(
        {
            PATH_COLUMN: raw[IMAGE_COLUMN]
            if image_dir is None
            else [str(Path(image_dir) / n) for n in raw[IMAGE_COLUMN]],
            PATIENT_COLUMN: raw[PATIENT_ID_COLUMN].str.strip(),
        }
    )
    positives = findings.map(lambda tokens: {known[token] for token in tokens})
    for finding, name in classes.items():
        frame[name] = positives.map(lambda found, finding=finding: finding in found).to_numpy(dtype=np.float32)
    return LabelTable(source="nih", root=label_file.parent, classes=list(classes.values()), frame=frame)


def nih_image_index(root: Path) -> Path | dict[str, Path] | None:
    """The flat image folder, or a name -> path map over the Kaggle split folders."""
    if (root / "images").is_dir():
        return root / "images"
    split_folders = sorted(p for p in root.glob("images_*/images") if p.is_dir())
    if split_folders:
        return {path.name: path for folder in split_folders for path in folder.iterdir()}
    return None


def load_nih(
    root: str | Path,
    label_file: str | Path | None = None,
    image_dir: str | Path | None = None,
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> LabelTable:
    """Read an NIH ChestX-ray14 folder (see the module docstring for the layouts)."""
    root = Path(root)
    if not root.is_dir():
        raise DataNotFoundError(f"NIH data folder not found: {root}")
    label_path = Path(label_file) if label_file else find_file(root, LABEL_FILE_NAMES, "NIH label file")
    if image_dir is not None:
        table = read_nih_labels(label_path, image_dir, vocabulary)
    else:
        located = nih_image_index(root)
        if located is None:
            raise DataNotFoundError(f"no NIH image folder under {root}: expected images/ or images_001/images/ ...")
        if isinstance(located, Path):
            table = read_nih_labels(label_path, located, vocabulary)
        else:
            table = read_nih_labels(label_path, vocabulary=vocabulary)
            fallback = root / "images"
            table.frame[PATH_COLUMN] = [str(located.get(name, fallback / name)) for name in table.frame[PATH_COLUMN]]
    table.root = root
    return table
