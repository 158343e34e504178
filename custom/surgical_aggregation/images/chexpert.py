"""CheXpert (v1.0 and v1.0-small): ``train.csv``/``valid.csv`` with a ``Path`` column.

Frontal images only (lateral views are dropped, as in the papers); "No Finding" is dropped;
uncertain labels (-1) follow the uncertainty policy (U-Zeros by default).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path, PurePosixPath

import pandas as pd

from ..core.errors import DataNotFoundError, DatasetFormatError
from ..core.labels import BUILTIN_VOCABULARY, CHEXPERT_LABELS, Vocabulary
from ..data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable, UncertaintyPolicy, apply_uncertainty, read_label_csv

SPLIT_FOLDERS = ("train", "valid", "test")
VIEW_COLUMN = "Frontal/Lateral"


def resolve_chexpert_path(root: Path, listed: str) -> Path:
    """``CheXpert-v1.0-small/train/patient1/...`` -> ``<root>/train/patient1/...``.

    The CSVs prefix paths with the archive's folder name; whatever the user renamed that
    folder to, the part from ``train/``/``valid/`` on is what is under ``root``.
    """
    parts = PurePosixPath(listed.replace("\\", "/")).parts
    for position, part in enumerate(parts):
        if part in SPLIT_FOLDERS:
            return root.joinpath(*parts[position:])
    return root.joinpath(*parts)


def load_chexpert(
    root: str | Path,
    csv_files: Sequence[str] = ("train.csv", "valid.csv"),
    uncertainty: UncertaintyPolicy = "zeros",
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> LabelTable:
    """Read a CheXpert folder holding ``csv_files`` (the missing ones are skipped, not all of them); its 13
    findings named as ``vocabulary`` says."""
    root = Path(root)
    if not root.is_dir():
        raise DataNotFoundError(f"CheXpert data folder not found: {root}")
    present = [root / name for name in csv_files if (root / name).is_file()]
    if not present:
        raise DataNotFoundError(f"no CheXpert label file in {root}; expected {', '.join(csv_files)}")
    frames = [_read_one(path, root, uncertainty) for path in present]
    frame = pd.concat(frames, ignore_index=True)
    table = LabelTable(source="chexpert", root=root, classes=list(CHEXPERT_LABELS), frame=frame)
    return table.renamed(vocabulary.renaming(CHEXPERT_LABELS, f"{present[0]} columns"))


def _read_one(path: Path, root: Path, uncertainty: UncertaintyPolicy) -> pd.DataFrame:
    raw = read_label_csv(path, ["Path", VIEW_COLUMN, *CHEXPERT_LABELS], blank_only=True)
    raw = raw[raw[VIEW_COLUMN].str.strip().str.casefold() == "frontal"].reset_index(drop=True)
    patients = raw["Path"].str.extract(r"(patient\d+)", expand=False)
    if patients.isna().any():
        row = int(patients.isna().to_numpy().nonzero()[0][0])
        raise DatasetFormatError(f"{path}: no 'patientNNNNN' in Path {raw['Path'].iloc[row]!r}")
    frame = pd.DataFrame(
        {
            PATH_COLUMN: [str(resolve_chexpert_path(root, listed)) for listed in raw["Path"]],
            PATIENT_COLUMN: patients,
        }
    )
    for name in CHEXPERT_LABELS:
        frame[name] = apply_uncertainty(raw[name], uncertainty, f"{path} column {name!r}")
    return frame
