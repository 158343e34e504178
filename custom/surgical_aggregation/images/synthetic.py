"""Embedded default data: small, deterministic datasets in the exact release layouts of every kind in
:data:`GENERATED`: NIH ChestX-ray14, CheXpert, MIMIC-CXR-JPG, PadChest, VinDr-CXR, Google's NIH labels, RSNA
pneumonia and SIIM pneumothorax.

No real chest X-ray images can be installed offline, so the demo job, the benchmark grids and the tests run on
generated ones. They are built so that a wrong method can lose on them:

* **Pixels.** A chest-like background (body, two lung fields, rib stripes, heart shadow, soft-tissue shading) whose
  brightness, contrast, noise and file format differ per source (a domain shift, as between hospitals). Every
  finding an image shows stamps its own glyph, a fixed 5x5 binary pattern scaled to the image, at a random place
  (findings overlap one another and the heart shadow), faint (:data:`.synthetic_pixels.FINDING_AMPLITUDE`). Every
  image also carries about :data:`.synthetic_pixels.CLUTTER_SHAPES` structures that are not findings (line segments,
  rings, blobs, bright or dark, of the glyphs' size and contrast). The glyph of a finding is the same in every
  dataset ("Effusion" in NIH and "Pleural Effusion" in CheXpert look alike), no glyph is close to another's or to
  its mirror image, and an uncertain CheXpert/MIMIC label leaves a half-strength glyph. The clutter is what makes
  the task need training: a linear read-out of a randomly initialised DenseNet121's features stays near chance
  (:mod:`surgical_aggregation.evaluation.probe` measures it), while a trained network learns the glyphs.
* **Missing, not absent.** What an image *shows* is drawn over the union of the main job's findings
  (:data:`MAIN_UNION`: NIH's 14 and CheXpert's 13, 20 names); what a dataset *labels* is its layout's columns. So an
  NIH-layout image shows CheXpert-only findings (Support Devices, Lung Opacity, ...) its label file does not name,
  and a CheXpert-layout image shows NIH-only ones (Mass, Nodule, ...): the false negatives that vanilla FL and
  centralized training make of missing labels are there to be made. The findings a layout labels come from its real
  label row; the others are copied from a real row of the dataset that labels them with the same shared findings
  (:class:`.synthetic_labels.DonorRows`; the 7 findings NIH and CheXpert share link the two files): given the shared
  findings, NIH-only and CheXpert-only findings are then independent. With ``co_occurrence="padchest"`` they come
  instead from one real PadChest row that agrees with every finding the image's layout labels (PadChest's names
  say 19 of the 20: :data:`.synthetic_labels.PADCHEST_PHRASES`), so they co-occur as real ones do (Mass with Lung
  Lesion, Infiltration with Lung Opacity).
  ``shown_findings.csv`` beside the label file records every glyph each image carries.
* **Absent, the control.** ``absent`` leaves the named findings out of the pixels (and out of the label file, so
  the folder stays consistent); every other draw is the same. With the findings a site does not label absent, its
  negatives are true ones.
* **Labels.** When torchxrayvision's data files are installed, label rows are real rows of
  the NIH label file and of CheXpert's ``train.csv`` (real co-occurrences, uncertain and blank
  values, views, patient structure); otherwise independent draws at built-in frequencies
  (measured on those same files). Patients are picked so that every finding has at least
  ``min_positive_fraction`` positive patients: the real prevalence of rare findings
  (Hernia: 0.2%) would leave tiny datasets without a single positive.
* **MIMIC.** No MIMIC label file is available offline; MIMIC-style datasets reuse CheXpert
  label rows (both come from the CheXpert labeler) in MIMIC's file layout, and their label file carries the
  NIH-only findings each study shows as extra columns (as CXR-LT's labels add them to MIMIC's images), so the
  external set covers all 20 findings of the main job.
* **The five public datasets** (``images.public``): real label rows of torchxrayvision's copy of each one's
  label file, read by the same rules as the real release.
* **Patterns** (:func:`generate_patterns`): the stand-in pretraining's data, 32 glyph-like 5x5 shapes (none of them
  a finding's drawing), twice a finding's brightness, in the same clutter, no finding of any site.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

from ..core.errors import DataNotFoundError
from ..core.labels import CANONICAL_FINDINGS, CHEXPERT_LABELS, NIH_LABELS, NIH_RAW_LABELS, NO_FINDING
from ..core.progress import PROGRESS_SECONDS
from ..data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE, reference_file
from ..data.table import PATH_COLUMN, PATIENT_COLUMN
from .chexpert import resolve_chexpert_path
from .mimic import mimic_image_path
from .names import CHEXPERT, MIMIC, NIH, PADCHEST_ROWS, SHARED_ROWS
from .public import KEY_COLUMN, PUBLIC_DATASETS, read_public_labels
from .synthetic_labels import (
    MAIN_UNION,
    STREAM_CODES,
    LabelSource,
    chexpert_label_rows,
    finding_donors,
    nih_label_rows,
    pick_patients,
    resolve_label_source,
    shown_findings,
)
from .synthetic_pixels import PATTERN_COUNT, SourceStyle, pattern_glyphs, render_image

logger = logging.getLogger(__name__)
MARKER_FILE = "GENERATED.json"
SHOWN_FILE = "shown_findings.csv"  # beside the label file: every glyph each image carries, labelled or not
GENERATOR_VERSION = 2  # 2: clutter, faint findings, findings shown over the main union (missing, not absent)


def _logging_progress(items: Sequence, what: str) -> Iterator:
    """``items``, with a log line at least every ``PROGRESS_SECONDS`` (generating thousands of images takes a while)."""
    started = last_log = time.monotonic()
    for done, item in enumerate(items, start=1):
        yield item
        if time.monotonic() - last_log >= PROGRESS_SECONDS:
            last_log = time.monotonic()
            logger.info("%s: %d/%d (%.0f s)", what, done, len(items), last_log - started)


def _save(array: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    image = Image.fromarray(array, mode="L")
    if path.suffix == ".jpg":
        image.save(path, quality=95)
    else:
        image.save(path)


def _image_rng(seed: int, kind: str, index: int) -> np.random.Generator:
    return np.random.default_rng([seed, STREAM_CODES[kind], index])


def _donor_rng(seed: int, kind: str) -> np.random.Generator:
    return np.random.default_rng([seed, STREAM_CODES[kind], 2])


def _write_shown(root: Path, paths: Sequence[str], shown: Sequence[Mapping[str, float]]) -> None:
    """``shown_findings.csv``: one row per image (its path under ``root``), one column per finding any image shows,
    the strength its glyph was drawn with (0: not drawn)."""
    names = [name for name in CANONICAL_FINDINGS if any(name in row for row in shown)]
    names += sorted({name for row in shown for name in row} - set(names))
    frame = pd.DataFrame([[row.get(name, 0.0) for name in names] for row in shown], columns=names)
    frame.insert(0, PATH_COLUMN, list(paths))
    root.mkdir(parents=True, exist_ok=True)
    frame.to_csv(root / SHOWN_FILE, index=False)


def read_shown(root: str | Path) -> pd.DataFrame:
    """A generated dataset's ``shown_findings.csv``."""
    return pd.read_csv(Path(root) / SHOWN_FILE)


