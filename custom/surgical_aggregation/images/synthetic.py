"""Embedded default data: small, deterministic datasets in the exact release layouts of every kind in
:data:`GENERATED`: NIH ChestX-ray14, CheXpert, MIMIC-CXR-JPG, PadChest, VinDr-CXR, Google's NIH labels, RSNA
pneumonia and SIIM pneumothorax.

No real chest X-ray images can be installed offline, so the demo job, the benchmark grids and the tests run on
generated ones. They are built so that a wrong method can lose on them:

* **Pixels.** A chest-like background (body, two lung fields, rib stripes, heart shadow, soft-tissue shading) whose
  brightness, contrast, noise and file format differ per source (a domain shift, as between hospitals). Every
  finding an image shows stamps its own glyph, a fixed 5x5 binary pattern scaled to the image, at a random place
  (findings overlap one another and the heart shadow), faint (:data:`FINDING_AMPLITUDE`). Every image also carries
  about :data:`CLUTTER_SHAPES` structures that are not findings (line segments, rings, blobs, bright or dark, of
  the glyphs' size and contrast). The glyph of a finding is the same in every dataset ("Effusion" in NIH and
  "Pleural Effusion" in CheXpert look alike), no glyph is close to another's or to its mirror image, and an
  uncertain CheXpert/MIMIC label leaves a half-strength glyph. The clutter is what makes the task need training:
  a linear read-out of a randomly initialised DenseNet121's features stays near chance
  (:mod:`surgical_aggregation.evaluation.probe` measures it), while a trained network learns the glyphs.
* **Missing, not absent.** What an image *shows* is drawn over the union of the main job's findings
  (:data:`MAIN_UNION`: NIH's 14 and CheXpert's 13, 20 names); what a dataset *labels* is its layout's columns. So
  an NIH-layout image shows CheXpert-only findings (Support Devices, Lung Opacity, ...) its label file does not
  name, and a CheXpert-layout image shows NIH-only ones (Mass, Nodule, ...): the false negatives that vanilla FL
  and centralized training make of missing labels are there to be made. The findings a layout labels come from
  its real label row; the others are copied from a real row of the dataset that labels them with the same
  shared findings (:class:`DonorRows`; the 7 findings NIH and CheXpert share link the two files). Assumed, since
  no file labels both vocabularies: given the shared findings, NIH-only and CheXpert-only findings are
  independent. ``shown_findings.csv`` beside the label file records every glyph each image carries.
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
* **Patterns** (:func:`generate_patterns`): the stand-in pretraining's data, 4x4 patterns (a family no finding's
  5x5 glyph belongs to) in the same clutter, no finding of any site.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from PIL import Image

from ..core.errors import DataNotFoundError
from ..core.labels import CANONICAL_FINDINGS, CHEXPERT_LABELS, NIH_LABELS, NIH_RAW_LABELS, NO_FINDING, union_labels
from ..core.progress import PROGRESS_SECONDS
from ..data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE, reference_file
from ..data.table import PATH_COLUMN, PATIENT_COLUMN
from .chexpert import resolve_chexpert_path
from .mimic import mimic_image_path
from .names import CHEXPERT, MIMIC, NIH
from .public import KEY_COLUMN, PUBLIC_DATASETS, read_public_labels

logger = logging.getLogger(__name__)
LabelSource = Literal["auto", "reference", "builtin"]
MARKER_FILE = "GENERATED.json"
SHOWN_FILE = "shown_findings.csv"  # beside the label file: every glyph each image carries, labelled or not
GENERATOR_VERSION = 2  # 2: clutter, faint findings, findings shown over the main union (missing, not absent)
GLYPH_CELLS = 5
PATTERN_CELLS = 4  # the stand-in pretraining's patterns: a family no finding's glyph belongs to
_GLYPH_SEED = 20230301  # fixed: a finding's glyph must not depend on any dataset's seed
_PATTERN_SEED = 20240517
PATTERN_COUNT = 24

# How hard the images are (evaluation.probe and the benchmark's pages report what they give).
FINDING_AMPLITUDE = (0.2, 0.45)  # a glyph's added brightness (times its strength: 1, or 0.5 when uncertain)
CLUTTER_SHAPES = 16  # mean number (Poisson) of structures per image that are not findings
CLUTTER_AMPLITUDE = (0.15, 0.4)  # their brightness, added or taken away
RIB_AMPLITUDE = 0.04
SOFT_TISSUE_AMPLITUDE = 0.05  # low-frequency shading over the whole image

# The main job's findings (NIH's and CheXpert's, 20): what every embedded image may show, whatever its layout
# labels. The 7 both label link their files when a finding one of them does not label is drawn (DonorRows).
MAIN_UNION: tuple[str, ...] = tuple(union_labels(NIH_LABELS, CHEXPERT_LABELS))
SHARED_FINDINGS: tuple[str, ...] = tuple(name for name in NIH_LABELS if name in CHEXPERT_LABELS)

# Prevalence per image, measured on the real label files (frontal CheXpert images).
NIH_PREVALENCE: dict[str, float] = {
    "Atelectasis": 0.1031,
    "Cardiomegaly": 0.0248,
    "Consolidation": 0.0416,
    "Edema": 0.0205,
    "Pleural Effusion": 0.1188,
    "Emphysema": 0.0224,
    "Fibrosis": 0.0150,
    "Hernia": 0.0020,
    "Infiltration": 0.1774,
    "Mass": 0.0516,
    "Nodule": 0.0565,
    "Pleural Thickening": 0.0302,
    "Pneumonia": 0.0128,
    "Pneumothorax": 0.0473,
}
# (positive, uncertain, blank) shares; the rest are explicit zeros.
CHEXPERT_RATES: dict[str, tuple[float, float, float]] = {
    "Enlarged Cardiomediastinum": (0.0481, 0.0538, 0.818),
    "Cardiomegaly": (0.1224, 0.0351, 0.801),
    "Lung Opacity": (0.4932, 0.0232, 0.457),
    "Lung Lesion": (0.0369, 0.0058, 0.953),
    "Edema": (0.2600, 0.0619, 0.595),
    "Consolidation": (0.0680, 0.1276, 0.702),
    "Pneumonia": (0.0245, 0.0837, 0.882),
    "Atelectasis": (0.1556, 0.1563, 0.683),
    "Pneumothorax": (0.0926, 0.0142, 0.643),
    "Pleural Effusion": (0.4026, 0.0501, 0.415),
    "Pleural Other": (0.0131, 0.0095, 0.976),
    "Fracture": (0.0389, 0.0026, 0.948),
    "Support Devices": (0.5610, 0.0048, 0.406),
}
CHEXPERT_COLUMNS = ["Path", "Sex", "Age", "Frontal/Lateral", "AP/PA", NO_FINDING, *CHEXPERT_LABELS]
NIH_COLUMNS = [
    "Image Index",
    "Finding Labels",
    "Follow-up #",
    "Patient ID",
    "Patient Age",
    "Patient Gender",
    "View Position",
    "OriginalImage[Width",
    "Height]",
    "OriginalImagePixelSpacing[x",
    "y]",
]


# --- pixels -------------------------------------------------------------------------------------


def _acceptable(glyph: np.ndarray, others: Sequence[np.ndarray]) -> bool:
    """9-16 cells, not its own mirror image, >= 8 cells from every other glyph and its mirror image."""
    if not 9 <= glyph.sum() <= 16 or np.abs(glyph - glyph[:, ::-1]).sum() < 4:
        return False
    return all(np.abs(glyph - other).sum() >= 8 and np.abs(glyph - other[:, ::-1]).sum() >= 8 for other in others)


@functools.cache
def finding_glyphs() -> dict[str, np.ndarray]:
    """One distinct 5x5 binary glyph per CXR-LT finding (fixed for all datasets and runs).

    Any two glyphs, and any glyph and another's mirror image, differ in at least 8 of 25 cells.
    """
    rng = np.random.default_rng(_GLYPH_SEED)
    chosen: list[np.ndarray] = []
    for _ in CANONICAL_FINDINGS:
        while True:
            glyph = (rng.random((GLYPH_CELLS, GLYPH_CELLS)) < 0.5).astype(np.float32)
            if _acceptable(glyph, chosen):
                chosen.append(glyph)
                break
    return dict(zip(CANONICAL_FINDINGS, chosen, strict=True))


@functools.cache
def finding_glyph(name: str) -> np.ndarray:
    """The glyph of any finding: the CXR-LT findings' fixed table, else one derived from the name alone (its
    own generator), >= 8 cells from every table glyph; so any dataset's new findings get their own glyphs."""
    table = finding_glyphs()
    if name in table:
        return table[name]
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))
    while True:
        glyph = (rng.random((GLYPH_CELLS, GLYPH_CELLS)) < 0.5).astype(np.float32)
        if _acceptable(glyph, list(table.values())):
            return glyph


