"""Radiology report tables: the Indiana University (Open-i) reports and a hospital's own CSV.

A report table is a :class:`~surgical_aggregation.data.table.LabelTable` with one row per
report (``path`` and ``patient_id`` are the report id, so splits and partitions work as for
images), a ``text`` column and one 0/1 column per finding, named by canonical finding name.
IU reports come from the XML files of ``NLMCXR_reports.tgz`` (torchxrayvision's data folder):
the text is FINDINGS followed by IMPRESSION, and the labels are the radiologists' MeSH "major"
tags mapped onto findings by :data:`MESH_TO_FINDING`. Reports with neither findings nor
impression are skipped and counted.
"""

from __future__ import annotations

import tarfile
import xml.etree.ElementTree as ElementTree
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..core.errors import DataNotFoundError, DatasetFormatError, SiteConfigError
from ..core.labels import BUILTIN_VOCABULARY, Vocabulary
from ..data.columns import header_problem, undeclared_columns
from ..data.reference import reference_file
from ..data.table import PATH_COLUMN, PATIENT_COLUMN, LabelTable
from .names import IU_REPORTS, REPORT_CSV, REPORT_KINDS
from .texts import CSV_OPTIONS, report_rows

IU_ARCHIVE = "NLMCXR_reports.tgz"
TEXT_SECTIONS = ("FINDINGS", "IMPRESSION")

# MeSH major heading (the part before the first "/"), or "heading/qualifier" where the qualifier
# decides, -> canonical finding. Headings not listed (anatomy such as "Lung" or "Spine", "normal",
# granulomas, degenerative spine findings, ...) give no label.
MESH_TO_FINDING: dict[str, str] = {
    "Opacity": "Lung Opacity",
    "Airspace Disease": "Lung Opacity",
    "Density/lung": "Lung Opacity",
    "Pulmonary Atelectasis": "Atelectasis",
    "Cardiomegaly": "Cardiomegaly",
    "Cardiac Shadow/enlarged": "Cardiomegaly",
    "Pleural Effusion": "Pleural Effusion",
    "Consolidation": "Consolidation",
    "Pulmonary Edema": "Edema",
    "Pulmonary Congestion": "Edema",
    "Pneumonia": "Pneumonia",
    "Pneumothorax": "Pneumothorax",
    "Emphysema": "Emphysema",
    "Pulmonary Emphysema": "Emphysema",
    "Pulmonary Disease, Chronic Obstructive": "Emphysema",
    "Pulmonary Fibrosis": "Fibrosis",
    "Nodule": "Nodule",
    "Mass": "Mass",
    "Infiltrate": "Infiltration",
    "Hernia, Hiatal": "Hernia",
    "Fractures, Bone": "Fracture",
    "Thickening/pleura": "Pleural Thickening",
    "Calcinosis/aorta": "Calcification of the Aorta",
    "Calcinosis/aorta, thoracic": "Calcification of the Aorta",
    "Aorta/tortuous": "Tortuous Aorta",
    "Aorta, Thoracic/tortuous": "Tortuous Aorta",
    "Catheters, Indwelling": "Support Devices",
    "Implanted Medical Device": "Support Devices",
    "Surgical Instruments": "Support Devices",
    "Tube, Inserted": "Support Devices",
    "Medical Device": "Support Devices",
    "Stents": "Support Devices",
    "Pacemaker, Artificial": "Support Devices",
}


@dataclass
class ReportLoadSummary:
    """What loading found: every report read, the ones kept, the ones skipped for having no text."""

    source: str
    read: int
    skipped_no_text: int

    @property
    def kept(self) -> int:
        return self.read - self.skipped_no_text

    def describe(self) -> str:
        return f"{self.source}: {self.read} reports, {self.kept} with text, {self.skipped_no_text} without (skipped)"


def mesh_findings(major_tags: Iterable[str]) -> set[str]:
    """The findings a report's MeSH major tags name (``"Opacity/lung/base/left"`` -> Lung Opacity)."""
    found = set()
    for tag in major_tags:
        parts = [part.strip() for part in tag.split("/")]
        for key in (f"{parts[0]}/{parts[1]}" if len(parts) > 1 else None, parts[0]):
            if key in MESH_TO_FINDING:
                found.add(MESH_TO_FINDING[key])
                break
    return found