# --- datasets on disk ----------------------------------------------------------------------------


@dataclass
class GeneratedDataset:
    kind: str
    root: Path  # the folder a loader reads (for CheXpert: the CheXpert-v1.0-small folder)
    n_images: int
    n_patients: int
    image_size: int
    seed: int
    label_origin: str
    absent: tuple[str, ...] = ()  # findings left out of the images (the absent control)
    co_occurrence: str = SHARED_ROWS  # how the findings its layout does not label were drawn

    def describe(self) -> str:
        absent = f"; left out of the images: {', '.join(self.absent)}" if self.absent else ""
        joint = "; unlabelled findings drawn from PadChest's rows" if self.co_occurrence == PADCHEST_ROWS else ""
        return (
            f"embedded {self.kind} dataset at {self.root}: {self.n_images} generated images of "
            f"{self.n_patients} patients at {self.image_size}px (labels: {self.label_origin}{absent}{joint})"
        )


def _strengths(values: Mapping[str, float]) -> dict[str, float]:
    """Label value -> glyph strength: positive full, uncertain half, others none."""
    return {name: 1.0 if value == 1 else 0.5 if value == -1 else 0.0 for name, value in values.items()}


def _checked_absent(absent: Sequence[str], labelled: Collection[str] = (), kind: str = "") -> tuple[str, ...]:
    """The absent findings, canonical and sorted; a public dataset's own labels cannot be absent (its raw rows are
    written as they are)."""
    names = tuple(sorted({str(name) for name in absent}))
    refused = [name for name in names if name in labelled]
    if refused:
        raise ValueError(f"embedded {kind} data: findings it labels cannot be left out of its images: {refused}")
    return names