@dataclass(frozen=True)
class SourceStyle:
    """How one source's images look: the domain shift between hospitals."""

    body: float
    lung: float
    heart: float
    noise: float
    file_suffix: str
    aspect: float  # height / width


@functools.cache
def pattern_glyphs() -> dict[str, np.ndarray]:
    """The stand-in pretraining's :data:`PATTERN_COUNT` 4x4 patterns (``"Pattern 01"`` ...): 6-10 cells each, none its
    own mirror image, any two (or one and the other's mirror image) at least 5 cells apart. No finding's glyph is a
    4x4 pattern, so a backbone pretrained on them has learnt no finding."""
    rng = np.random.default_rng(_PATTERN_SEED)
    chosen: list[np.ndarray] = []
    while len(chosen) < PATTERN_COUNT:
        pattern = (rng.random((PATTERN_CELLS, PATTERN_CELLS)) < 0.5).astype(np.float32)
        if not 6 <= pattern.sum() <= 10 or np.abs(pattern - pattern[:, ::-1]).sum() < 4:
            continue
        if all(np.abs(pattern - o).sum() >= 5 and np.abs(pattern - o[:, ::-1]).sum() >= 5 for o in chosen):
            chosen.append(pattern)
    return {f"Pattern {index:02d}": pattern for index, pattern in enumerate(chosen, start=1)}


