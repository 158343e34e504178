"""The one in-memory shape every dataset layout is read into: image path, patient, labels by name."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from torch.utils.data import Dataset

from ..core.errors import DataNotFoundError, DatasetFormatError
from .columns import header_problem
from .names import UNCERTAINTY_POLICIES

UncertaintyPolicy = Literal["zeros", "ones", "ignore"]
MissingClassPolicy = Literal["error", "negative", "unlabelled"]

PATH_COLUMN = "path"
PATIENT_COLUMN = "patient_id"


@dataclass
class LabelTable:
    """The rows of one dataset (images, or reports) with their patient and labels.

    ``frame`` has the columns ``path`` (str; a report's id for reports), ``patient_id`` (str) and one float column per
    class, named by canonical class name: 1 positive, 0 negative, NaN unlabelled (an uncertain
    label under the "ignore" policy; excluded from loss and metrics).
    """

    source: str
    root: Path
    classes: list[str]
    frame: pd.DataFrame
    split_classes: list[str] | None = None  # what patient splits stratify on (default: ``classes``)
    # False where the data has no patient ids and each image stands for its own patient (VinDr-CXR, RSNA, SIIM, a
    # CSV without a patient column): a patient's images may then sit in two splits, and DP-SGD's patient unit is void
    patients_known: bool = True

    def __post_init__(self) -> None:
        missing = [column for column in (PATH_COLUMN, PATIENT_COLUMN, *self.classes) if column not in self.frame]
        if missing:
            raise DatasetFormatError(f"{self.source} table lacks columns {missing}")

    def __len__(self) -> int:
        return len(self.frame)

    @property
    def paths(self) -> list[str]:
        return self.frame[PATH_COLUMN].tolist()

    def renamed(self, renaming: Mapping[str, str]) -> LabelTable:
        """This table with its classes renamed (``{name here: name wanted}``, e.g. a vocabulary's
        :meth:`~surgical_aggregation.core.labels.Vocabulary.renaming` of a dataset's fixed label list)."""

        def rename(names: list[str]) -> list[str]:
            return [renaming.get(name, name) for name in names]

        split = rename(self.split_classes) if self.split_classes is not None else None
        frame = self.frame.rename(columns=dict(renaming))
        return replace(self, classes=rename(self.classes), frame=frame, split_classes=split)

    @property
    def n_patients(self) -> int:
        return int(self.frame[PATIENT_COLUMN].nunique())

    def label_matrix(
        self, classes: Sequence[str] | None = None, missing: MissingClassPolicy = "error"
    ) -> tuple[np.ndarray, np.ndarray]:
        """(labels, mask) as float32 (N, C) arrays for ``classes`` (default: the table's own).

        ``mask`` is 1 where a label is known. A requested class the dataset does not label is an
        error, or all-negative ("negative", vanilla FL's convention), or unlabelled ("unlabelled",
        excluded from the loss like partial-loss FL).
        """
        classes = list(self.classes if classes is None else classes)
        labels = np.zeros((len(self), len(classes)), dtype=np.float32)
        mask = np.ones_like(labels)
        for column, name in enumerate(classes):
            if name in self.classes:
                values = self.frame[name].to_numpy(dtype=np.float32)
                known = ~np.isnan(values)
                labels[:, column] = np.where(known, values, 0.0)
                mask[:, column] = known
            elif missing == "error":
                raise KeyError(f"{self.source} data has no label {name!r}; it labels {self.classes}")
            elif missing == "unlabelled":
                mask[:, column] = 0.0
        return labels, mask

    def subset(self, rows: np.ndarray | Sequence[int] | pd.Series) -> LabelTable:
        """The table restricted to ``rows`` (positions, or a boolean mask)."""
        rows = np.asarray(rows)
        frame = self.frame[rows] if rows.dtype == bool else self.frame.iloc[rows]
        return replace(self, frame=frame.reset_index(drop=True))

    def positive_counts(self) -> dict[str, int]:
        return {name: int((self.frame[name] == 1).sum()) for name in self.classes}


@dataclass
class MaterialisedTable:
    """A table made usable by its modality (images decoded into the cache, reports embedded): the rows that
    can be trained on, and a dataset for any split of them."""

    table: LabelTable
    dataset: Callable[[LabelTable, bool], Dataset]  # (split of ``table``, is training) -> dataset
    summary: str  # one log line: what was decoded / embedded / reused
    left_out: list[tuple[str, str]] = field(default_factory=list)  # (row, reason): unreadable images, ...


def apply_uncertainty(values: pd.Series, policy: UncertaintyPolicy, where: str) -> np.ndarray:
    """CheXpert-style label values -> float: 1 -> 1, 0 and blank -> 0, -1 -> the policy's value.

    U-Zeros ("zeros") is the papers' default; "ones" is U-Ones; "ignore" makes uncertain labels
    NaN (unlabelled). Any other value is an error naming ``where`` and the offending row.
    """
    if policy not in UNCERTAINTY_POLICIES:
        raise ValueError(f"unknown uncertainty policy {policy!r}; choose one of {', '.join(UNCERTAINTY_POLICIES)}")
    numeric = pd.to_numeric(values, errors="coerce")
    bad = numeric.isna() & values.notna() & (values.astype(str).str.strip() != "")
    bad |= numeric.notna() & ~numeric.isin([1, 0, -1])
    if bad.any():
        position = int(np.flatnonzero(bad.to_numpy())[0])
        raise DatasetFormatError(
            f"{where}: value {values.iloc[position]!r} in data row {position + 1}; expected 1, 0, -1 or blank"
        )
    uncertain_value = {"zeros": 0.0, "ones": 1.0, "ignore": np.nan}[policy]
    result = numeric.fillna(0.0).to_numpy(dtype=np.float32)
    result[result == -1] = uncertain_value
    return result


def read_label_csv(path: Path, required: Sequence[str], blank_only: bool = False) -> pd.DataFrame:
    """Read a CSV (optionally gzipped or zipped) and check it has the ``required`` columns (names stripped).

    ``blank_only``: only an empty cell is missing; "NA", "null", "nan" and the like stay text (a label column's
    values are then checked against the documented set instead of silently read as blanks).
    """
    if path.is_dir():
        csvs = sorted(child.name for child in path.iterdir() if child.suffix.lower() in (".csv", ".gz", ".zip"))[:3]
        hint = f" (it holds {', '.join(csvs)})" if csvs else ""
        raise DataNotFoundError(f"{path.resolve()} is a folder, not a label file: give the CSV file itself{hint}")
    if not path.is_file():
        raise DataNotFoundError(f"label file not found: {path.resolve()}")
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=not blank_only, na_values=[""] if blank_only else None)
    except (pd.errors.ParserError, UnicodeDecodeError, EOFError, OSError) as error:
        raise DatasetFormatError(f"{path}: cannot read as CSV ({error})") from None
    problem = header_problem(path, list(frame.columns))
    if problem:
        raise DatasetFormatError(problem)
    frame.columns = [str(column).strip() for column in frame.columns]  # e.g. SIIM's " EncodedPixels"
    missing = [column for column in required if column not in frame.columns]
    if missing:
        raise DatasetFormatError(f"{path}: missing column(s) {missing}; found {list(frame.columns)}")
    return frame


def find_file(folder: Path, names: Sequence[str], what: str) -> Path:
    """The first of ``names`` (each also tried with .gz) that exists in ``folder``."""
    for name in names:
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    raise DataNotFoundError(f"no {what} in {folder}; expected one of {', '.join(names)} (optionally .gz)")