def _write_chexpert_style_images(
    rows: pd.DataFrame,
    paths: Sequence[Path],
    root: Path,
    kind: str,
    image_size: int,
    seed: int,
    absent: Sequence[str],
    reference: bool,
    co_occurrence: str = SHARED_ROWS,
) -> list[dict[str, float]]:
    """Render CheXpert-layout rows (each study's images show the same findings; ``reference``: the findings it does
    not label come from the real files); returns what each image shows."""
    style = GENERATED[kind].style
    labels = rows[list(CHEXPERT_LABELS)].to_numpy(dtype=np.float64)
    lateral = (rows["Frontal/Lateral"] == "Lateral").to_numpy()
    studies = rows["Path"].str.extract(r"(patient\d+/study\d+)", expand=False).tolist()
    donors, rng = finding_donors(reference, co_occurrence), _donor_rng(seed, kind)
    by_study: dict[str, dict[str, float]] = {}
    shown = []
    for index, path in enumerate(_logging_progress(paths, f"generating {kind} images")):
        if studies[index] not in by_study:
            labelled = _strengths(dict(zip(CHEXPERT_LABELS, labels[index].tolist(), strict=True)))
            by_study[studies[index]] = shown_findings(labelled, CHEXPERT_LABELS, donors, rng, absent)
        shown.append(by_study[studies[index]])
        _save(render_image(shown[-1], image_size, style, _image_rng(seed, kind, index), lateral[index]), path)
    _write_shown(root, [str(path.relative_to(root)) for path in paths], shown)
    return shown


def _without_absent_chexpert(rows: pd.DataFrame, absent: Sequence[str]) -> pd.DataFrame:
    """CheXpert-layout rows with the absent findings negative (No Finding set where nothing positive is left)."""
    if not absent:
        return rows
    rows = rows.copy()
    for name in absent:
        if name in rows:
            rows.loc[rows[name].isin([1.0, -1.0]), name] = 0.0
    nothing = ~(rows[list(CHEXPERT_LABELS)] == 1).any(axis=1)
    rows.loc[nothing, NO_FINDING] = 1.0
    return rows


def generate_nih(
    root: str | Path,
    n_patients: int = 200,
    image_size: int = 64,
    seed: int = 0,
    label_source: LabelSource = "auto",
    min_positive_fraction: float = 0.06,
    max_images_per_patient: int = 3,
    absent: Sequence[str] = (),
    co_occurrence: str = SHARED_ROWS,
) -> GeneratedDataset:
    """Write ``root/Data_Entry_2017.csv``, ``root/images/*.png`` (NIH ChestX-ray14 layout) and ``shown_findings.csv``.

    Each image shows its row's findings and the CheXpert-only findings drawn for it (:func:`shown_findings`), less
    ``absent`` (also taken out of the label file)."""
    root = Path(root)
    absent = _checked_absent(absent)
    rows, origin = nih_label_rows(n_patients, seed, max_images_per_patient, min_positive_fraction, label_source)
    style = GENERATED[NIH].style
    raw_to_name = dict(zip(NIH_RAW_LABELS, NIH_LABELS, strict=True))
    donors = finding_donors(resolve_label_source(label_source, NIH_LABEL_FILE) is not None, co_occurrence)
    rng = _donor_rng(seed, NIH)
    listed = list(zip(rows["Image Index"], rows["Finding Labels"], strict=True))
    shown = []
    for index, (image_name, findings) in enumerate(_logging_progress(listed, "generating nih images")):
        tokens = findings.split("|")
        labelled = {name: float(raw in tokens) for raw, name in raw_to_name.items()}
        shown.append(shown_findings(labelled, NIH_LABELS, donors, rng, absent))
        image = render_image(shown[-1], image_size, style, _image_rng(seed, NIH, index))
        _save(image, root / "images" / image_name)
    if absent:
        kept = [[t for t in f.split("|") if raw_to_name.get(t) not in absent] for f in rows["Finding Labels"]]
        rows = rows.assign(**{"Finding Labels": ["|".join(tokens) or NO_FINDING for tokens in kept]})
    root.mkdir(parents=True, exist_ok=True)
    rows.to_csv(root / "Data_Entry_2017.csv", index=False)
    _write_shown(root, [f"images/{name}" for name in rows["Image Index"]], shown)
    patients = int(rows["Patient ID"].nunique())
    return GeneratedDataset(NIH, root, len(rows), patients, image_size, seed, origin, absent, co_occurrence)


