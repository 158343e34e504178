"""Any hospital's own data: a CSV with an image path column and one column per finding.

Label columns are named by finding (any accepted spelling, e.g. "Effusion"); values are
1 / 0 / -1 (uncertain, by the uncertainty policy) / blank (negative). Relative image paths
are resolved against ``image_root`` (default: the CSV's folder).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from ..core.errors import DatasetFormatError
from ..core.labels import BUILTIN_VOCABULARY, NO_FINDING, Vocabulary
from ..data.columns import undeclared_columns
from ..data.table import (
    PATH_COLUMN,
    PATIENT_COLUMN,
    LabelTable,
    UncertaintyPolicy,
    apply_uncertainty,
    read_label_csv,
)


def load_csv_table(
    csv_path: str | Path,
    image_column: str = "path",
    patient_column: str | None = "patient_id",
    label_columns: Sequence[str] | None = None,
    image_root: str | Path | None = None,
    uncertainty: UncertaintyPolicy = "zeros",
    source: str = "csv",
    new_classes: Sequence[str] | None = None,
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> LabelTable:
    """Read a generic label CSV.

    ``label_columns`` defaults to every column except the image and patient columns; a column so taken must name a
    finding the vocabulary knows or one of ``new_classes`` (:func:`..data.columns.undeclared_columns`). Without a
    patient column each image counts as its own patient (splits can then not keep a patient's
    images together, so prefer providing one).
    """
    csv_path = Path(csv_path)
    required = [image_column] + ([patient_column] if patient_column else [])
    raw = read_label_csv(csv_path, required + list(label_columns or []), blank_only=True)
    if label_columns is None:
        label_columns = [column for column in raw.columns if column not in required]
        undeclared_columns(label_columns, vocabulary, new_classes, str(csv_path))
    if not label_columns:
        raise DatasetFormatError(f"{csv_path}: no label columns besides {required}")
    names: dict[str, str] = {}
    for column in label_columns:
        name = vocabulary.canonical(column, f"{csv_path} column {column!r}")
        same = [earlier for earlier, meaning in names.items() if meaning == name]
        if same:
            raise DatasetFormatError(f"{csv_path}: columns {same[0]!r} and {column!r} both mean {name!r}")
        names[column] = name
    names = {column: name for column, name in names.items() if name != NO_FINDING}
    base = Path(image_root) if image_root is not None else csv_path.parent
    listed = raw[image_column]
    if listed.isna().any():
        row = int(listed.isna().to_numpy().nonzero()[0][0])
        raise DatasetFormatError(f"{csv_path}: empty {image_column!r} in data row {row + 1}")
    if patient_column:
        patients = raw[patient_column].fillna("").astype(str).str.strip()
        blank = np.flatnonzero(patients.to_numpy() == "")
        if len(blank):
            shown = ", ".join(str(row + 1) for row in blank[:10]) + (", ..." if len(blank) > 10 else "")
            raise DatasetFormatError(
                f"{csv_path}: {len(blank)} data row(s) with a blank {patient_column!r} (rows {shown}): every image "
                "needs its patient, or the splits cannot keep a patient's images in one split; fill them in (or set "
                "data.options.patient_column to null to make each image its own patient)"
            )
    frame = pd.DataFrame(
        {
            PATH_COLUMN: [str(path if Path(path).is_absolute() else base / path) for path in listed],
            PATIENT_COLUMN: patients if patient_column else listed.astype(str),
        }
    )
    for column, name in names.items():
        frame[name] = apply_uncertainty(raw[column], uncertainty, f"{csv_path} column {column!r}")
    return LabelTable(
        source=source, root=base, classes=list(names.values()), frame=frame, patients_known=bool(patient_column)
    )
