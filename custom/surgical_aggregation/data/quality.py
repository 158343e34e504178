"""What is wrong with a site's label table, said at entry (``prepare``, ``check-site``, the site's start) with the
file, rows and counts: an image listed under two patients is refused (it would break "no patient in two splits");
an image listed twice for one patient, with the same or conflicting labels, and a class without positives or
negatives in a split are reported."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from ..core.errors import DatasetFormatError
from .table import PATH_COLUMN, PATIENT_COLUMN, LabelTable

EXAMPLES = 3  # cases named in one line; the count says how many there are


def _rows(indices: Sequence[int]) -> str:
    return ", ".join(str(index + 1) for index in indices)


def _listing(cases: list[str]) -> str:
    more = f"; and {len(cases) - EXAMPLES} more" if len(cases) > EXAMPLES else ""
    return "; ".join(cases[:EXAMPLES]) + more


def duplicate_images(table: LabelTable, where: str) -> list[str]:
    """Refuse an image listed under several patients; report one listed several times (rows are the table's data
    rows, which are the file's for a CSV)."""
    frame = table.frame.reset_index(drop=True)
    repeated = frame[frame[PATH_COLUMN].duplicated(keep=False)]
    if repeated.empty:
        return []
    leaking, conflicting, same = [], [], []
    for path, group in repeated.groupby(PATH_COLUMN, sort=True):
        rows = _rows(group.index.tolist())
        patients = sorted(group[PATIENT_COLUMN].astype(str).unique())
        if len(patients) > 1:
            leaking.append(f"{path} (rows {rows}: patients {', '.join(patients)})")
        elif len(group[table.classes].drop_duplicates()) > 1:
            conflicting.append(f"{path} (rows {rows})")
        else:
            same.append(f"{path} (rows {rows})")
    if leaking:
        raise DatasetFormatError(
            f"{where}: {len(leaking)} image(s) listed under more than one patient, which would put a patient's image "
            f"in two splits: {_listing(leaking)}; give each image its one patient"
        )
    lines = []
    if conflicting:
        lines.append(
            f"{where}: {len(conflicting)} image(s) listed more than once with different labels (each row trains as "
            f"given): {_listing(conflicting)}"
        )
    if same:
        lines.append(
            f"{where}: {len(same)} image(s) listed more than once with the same labels (each counts once per row): "
            f"{_listing(same)}"
        )
    return lines


def one_sided_classes(splits: Mapping[str, LabelTable], where: str) -> list[str]:
    """Classes without a positive or without a negative in a split: nothing to learn (train) or no AUROC (others)."""
    lines = []
    for split, table in splits.items():
        for side, value in (("positive", 1.0), ("negative", 0.0)):
            empty = [name for name in table.classes if not np.any(table.frame[name].to_numpy() == value)]
            if empty and len(table):
                lines.append(
                    f"{where}: {len(empty)} class(es) with no {side} image in the {split} split ({len(table)} images): "
                    + ", ".join(empty)
                )
    return lines