def parse_iu_report(xml: bytes | str, name: str = "report") -> tuple[str, str, list[str]]:
    """One IU XML report: (report id, findings + impression text, MeSH major tags)."""
    try:
        root = ElementTree.fromstring(xml)
    except ElementTree.ParseError as error:
        raise DatasetFormatError(f"{name}: not valid XML ({error})") from error
    uid = root.find("uId")
    if uid is None or not uid.get("id"):
        raise DatasetFormatError(f"{name}: no <uId id=...> element")
    sections = {node.get("Label"): " ".join((node.text or "").split()) for node in root.iter("AbstractText")}
    text = " ".join(sections[label] for label in TEXT_SECTIONS if sections.get(label))
    majors = [(node.text or "").strip() for node in root.iter("major") if node.text]
    return uid.get("id"), text, majors


TEXT_COLUMN = "text"


def report_table(frame: pd.DataFrame, source: str, root: str | Path, classes: Sequence[str]) -> LabelTable:
    """A LabelTable of reports from columns ``report_id``, ``text`` and the 0/1 ``classes``."""
    table = pd.DataFrame({PATH_COLUMN: frame["report_id"].astype(str), PATIENT_COLUMN: frame["report_id"].astype(str)})
    table[TEXT_COLUMN] = frame["text"].to_numpy()
    for name in classes:
        table[name] = frame[name].astype("float32").to_numpy()
    if table[PATH_COLUMN].duplicated().any():
        duplicated = table[PATH_COLUMN][table[PATH_COLUMN].duplicated()].iloc[0]
        raise DatasetFormatError(f"{source}: report id {duplicated!r} appears more than once")
    return LabelTable(source=source, root=Path(root), classes=list(classes), frame=table.reset_index(drop=True))


def load_iu_reports(
    archive: str | Path | None = None, vocabulary: Vocabulary = BUILTIN_VOCABULARY
) -> tuple[LabelTable, ReportLoadSummary]:
    """The IU reports with text, labelled over every finding :data:`MESH_TO_FINDING` gives (named as ``vocabulary``
    says), most frequent first."""
    path = Path(archive) if archive is not None else reference_file(IU_ARCHIVE)
    if path is None or not path.is_file():
        where = archive if archive is not None else f"torchxrayvision's data folder ({IU_ARCHIVE})"
        raise DataNotFoundError(f"IU reports not found: {where}; install torchxrayvision==1.5.7 (--no-deps)")
    findings = sorted(set(MESH_TO_FINDING.values()))
    rows, read = [], 0
    with tarfile.open(path) as tar:
        for member in sorted(
            (m for m in tar.getmembers() if m.isfile() and m.name.endswith(".xml")), key=lambda m: m.name
        ):
            read += 1
            report_id, text, majors = parse_iu_report(tar.extractfile(member).read(), f"{path}:{member.name}")
            if text:
                present = mesh_findings(majors)
                rows.append({"report_id": report_id, "text": text, **{f: int(f in present) for f in findings}})
    if read == 0:
        raise DatasetFormatError(f"{path}: no XML reports in the archive")
    frame = pd.DataFrame(rows, columns=["report_id", "text", *findings])
    classes = sorted(findings, key=lambda name: (-int(frame[name].sum()), name))
    table = report_table(frame, IU_REPORTS, path.parent, classes).renamed(vocabulary.renaming(classes, str(path)))
    return table, ReportLoadSummary(str(path), read, read - len(frame))


DEFAULT_TEXT_COLUMN = "report"  # a report CSV's text column unless told otherwise


def _read_report_frame(path: Path, text_column: str) -> pd.DataFrame:
    if not path.is_file():
        raise DataNotFoundError(f"report CSV not found: {path.resolve()}")
    try:
        frame = pd.read_csv(path, **CSV_OPTIONS)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError, OSError) as error:
        raise DatasetFormatError(f"{path}: cannot read as CSV ({error})") from None
    problem = header_problem(path, list(frame.columns))
    if problem:
        raise DatasetFormatError(problem)
    if text_column not in frame.columns:
        raise DatasetFormatError(f"{path}: no text column {text_column!r}; columns are {list(frame.columns)}")
    if frame.empty:
        raise DatasetFormatError(f"{path}: no reports (a header only?)")
    return frame