def _add_clutter(image: np.ndarray, body: np.ndarray, rng: np.random.Generator) -> None:
    """Structures that are not findings, in place: line segments, rings and blobs of the glyphs' size, each
    brighter or darker than what it lies on."""
    height, width = image.shape
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    for _ in range(rng.poisson(CLUTTER_SHAPES)):
        kind = rng.integers(3)
        centre_y, centre_x = rng.uniform(0.2, 0.85) * height, rng.uniform(0.12, 0.88) * width
        amplitude = rng.uniform(*CLUTTER_AMPLITUDE) * rng.choice((-1.0, 1.0))
        if kind == 0:  # a line segment
            angle = rng.uniform(0, math.pi)
            length, thickness = rng.uniform(0.1, 0.35) * width, rng.uniform(0.8, 1.8) * max(1.0, width / 64)
            along = (x - centre_x) * math.cos(angle) + (y - centre_y) * math.sin(angle)
            across = np.abs((y - centre_y) * math.cos(angle) - (x - centre_x) * math.sin(angle))
            shape = (np.abs(along) < length / 2) & (across < thickness / 2 + 0.5)
        elif kind == 1:  # a ring
            radius = rng.uniform(0.03, 0.08) * width
            shape = np.abs(np.hypot(x - centre_x, y - centre_y) - radius) < max(1.0, width / 64)
        else:  # a blob
            radius = rng.uniform(0.02, 0.07) * width
            shape = np.exp(-((x - centre_x) ** 2 + (y - centre_y) ** 2) / (2 * radius * radius))
        image += amplitude * shape * body