def generate_chexpert(
    root: str | Path,
    n_patients: int = 200,
    image_size: int = 64,
    seed: int = 0,
    label_source: LabelSource = "auto",
    min_positive_fraction: float = 0.06,
    valid_fraction: float = 0.1,
    absent: Sequence[str] = (),
    co_occurrence: str = SHARED_ROWS,
) -> GeneratedDataset:
    """Write ``root/CheXpert-v1.0-small/{train,valid}.csv``, their JPEGs (CheXpert-small layout) and
    ``shown_findings.csv``.

    As in the real release, ``valid.csv`` patients are separate and have no uncertain or blank
    labels. The returned dataset's ``root`` is the ``CheXpert-v1.0-small`` folder. Each study shows its row's
    findings and the NIH-only ones drawn for it, less ``absent`` (also taken out of the label files).
    """
    dataset_root = Path(root) / "CheXpert-v1.0-small"
    absent = _checked_absent(absent)
    rows, origin = chexpert_label_rows(n_patients, seed, 2, min_positive_fraction, label_source)
    reference = resolve_label_source(label_source, CHEXPERT_LABEL_FILE) is not None
    patient = rows["Path"].str.extract(r"(patient\d+)", expand=False)
    patients = patient.drop_duplicates().tolist()
    valid_rng = np.random.default_rng([seed, STREAM_CODES[CHEXPERT], 1])
    valid_patients = valid_rng.choice(patients, size=round(valid_fraction * len(patients)), replace=False)
    is_valid = patient.isin(set(valid_patients.tolist()))
    train_rows = rows[~is_valid].reset_index(drop=True)
    valid_rows = rows[is_valid].reset_index(drop=True)
    valid_rows["Path"] = valid_rows["Path"].str.replace("/train/", "/valid/", regex=False)
    valid_rows[list(CHEXPERT_LABELS)] = valid_rows[list(CHEXPERT_LABELS)].replace(-1.0, 0.0).fillna(0.0)
    all_rows = pd.concat([train_rows, valid_rows], ignore_index=True)
    paths = [resolve_chexpert_path(dataset_root, listed) for listed in all_rows["Path"]]
    _write_chexpert_style_images(
        all_rows, paths, dataset_root, CHEXPERT, image_size, seed, absent, reference, co_occurrence
    )
    _without_absent_chexpert(train_rows, absent).to_csv(dataset_root / "train.csv", index=False)
    _without_absent_chexpert(valid_rows, absent).to_csv(dataset_root / "valid.csv", index=False)
    return GeneratedDataset(
        CHEXPERT, dataset_root, len(all_rows), len(patients), image_size, seed, origin, absent, co_occurrence
    )