def read_report_texts(path: str | Path, text_column: str = DEFAULT_TEXT_COLUMN) -> LabelTable:
    """Reports to score (``predict``): every row of a CSV with a text column, no labels; a row without text stays
    (the scoring says so)."""
    path = Path(path)
    rows = report_rows(_read_report_frame(path, text_column), text_column)
    return report_table(rows, str(path), path.parent, [])


def load_report_csv(
    path: str | Path,
    text_column: str = DEFAULT_TEXT_COLUMN,
    label_columns: Sequence[str] | None = None,
    new_classes: Sequence[str] | None = None,
    vocabulary: Vocabulary = BUILTIN_VOCABULARY,
) -> tuple[LabelTable, ReportLoadSummary]:
    """A hospital's reports: one row per report, a text column and 0/1 label columns named by finding.

    ``label_columns`` default: every column but the text and an optional ``report_id``, each a finding the vocabulary
    knows or one of ``new_classes`` (:func:`..data.columns.undeclared_columns`). Column
    names are read through ``vocabulary`` (the built-in one and the aliases); values must be 0 or 1.
    """
    path = Path(path)
    frame = _read_report_frame(path, text_column)
    columns = (
        list(label_columns)
        if label_columns is not None
        else [c for c in frame.columns if c not in (text_column, "report_id")]
    )
    if not columns:
        raise DatasetFormatError(f"{path}: no label columns")
    if label_columns is None:
        undeclared_columns(columns, vocabulary, new_classes, str(path))
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise DatasetFormatError(f"{path}: label column(s) {missing} not found")
    names = [vocabulary.canonical(c, where=f"{path} column {c!r}") for c in columns]
    for column in columns:
        values = frame[column]
        if not values.isin([0, 1]).all():
            bad = values[~values.isin([0, 1])].iloc[0]
            raise DatasetFormatError(f"{path}: column {column!r} must hold 0 or 1, found {bad}")
    if len(set(names)) != len(names):
        raise DatasetFormatError(f"{path}: label columns {columns} name the same finding twice ({names})")
    rows = report_rows(frame, text_column)
    keep = rows["text"].str.len() > 0
    for column, name in zip(columns, names, strict=True):
        rows[name] = frame[column].astype(int)
    rows = rows[keep].reset_index(drop=True)
    return report_table(rows, str(path), path.parent, names), ReportLoadSummary(
        str(path), len(frame), int((~keep).sum())
    )


def label_counts(table: LabelTable) -> dict[str, int]:
    """Positive reports per finding."""
    return {name: int((table.frame[name] == 1).sum()) for name in table.classes}


def load_reports(
    kind: str, location: str | Path | None, vocabulary: Vocabulary = BUILTIN_VOCABULARY, /, **options: Any
) -> tuple[LabelTable, ReportLoadSummary]:
    """A site's reports: ``iu_reports`` (``location``: the archive, default torchxrayvision's) or
    ``report_csv`` (``location``: the CSV; options ``text_column``, ``label_columns``, ``new_classes``), named as
    ``vocabulary``
    says."""
    if kind == IU_REPORTS:
        if options:
            raise SiteConfigError(f"report kind {IU_REPORTS!r} takes no data.options, got {sorted(options)}")
        return load_iu_reports(location, vocabulary)
    if kind == REPORT_CSV:
        unknown = sorted(set(options) - {"text_column", "label_columns", "new_classes"})
        if unknown:
            raise SiteConfigError(
                f"report kind {REPORT_CSV!r} takes no data.options {unknown}; it takes text_column, label_columns, "
                "new_classes"
            )
        if location is None:
            raise DataNotFoundError(f"report kind {REPORT_CSV!r} needs data.location: the CSV file")
        return load_report_csv(location, vocabulary=vocabulary, **options)
    raise ValueError(f"unknown report kind {kind!r}; choose one of {REPORT_KINDS}")