def render_image(
    findings: dict[str, float],
    width: int,
    style: SourceStyle,
    rng: np.random.Generator,
    lateral: bool = False,
    glyphs: Callable[[str], np.ndarray] | None = None,
) -> np.ndarray:
    """A uint8 (height, width) chest-like image; ``findings`` maps finding -> glyph strength (0..1).

    ``glyphs``: a name's drawing (default :func:`finding_glyph`; the pretraining's patterns pass theirs).
    """
    glyph_of = glyphs or finding_glyph
    height = round(width * style.aspect)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    y /= height
    x /= width
    jitter = rng.normal(0, 0.02, 4)
    image = np.full((height, width), 0.08, np.float32)
    body = ((x - 0.5) / 0.46) ** 2 + ((y - 0.55) / 0.52) ** 2 < 1
    image[body] = style.body
    if lateral:
        lungs = ((x - 0.5 - jitter[0]) / 0.3) ** 2 + ((y - 0.5) / 0.33) ** 2 < 1
    else:
        left = ((x - 0.31 - jitter[0]) / 0.15) ** 2 + ((y - 0.5 - jitter[1]) / 0.3) ** 2 < 1
        right = ((x - 0.69 - jitter[2]) / 0.15) ** 2 + ((y - 0.5 - jitter[3]) / 0.3) ** 2 < 1
        lungs = left | right
    image[lungs] = style.lung
    rib_frequency, rib_phase = rng.uniform(9, 13), rng.uniform(0, 2 * math.pi)
    image += RIB_AMPLITUDE * lungs * np.sin(2 * math.pi * rib_frequency * (y + 0.25 * np.abs(x - 0.5)) + rib_phase)
    heart = ((x - 0.56) / 0.13) ** 2 + ((y - 0.66) / 0.12) ** 2 < 1
    image[heart & body] = style.heart
    image *= rng.uniform(0.9, 1.1)
    shading = Image.fromarray(rng.normal(0, 1, (6, 6)).astype(np.float32)).resize((width, height), Image.BICUBIC)
    image += SOFT_TISSUE_AMPLITUDE * np.asarray(shading)
    _add_clutter(image, body, rng)

    cell = max(1, width // 16)
    for name, strength in findings.items():
        if strength <= 0:
            continue
        stamp = np.kron(glyph_of(name), np.ones((cell, cell), np.float32))
        size_y, size_x = stamp.shape
        top = rng.integers(int(0.2 * height), max(int(0.2 * height) + 1, int(0.82 * height) - size_y))
        left_edge = rng.integers(int(0.12 * width), max(int(0.12 * width) + 1, int(0.88 * width) - size_x))
        image[top : top + size_y, left_edge : left_edge + size_x] += strength * rng.uniform(*FINDING_AMPLITUDE) * stamp
    image += rng.normal(0, style.noise, image.shape).astype(np.float32)
    return np.clip(np.rint(image * 255), 0, 255).astype(np.uint8)


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
    return np.random.default_rng([seed, GENERATED[kind].code, index])


# --- labels -------------------------------------------------------------------------------------


def _pick_patients(
    positives: pd.DataFrame, n_patients: int, min_positive_fraction: float, rng: np.random.Generator
) -> list:
    """Patients (index of ``positives``, a patient x finding bool frame), rare findings enriched."""
    n_patients = min(n_patients, len(positives))
    target = math.ceil(min_positive_fraction * n_patients)
    chosen: list = []
    taken = pd.Series(False, index=positives.index)
    for name in positives.sum().sort_values().index:  # rarest first
        missing = target - int(positives.loc[taken, name].sum())
        candidates = positives.index[positives[name] & ~taken]
        if missing <= 0 or len(candidates) == 0:
            continue
        picked = rng.choice(candidates, size=min(missing, len(candidates), n_patients - len(chosen)), replace=False)
        chosen.extend(picked.tolist())
        taken[picked] = True
    rest = positives.index[~taken]
    chosen.extend(rng.choice(rest, size=n_patients - len(chosen), replace=False).tolist())
    return chosen


def _resolve_label_source(label_source: LabelSource, file_name: str) -> Path | None:
    if label_source not in ("auto", "reference", "builtin"):
        raise ValueError(f"unknown label source {label_source!r}; choose auto, reference or builtin")
    if label_source == "builtin":
        return None
    path = reference_file(file_name)
    if path is None and label_source == "reference":
        raise DataNotFoundError(
            f"{file_name} not found: install torchxrayvision's data files with "
            "'pip install --no-deps torchxrayvision==1.5.7', or use label_source='builtin'"
        )
    return path


def _builtin_draws(
    n_patients: int, max_items: int, rates: np.ndarray, min_positive_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Independent label draws for 1..max_items items (images/studies) per patient.

    ``rates`` is (classes, 3): positive, uncertain and blank shares (the rest are zeros).
    Returns (patient index per item, sorted; values per item: 1, -1, NaN or 0). A finding with
    fewer than ``min_positive_fraction`` positive patients is made positive on the first item
    of randomly chosen other patients, as the reference path enriches rare findings.
    """
    patients = np.repeat(np.arange(n_patients), rng.integers(1, max_items + 1, n_patients))
    draw = rng.random((len(patients), len(rates)))
    bounds = np.cumsum(rates, axis=1)
    values = np.select([draw < bounds[:, 0], draw < bounds[:, 1], draw < bounds[:, 2]], [1.0, -1.0, np.nan], 0.0)
    target = math.ceil(min_positive_fraction * n_patients)
    for column in range(len(rates)):
        positive = np.unique(patients[values[:, column] == 1])
        candidates = np.setdiff1d(np.arange(n_patients), positive)
        extra = rng.choice(candidates, size=min(max(target - len(positive), 0), len(candidates)), replace=False)
        values[np.searchsorted(patients, extra), column] = 1.0
    return patients, values


def nih_label_rows(
    n_patients: int,
    seed: int = 0,
    max_images_per_patient: int = 3,
    min_positive_fraction: float = 0.06,
    label_source: LabelSource = "auto",
) -> tuple[pd.DataFrame, str]:
    """NIH ``Data_Entry_2017.csv`` rows and a phrase saying where their labels came from."""
    rng = np.random.default_rng([seed, GENERATED[NIH].code])
    reference = _resolve_label_source(label_source, NIH_LABEL_FILE)
    if reference is not None:
        real = pd.read_csv(reference).sort_values(["Patient ID", "Follow-up #"])
        real = real.groupby("Patient ID").head(max_images_per_patient)  # enrich on the rows we keep
        tokens = real["Finding Labels"].str.split("|")
        positives = pd.DataFrame({raw: tokens.map(lambda t, raw=raw: raw in t) for raw in NIH_RAW_LABELS})
        per_patient = positives.groupby(real["Patient ID"]).any()
        chosen = _pick_patients(per_patient, n_patients, min_positive_fraction, rng)
        rows = real[real["Patient ID"].isin(chosen)].reset_index(drop=True)
        return rows[NIH_COLUMNS], f"real NIH label rows from {reference}"
    rates = np.array([(NIH_PREVALENCE[name], 0.0, 0.0) for name in NIH_LABELS])
    patients, values = _builtin_draws(n_patients, max_images_per_patient, rates, min_positive_fraction, rng)
    sexes = rng.choice(["M", "F"], size=n_patients)
    records = []
    for index, (patient, row) in enumerate(zip(patients + 1, values, strict=True)):
        follow_up = index - int(np.searchsorted(patients, patient - 1))
        found = [raw for raw, value in zip(NIH_RAW_LABELS, row, strict=True) if value == 1]
        records.append(
            [
                f"{patient:08d}_{follow_up:03d}.png",
                "|".join(found) or NO_FINDING,
                follow_up,
                patient,
                int(rng.integers(18, 90)),
                str(sexes[patient - 1]),
                str(rng.choice(["PA", "AP"])),
                2500,
                2048,
                0.143,
                0.143,
            ]
        )
    return pd.DataFrame(records, columns=NIH_COLUMNS), "built-in NIH label frequencies"


def chexpert_label_rows(
    n_patients: int,
    seed: int = 0,
    max_studies_per_patient: int = 2,
    min_positive_fraction: float = 0.06,
    label_source: LabelSource = "auto",
    kind: str = "chexpert",
) -> tuple[pd.DataFrame, str]:
    """CheXpert ``train.csv`` rows (frontal and lateral views) and where their labels came from."""
    rng = np.random.default_rng([seed, GENERATED[kind].code])
    reference = _resolve_label_source(label_source, CHEXPERT_LABEL_FILE)
    if reference is not None:
        real = pd.read_csv(reference, dtype={"Path": str})
        patient = real["Path"].str.extract(r"(patient\d+)", expand=False)
        study = real["Path"].str.extract(r"(patient\d+/study\d+)", expand=False)
        first_studies = study.drop_duplicates()
        kept_studies = set(first_studies.groupby(patient[first_studies.index]).head(max_studies_per_patient))
        real = real[study.isin(kept_studies)]  # enrich on the rows we keep
        patient = patient[real.index]
        per_patient = (real[list(CHEXPERT_LABELS)] == 1).groupby(patient).any()
        chosen = set(_pick_patients(per_patient, n_patients, min_positive_fraction, rng))
        rows = real[patient.isin(chosen)]
        return rows.reset_index(drop=True)[CHEXPERT_COLUMNS], f"real CheXpert label rows from {reference}"
    rates = np.array([CHEXPERT_RATES[name] for name in CHEXPERT_LABELS])
    patients, values = _builtin_draws(n_patients, max_studies_per_patient, rates, min_positive_fraction, rng)
    sexes = rng.choice(["Female", "Male"], size=n_patients)
    records = []
    for index, (patient, row) in enumerate(zip(patients + 1, values, strict=True)):
        study = 1 + index - int(np.searchsorted(patients, patient - 1))
        sex, age = str(sexes[patient - 1]), int(rng.integers(18, 90))
        no_finding = np.nan if (row == 1).any() else 1.0
        views = [("Frontal", str(rng.choice(["AP", "PA"])), "view1_frontal")]
        if rng.random() < 0.3:
            views.append(("Lateral", np.nan, "view2_lateral"))
        for view, ap_pa, name in views:
            path = f"CheXpert-v1.0-small/train/patient{patient:05d}/study{study}/{name}.jpg"
            records.append([path, sex, age, view, ap_pa, no_finding, *row.tolist()])
    return pd.DataFrame(records, columns=CHEXPERT_COLUMNS), "built-in CheXpert label frequencies"


# --- what an image shows: the main union, labelled or not ----------------------------------------------


class DonorRows:
    """The rows of one real label file over the findings it labels, as glyph strengths (1 positive, 0.5 uncertain,
    0 otherwise): an image that shows findings its own layout does not label copies them from one of these rows."""

    def __init__(self, labels: Sequence[str], strengths: np.ndarray) -> None:
        self.labels = tuple(labels)
        self.strengths = strengths.astype(np.float32)
        shared = [self.labels.index(name) for name in SHARED_FINDINGS]
        positive = self.strengths[:, shared] == 1
        self.codes = (positive * (1 << np.arange(len(shared)))).sum(axis=1)
        self._rarest_first = [SHARED_FINDINGS[i] for i in np.argsort(positive.mean(axis=0), kind="stable")]
        self._candidates: dict[tuple[int, int], np.ndarray] = {}

    def _rows_agreeing(self, known: Mapping[str, float]) -> np.ndarray:
        """Rows positive for exactly the shared findings ``known`` has positive, among those it labels; when no row
        is, the rarest positive shared finding is let go, one at a time."""
        matched = [name for name in SHARED_FINDINGS if name in known]
        positives = [name for name in matched if known[name] == 1]
        while True:
            mask = sum(1 << SHARED_FINDINGS.index(name) for name in matched)
            key = sum(1 << SHARED_FINDINGS.index(name) for name in positives)
            if (mask, key) not in self._candidates:
                self._candidates[mask, key] = np.flatnonzero((self.codes & mask) == key)
            rows = self._candidates[mask, key]
            if len(rows):
                return rows
            dropped = next(name for name in self._rarest_first if name in positives)
            matched.remove(dropped)
            positives.remove(dropped)

    def draw(self, known: Mapping[str, float], wanted: Sequence[str], rng: np.random.Generator) -> dict[str, float]:
        """Strengths of ``wanted`` (findings this file labels), all from one row that agrees with ``known``."""
        row = self.strengths[rng.choice(self._rows_agreeing(known))]
        return {name: float(row[self.labels.index(name)]) for name in wanted}


class IndependentDraws:
    """Without the real files: each finding drawn alone at its built-in frequency (positive, uncertain)."""

    def __init__(self, rates: Mapping[str, tuple[float, float]]) -> None:
        self.labels = tuple(rates)
        self.rates = dict(rates)

    def draw(self, known: Mapping[str, float], wanted: Sequence[str], rng: np.random.Generator) -> dict[str, float]:
        drawn = {}
        for name in wanted:
            positive, uncertain = self.rates[name]
            value = rng.random()
            drawn[name] = 1.0 if value < positive else 0.5 if value < positive + uncertain else 0.0
        return drawn


Donor = DonorRows | IndependentDraws


@functools.cache
def finding_donors(use_reference: bool) -> dict[str, Donor]:
    """Who lends each main-union finding: the file that labels it (NIH's, else CheXpert's frontal rows), or built-in
    frequencies (``use_reference`` False, or the files not installed)."""
    nih_file, chexpert_file = reference_file(NIH_LABEL_FILE), reference_file(CHEXPERT_LABEL_FILE)
    if use_reference and nih_file is not None and chexpert_file is not None:
        tokens = pd.read_csv(nih_file, usecols=["Finding Labels"])["Finding Labels"].str.split("|")
        nih = np.stack([tokens.map(lambda found, raw=raw: raw in found).to_numpy() for raw in NIH_RAW_LABELS], axis=1)
        chexpert = pd.read_csv(chexpert_file, usecols=["Frontal/Lateral", *CHEXPERT_LABELS])
        values = chexpert.loc[chexpert["Frontal/Lateral"] == "Frontal", list(CHEXPERT_LABELS)].to_numpy()
        nih_rows = DonorRows(NIH_LABELS, nih.astype(np.float32))
        chexpert_rows = DonorRows(CHEXPERT_LABELS, np.select([values == 1, values == -1], [1.0, 0.5], 0.0))
    else:
        nih_rows = IndependentDraws({name: (rate, 0.0) for name, rate in NIH_PREVALENCE.items()})
        chexpert_rows = IndependentDraws({name: rates[:2] for name, rates in CHEXPERT_RATES.items()})
    return {name: nih_rows if name in nih_rows.labels else chexpert_rows for name in MAIN_UNION}


def shown_findings(
    labelled: Mapping[str, float],
    layout_labels: Collection[str],
    donors: Mapping[str, Donor],
    rng: np.random.Generator,
    absent: Collection[str] = (),
) -> dict[str, float]:
    """What an image shows: its labelled findings' strengths and, for every main-union finding its layout does not
    label, a strength drawn by that finding's donor given the labelled ones (one row per donor); ``absent``
    findings are left out (the draws are the same, so everything else about the image stays)."""
    shown = dict(labelled)
    unlabelled = [name for name in MAIN_UNION if name not in layout_labels]
    for donor in dict.fromkeys(donors[name] for name in unlabelled):  # each donor once, in a fixed order
        shown.update(donor.draw(labelled, [name for name in unlabelled if donors[name] is donor], rng))
    return {name: strength for name, strength in shown.items() if strength > 0 and name not in absent}


def _donor_rng(seed: int, kind: str) -> np.random.Generator:
    return np.random.default_rng([seed, GENERATED[kind].code, 2])


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

    def describe(self) -> str:
        absent = f"; left out of the images: {', '.join(self.absent)}" if self.absent else ""
        return (
            f"embedded {self.kind} dataset at {self.root}: {self.n_images} generated images of "
            f"{self.n_patients} patients at {self.image_size}px (labels: {self.label_origin}{absent})"
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
) -> list[dict[str, float]]:
    """Render CheXpert-layout rows (each study's images show the same findings; ``reference``: the findings it does
    not label come from the real files); returns what each image shows."""
    style = GENERATED[kind].style
    labels = rows[list(CHEXPERT_LABELS)].to_numpy(dtype=np.float64)
    lateral = (rows["Frontal/Lateral"] == "Lateral").to_numpy()
    studies = rows["Path"].str.extract(r"(patient\d+/study\d+)", expand=False).tolist()
    donors, rng = finding_donors(reference), _donor_rng(seed, kind)
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
) -> GeneratedDataset:
    """Write ``root/Data_Entry_2017.csv``, ``root/images/*.png`` (NIH ChestX-ray14 layout) and ``shown_findings.csv``.

    Each image shows its row's findings and the CheXpert-only findings drawn for it (:func:`shown_findings`), less
    ``absent`` (also taken out of the label file)."""
    root = Path(root)
    absent = _checked_absent(absent)
    rows, origin = nih_label_rows(n_patients, seed, max_images_per_patient, min_positive_fraction, label_source)
    style = GENERATED[NIH].style
    raw_to_name = dict(zip(NIH_RAW_LABELS, NIH_LABELS, strict=True))
    donors = finding_donors(_resolve_label_source(label_source, NIH_LABEL_FILE) is not None)
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
    return GeneratedDataset(NIH, root, len(rows), patients, image_size, seed, origin, absent)


def generate_chexpert(
    root: str | Path,
    n_patients: int = 200,
    image_size: int = 64,
    seed: int = 0,
    label_source: LabelSource = "auto",
    min_positive_fraction: float = 0.06,
    valid_fraction: float = 0.1,
    absent: Sequence[str] = (),
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
    reference = _resolve_label_source(label_source, CHEXPERT_LABEL_FILE) is not None
    patient = rows["Path"].str.extract(r"(patient\d+)", expand=False)
    patients = patient.drop_duplicates().tolist()
    valid_rng = np.random.default_rng([seed, GENERATED[CHEXPERT].code, 1])
    valid_patients = valid_rng.choice(patients, size=round(valid_fraction * len(patients)), replace=False)
    is_valid = patient.isin(set(valid_patients.tolist()))
    train_rows = rows[~is_valid].reset_index(drop=True)
    valid_rows = rows[is_valid].reset_index(drop=True)
    valid_rows["Path"] = valid_rows["Path"].str.replace("/train/", "/valid/", regex=False)
    valid_rows[list(CHEXPERT_LABELS)] = valid_rows[list(CHEXPERT_LABELS)].replace(-1.0, 0.0).fillna(0.0)
    all_rows = pd.concat([train_rows, valid_rows], ignore_index=True)
    paths = [resolve_chexpert_path(dataset_root, listed) for listed in all_rows["Path"]]
    _write_chexpert_style_images(all_rows, paths, dataset_root, CHEXPERT, image_size, seed, absent, reference)
    _without_absent_chexpert(train_rows, absent).to_csv(dataset_root / "train.csv", index=False)
    _without_absent_chexpert(valid_rows, absent).to_csv(dataset_root / "valid.csv", index=False)
    return GeneratedDataset(CHEXPERT, dataset_root, len(all_rows), len(patients), image_size, seed, origin, absent)


def generate_mimic(
    root: str | Path,
    n_patients: int = 100,
    image_size: int = 64,
    seed: int = 0,
    label_source: LabelSource = "auto",
    min_positive_fraction: float = 0.06,
    absent: Sequence[str] = (),
) -> GeneratedDataset:
    """Write MIMIC-CXR-JPG's two label CSVs (gzipped), ``files/pXX/pSUBJECT/sSTUDY/<dicom>.jpg`` and
    ``shown_findings.csv``. The label file carries, after the CheXpert labeler's 14 columns, one column per NIH-only
    finding (1 where the study shows it), as CXR-LT's labels extend MIMIC's: all 20 findings of the main job."""
    root = Path(root)
    absent = _checked_absent(absent)
    rows, origin = chexpert_label_rows(n_patients, seed, 2, min_positive_fraction, label_source, kind="mimic")
    rng = np.random.default_rng([seed, GENERATED[MIMIC].code, 1])
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
    reference = _resolve_label_source(label_source, CHEXPERT_LABEL_FILE) is not None
    shown = _write_chexpert_style_images(rows, paths, root, MIMIC, image_size, seed, absent, reference)
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
    return GeneratedDataset(MIMIC, root, len(rows), len(subject_ids), image_size, seed, origin, absent)


def generate_public(
    kind: str,
    root: str | Path,
    n_patients: int = 200,
    image_size: int = 64,
    seed: int = 0,
    max_images_per_patient: int = 2,
    label_source: LabelSource = "reference",
    absent: Sequence[str] = (),
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
    rng = np.random.default_rng([seed, GENERATED[kind].code])
    raw, parsed = read_public_labels(kind, reference)
    classes = [column for column in parsed.columns if column not in (KEY_COLUMN, PATIENT_COLUMN, PATH_COLUMN)]
    absent = _checked_absent(absent, classes, kind)
    # each patient's images with the rarest findings first, so a finding seen once survives the cap
    rarity = ((parsed[classes] == 1) / parsed[classes].sum().clip(lower=1)).max(axis=1)
    parsed = parsed.loc[rarity.sort_values(ascending=False, kind="stable").index]
    parsed = parsed.groupby(PATIENT_COLUMN, sort=False).head(max_images_per_patient).sort_index()
    per_patient = (parsed[classes] == 1).groupby(parsed[PATIENT_COLUMN]).any()
    per_finding = max(1, n_patients // (2 * len(classes)))
    chosen = set(_pick_patients(per_patient, n_patients, per_finding / n_patients, rng))
    images = parsed[parsed[PATIENT_COLUMN].isin(chosen)].reset_index(drop=True)
    root = Path(root)
    image_root = root / "images" if kind == "google-nih" else root  # NIH's folder for Google's labels
    style = GENERATED[kind].style
    labels = images[classes].to_numpy()
    donors, donor_rng = finding_donors(True), _donor_rng(seed, kind)
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
    return GeneratedDataset(kind, root, len(images), len(chosen), image_size, seed, origin, absent)


def generate_patterns(root: str | Path, n_images: int = 2000, image_size: int = 64, seed: int = 0) -> Path:
    """The stand-in pretraining's data (``csv`` layout): ``root/patterns.csv`` (``path``, ``patient_id``, one 0/1
    column per pattern of :func:`pattern_glyphs`) and ``root/images/*.png``, each pattern present with probability
    :data:`PATTERN_PREVALENCE`, in the findings' clutter and no finding at all. Returns the CSV's path."""
    root = Path(root)
    patterns = pattern_glyphs()
    names = list(patterns)
    labels = np.random.default_rng([seed, PATTERN_CODE]).random((n_images, len(names))) < PATTERN_PREVALENCE
    rows = []
    for index in _logging_progress(range(n_images), "generating pattern images"):
        present = {name: 1.0 for name, on in zip(names, labels[index], strict=True) if on}
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

    code: int  # seeds its random streams: fixed, another code would change every dataset of the kind
    style: SourceStyle  # how its images look
    generate: Callable[..., GeneratedDataset]


GENERATED: dict[str, GeneratedKind] = {
    NIH: GeneratedKind(1, SourceStyle(0.58, 0.22, 0.62, 0.05, ".png", 1.0), generate_nih),
    CHEXPERT: GeneratedKind(2, SourceStyle(0.66, 0.30, 0.70, 0.07, ".jpg", 1.15), generate_chexpert),
    MIMIC: GeneratedKind(3, SourceStyle(0.52, 0.18, 0.58, 0.06, ".jpg", 1.2), generate_mimic),
    **{
        kind: GeneratedKind(code, style, functools.partial(generate_public, kind))
        for kind, code, style in (
            ("padchest", 4, SourceStyle(0.62, 0.26, 0.66, 0.04, ".png", 1.1)),
            ("vindr", 5, SourceStyle(0.55, 0.20, 0.64, 0.05, ".png", 1.05)),
            ("google-nih", 6, SourceStyle(0.58, 0.22, 0.62, 0.05, ".png", 1.0)),
            ("rsna", 7, SourceStyle(0.50, 0.16, 0.56, 0.07, ".png", 1.0)),
            ("siim", 8, SourceStyle(0.60, 0.24, 0.60, 0.06, ".png", 1.0)),
        )
    },
}
PATTERN_CODE = 9  # the patterns' random streams
PATTERN_STYLE = SourceStyle(0.60, 0.24, 0.64, 0.05, ".png", 1.05)  # a source of its own
PATTERN_PREVALENCE = 0.1


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