def generate_mimic(
    root: str | Path,
    n_patients: int = 100,
    image_size: int = 64,
    seed: int = 0,
    label_source: LabelSource = "auto",
    min_positive_fraction: float = 0.06,
    absent: Sequence[str] = (),
    co_occurrence: str = SHARED_ROWS,
) -> GeneratedDataset:
    """Write MIMIC-CXR-JPG's two label CSVs (gzipped), ``files/pXX/pSUBJECT/sSTUDY/<dicom>.jpg`` and
    ``shown_findings.csv``. The label file carries, after the CheXpert labeler's 14 columns, one column per NIH-only
    finding (1 where the study shows it), as CXR-LT's labels extend MIMIC's: all 20 findings of the main job."""
    root = Path(root)
    absent = _checked_absent(absent)
    rows, origin = chexpert_label_rows(n_patients, seed, 2, min_positive_fraction, label_source, kind="mimic")
    rng = np.random.default_rng([seed, STREAM_CODES[MIMIC], 1])
    patient = rows["Path"].str.extract(r"(patient\d+)", expand=False)
    study = rows["Path"].str.extract(r"(patient\d+/study\d+)", expand=False)
    subject_ids = {name: str(10_000_000 + i) for i, name in enumerate(patient.drop_duplicates())}
    study_ids = {name: str(50_000_000 + i) for i, name in enumerate(study.drop_duplicates())}
    metadata = pd.DataFrame(
        {
            "dicom_id": ["-".join(f"{int(v):08x}" for v in rng.integers(0, 2**32, 5)) for _ in range(len(rows))],
            "subject_id": patient.map(subject_ids),
            "study_id": study.map(study_ids),
            "ViewPosition": np.where(rows["Frontal/Lateral"] == "Frontal", rows["AP/PA"].fillna("AP"), "LATERAL"),
            "Rows": round(image_size * GENERATED[MIMIC].style.aspect),
            "Columns": image_size,
        }
    )
    paths = [
        mimic_image_path(root, subject, study_id, dicom)
        for dicom, subject, study_id in zip(
            metadata["dicom_id"], metadata["subject_id"], metadata["study_id"], strict=True
        )
    ]
    reference = resolve_label_source(label_source, CHEXPERT_LABEL_FILE) is not None
    shown = _write_chexpert_style_images(rows, paths, root, MIMIC, image_size, seed, absent, reference, co_occurrence)
    nih_only = [name for name in MAIN_UNION if name not in CHEXPERT_LABELS]
    extra = pd.DataFrame(
        [[1.0 if row.get(name) == 1 else np.nan for name in nih_only] for row in shown], columns=nih_only
    )
    labels = _without_absent_chexpert(rows, absent).assign(
        subject_id=metadata["subject_id"], study_id=metadata["study_id"]
    )
    labels = pd.concat([labels, extra], axis=1)
    labels = labels.drop_duplicates("study_id")[["subject_id", "study_id", NO_FINDING, *CHEXPERT_LABELS, *nih_only]]
    labels.to_csv(root / "mimic-cxr-2.0.0-chexpert.csv.gz", index=False)
    metadata.to_csv(root / "mimic-cxr-2.0.0-metadata.csv.gz", index=False)
    origin += " (CheXpert rows in MIMIC layout, with the NIH-only findings each study shows)"
    return GeneratedDataset(MIMIC, root, len(rows), len(subject_ids), image_size, seed, origin, absent, co_occurrence)


def generate_public(
    kind: str,
    root: str | Path,
    n_patients: int = 200,
    image_size: int = 64,
    seed: int = 0,
    max_images_per_patient: int = 2,
    label_source: LabelSource = "reference",
    absent: Sequence[str] = (),
    co_occurrence: str = SHARED_ROWS,
) -> GeneratedDataset:
    """A public dataset of :mod:`.public` in its release layout: real label rows from torchxrayvision's copy
    of its label file (required), the images generated. Patients are picked rarest finding first, as many per
    finding as half the patients allow (at least one), so every finding of the file (under the loader's default
    rules) has a positive image when ``n_patients`` allows (PadChest: about 190 patients). Each image also shows
    the main-union findings its dataset does not label, drawn as for NIH and CheXpert (less ``absent``, which may
    not name one it labels)."""
    dataset = PUBLIC_DATASETS[kind]
    if label_source == "builtin":
        raise ValueError(f"embedded {dataset.title} data has real label rows only; use label_source auto or reference")
    reference = reference_file(dataset.reference)
    if reference is None:
        raise DataNotFoundError(
            f"embedded {dataset.title} data needs the real label file {dataset.reference}: install torchxrayvision's "
            "data files with 'pip install --no-deps torchxrayvision==1.5.7'"
        )
    rng = np.random.default_rng([seed, STREAM_CODES[kind]])
    raw, parsed = read_public_labels(kind, reference)
    classes = [column for column in parsed.columns if column not in (KEY_COLUMN, PATIENT_COLUMN, PATH_COLUMN)]
    absent = _checked_absent(absent, classes, kind)
    # each patient's images with the rarest findings first, so a finding seen once survives the cap
    rarity = ((parsed[classes] == 1) / parsed[classes].sum().clip(lower=1)).max(axis=1)
    parsed = parsed.loc[rarity.sort_values(ascending=False, kind="stable").index]
    parsed = parsed.groupby(PATIENT_COLUMN, sort=False).head(max_images_per_patient).sort_index()
    per_patient = (parsed[classes] == 1).groupby(parsed[PATIENT_COLUMN]).any()
    per_finding = max(1, n_patients // (2 * len(classes)))
    chosen = set(pick_patients(per_patient, n_patients, per_finding / n_patients, rng))
    images = parsed[parsed[PATIENT_COLUMN].isin(chosen)].reset_index(drop=True)
    root = Path(root)
    image_root = root / "images" if kind == "google-nih" else root  # NIH's folder for Google's labels
    style = GENERATED[kind].style
    labels = images[classes].to_numpy()
    donors, donor_rng = finding_donors(True, co_occurrence), _donor_rng(seed, kind)
    relative_paths = images[PATH_COLUMN].tolist()
    shown = []
    for index, relative in enumerate(_logging_progress(relative_paths, f"generating {kind} images")):
        labelled = {name: float(value == 1) for name, value in zip(classes, labels[index], strict=True)}
        shown.append(shown_findings(labelled, classes, donors, donor_rng, absent))
        image = render_image(shown[-1], image_size, style, _image_rng(seed, kind, index))
        _save(image, image_root / relative)
    root.mkdir(parents=True, exist_ok=True)
    rows = raw[raw[dataset.key_column].isin(set(images[KEY_COLUMN]))]
    rows.to_csv(root / dataset.label_files[0], index=False)
    _write_shown(root, [str((image_root / relative).relative_to(root)) for relative in relative_paths], shown)
    origin = f"real {dataset.title} label rows from {reference}"
    return GeneratedDataset(kind, root, len(images), len(chosen), image_size, seed, origin, absent, co_occurrence)


PATTERN_CODE = STREAM_CODES["patterns"]
PATTERN_STYLE = SourceStyle(0.60, 0.24, 0.64, 0.05, ".png", 1.05)  # a source of its own
PATTERN_PREVALENCE = 0.09  # about 3 of the 32 shapes an image: more would overlap at 64 px (as many with more shapes)
PATTERN_STRENGTH = 2.0  # twice a finding's brightness: salient, as ImageNet's objects are and chest findings are not


def generate_patterns(
    root: str | Path,
    n_images: int = 2000,
    image_size: int = 64,
    seed: int = 0,
    strength: tuple[float, float] = (PATTERN_STRENGTH, PATTERN_STRENGTH),
    shapes: int = PATTERN_COUNT,
    per_image: int = 0,
) -> Path:
    """The stand-in pretraining's data (``csv`` layout): ``root/patterns.csv`` (``path``, ``patient_id``, one 0/1
    column per pattern of :func:`pattern_glyphs`) and ``root/images/*.png``, each pattern present with probability
    :data:`PATTERN_PREVALENCE`, in the findings' clutter and no finding at all. Returns the CSV's path.

    ``strength``: each drawn pattern's brightness, uniform in this range, in multiples of a finding's (a stream of
    its own: the labels and every other pixel stay those of the default). ``shapes``: the vocabulary's size (a probe's
    option); each shape is then as much rarer as the images still show about as many shapes each. ``per_image``: when
    above 0, every image shows exactly that many shapes, drawn without replacement (a probe's option: how many shapes
    an image shows then says nothing about which, so a feature that counts them does not lower the loss)."""
    root = Path(root)
    patterns = pattern_glyphs(shapes)
    names = list(patterns)
    # the default's own figure, not a product that could move a label by rounding (the shipped stand-in's images)
    prevalence = PATTERN_PREVALENCE if shapes == PATTERN_COUNT else PATTERN_PREVALENCE * PATTERN_COUNT / shapes
    labels = np.random.default_rng([seed, PATTERN_CODE]).random((n_images, len(names))) < prevalence
    if per_image:
        if not 0 < per_image <= len(names):
            raise ValueError(f"per_image = {per_image}: an image can show 1 to {len(names)} of the {len(names)} shapes")
        chosen = np.random.default_rng([seed, PATTERN_CODE, 2])
        labels = np.zeros((n_images, len(names)), dtype=bool)
        for row in labels:
            row[chosen.choice(len(names), per_image, replace=False)] = True
    rows = []
    for index in _logging_progress(range(n_images), "generating pattern images"):
        strengths = np.random.default_rng([seed, PATTERN_CODE, index, 1]).uniform(*strength, len(names))
        present = {name: float(level) for name, on, level in zip(names, labels[index], strengths, strict=True) if on}
        image = render_image(present, image_size, PATTERN_STYLE, np.random.default_rng([seed, PATTERN_CODE, index]),
                             glyphs=patterns.__getitem__)  # fmt: skip
        relative = f"images/{index:05d}.png"
        _save(image, root / relative)
        rows.append([relative, f"p{index:05d}", *labels[index].astype(int).tolist()])
    csv_path = root / "patterns.csv"
    pd.DataFrame(rows, columns=[PATH_COLUMN, PATIENT_COLUMN, *names]).to_csv(csv_path, index=False)
    return csv_path


@dataclass(frozen=True)
class GeneratedKind:
    """How one kind's embedded dataset is made."""

    style: SourceStyle  # how its images look
    generate: Callable[..., GeneratedDataset]


GENERATED: dict[str, GeneratedKind] = {
    NIH: GeneratedKind(SourceStyle(0.58, 0.22, 0.62, 0.05, ".png", 1.0), generate_nih),
    CHEXPERT: GeneratedKind(SourceStyle(0.66, 0.30, 0.70, 0.07, ".jpg", 1.15), generate_chexpert),
    MIMIC: GeneratedKind(SourceStyle(0.52, 0.18, 0.58, 0.06, ".jpg", 1.2), generate_mimic),
    **{
        kind: GeneratedKind(style, functools.partial(generate_public, kind))
        for kind, style in (
            ("padchest", SourceStyle(0.62, 0.26, 0.66, 0.04, ".png", 1.1)),
            ("vindr", SourceStyle(0.55, 0.20, 0.64, 0.05, ".png", 1.05)),
            ("google-nih", SourceStyle(0.58, 0.22, 0.62, 0.05, ".png", 1.0)),
            ("rsna", SourceStyle(0.50, 0.16, 0.56, 0.07, ".png", 1.0)),
            ("siim", SourceStyle(0.60, 0.24, 0.60, 0.06, ".png", 1.0)),
        )
    },
}


def ensure_generated(kind: str, root: str | Path, **options) -> tuple[GeneratedDataset, bool]:
    """Generate ``kind`` under ``root`` unless a dataset made with the same options is there.

    Returns the dataset and whether it was generated now (callers say so in their log). The
    options are recorded in ``GENERATED.json`` next to the label files.
    """
    if kind not in GENERATED:
        raise ValueError(f"no generator for {kind!r}; choose one of {', '.join(GENERATED)}")
    root = Path(root)
    marker = (root / "CheXpert-v1.0-small" if kind == "chexpert" else root) / MARKER_FILE
    options = {**options, "absent": list(options["absent"])} if "absent" in options else options
    request = {"kind": kind, "options": options, "version": GENERATOR_VERSION}
    if marker.is_file():
        recorded = json.loads(marker.read_text())
        if recorded.get("request") == request:
            dataset = recorded["dataset"]
            fields = {**dataset, "root": Path(dataset["root"]), "absent": tuple(dataset.get("absent", ()))}
            return GeneratedDataset(**fields), False
    dataset = GENERATED[kind].generate(root, **options)
    marker.write_text(
        json.dumps({"request": request, "dataset": {**asdict(dataset), "root": str(dataset.root)}}, indent=2)
    )
    return dataset, True
