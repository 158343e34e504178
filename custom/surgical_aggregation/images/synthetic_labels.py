"""The embedded datasets' label rows (real rows of torchxrayvision's label files, or draws at built-in
frequencies) and what each image shows besides what its layout labels."""

from __future__ import annotations

import ast
import functools
import math
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from ..core.errors import DataNotFoundError
from ..core.labels import CHEXPERT_LABELS, NIH_LABELS, NIH_RAW_LABELS, NO_FINDING, union_labels
from ..data.reference import CHEXPERT_LABEL_FILE, NIH_LABEL_FILE, reference_file
from .names import CHEXPERT, CO_OCCURRENCES, MIMIC, NIH, PADCHEST_ROWS, SHARED_ROWS

LabelSource = Literal["auto", "reference", "builtin"]
# seeds each kind's random streams (its label draws, what its images show, their pixels): fixed, another code would
# change every dataset of the kind
STREAM_CODES: dict[str, int] = {
    NIH: 1, CHEXPERT: 2, MIMIC: 3, "padchest": 4, "vindr": 5, "google-nih": 6, "rsna": 7, "siim": 8, "patterns": 9,
}  # fmt: skip


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


# --- labels -------------------------------------------------------------------------------------


def pick_patients(
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


def resolve_label_source(label_source: LabelSource, file_name: str) -> Path | None:
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
    rng = np.random.default_rng([seed, STREAM_CODES[NIH]])
    reference = resolve_label_source(label_source, NIH_LABEL_FILE)
    if reference is not None:
        real = pd.read_csv(reference).sort_values(["Patient ID", "Follow-up #"])
        real = real.groupby("Patient ID").head(max_images_per_patient)  # enrich on the rows we keep
        tokens = real["Finding Labels"].str.split("|")
        positives = pd.DataFrame({raw: tokens.map(lambda t, raw=raw: raw in t) for raw in NIH_RAW_LABELS})
        per_patient = positives.groupby(real["Patient ID"]).any()
        chosen = pick_patients(per_patient, n_patients, min_positive_fraction, rng)
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
    rng = np.random.default_rng([seed, STREAM_CODES[kind]])
    reference = resolve_label_source(label_source, CHEXPERT_LABEL_FILE)
    if reference is not None:
        real = pd.read_csv(reference, dtype={"Path": str})
        patient = real["Path"].str.extract(r"(patient\d+)", expand=False)
        study = real["Path"].str.extract(r"(patient\d+/study\d+)", expand=False)
        first_studies = study.drop_duplicates()
        kept_studies = set(first_studies.groupby(patient[first_studies.index]).head(max_studies_per_patient))
        real = real[study.isin(kept_studies)]  # enrich on the rows we keep
        patient = patient[real.index]
        per_patient = (real[list(CHEXPERT_LABELS)] == 1).groupby(patient).any()
        chosen = set(pick_patients(per_patient, n_patients, min_positive_fraction, rng))
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
    """Rows of a real label file over the findings it labels, as glyph strengths (1 positive, 0.5 uncertain, 0
    otherwise): an image that shows findings its own layout does not label copies them from one of these rows, a row
    that agrees with the image on the ``conditioning`` findings (default: the 7 NIH and CheXpert share)."""

    def __init__(
        self, labels: Sequence[str], strengths: np.ndarray, conditioning: Sequence[str] = SHARED_FINDINGS
    ) -> None:
        self.labels = tuple(labels)
        self.strengths = strengths.astype(np.float32)
        self.conditioning = tuple(conditioning)
        positive = self.strengths[:, [self.labels.index(name) for name in self.conditioning]] == 1
        self.codes = (positive.astype(np.int64) << np.arange(len(self.conditioning), dtype=np.int64)).sum(axis=1)
        order = np.argsort(positive.mean(axis=0), kind="stable")
        self._rarest_first = [self.conditioning[i] for i in order]
        self._candidates: dict[tuple[int, int], np.ndarray] = {}

    def _rows_agreeing(self, known: Mapping[str, float]) -> np.ndarray:
        """Rows positive for exactly the conditioning findings ``known`` has positive, among those it labels; when no
        row is, the rarest positive conditioning finding is let go, one at a time."""
        matched = [name for name in self.conditioning if name in known]
        positives = [name for name in matched if known[name] == 1]
        while True:
            mask = sum(1 << self.conditioning.index(name) for name in matched)
            key = sum(1 << self.conditioning.index(name) for name in positives)
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


# Each main-union finding as PadChest's label names say it (a name holding one of the phrases). NIH's 14 as
# torchxrayvision's PadChest dataset reads them (the finding's own name and its synonyms; "effusion" for Pleural
# Effusion), CheXpert's six others by the CheXpert labeler's mention phrases (phrases/mention/*.txt) that PadChest's
# names hold. Enlarged Cardiomediastinum has none (the labeler's phrases name the mediastinum's contour and
# silhouette; PadChest's "mediastinal enlargement" is not one of them): it stays drawn from CheXpert's rows.
PADCHEST_PHRASES: dict[str, tuple[str, ...]] = {
    "Atelectasis": ("atelectasis",),
    "Cardiomegaly": ("cardiomegaly",),
    "Consolidation": ("consolidation", "air bronchogram"),
    "Edema": ("edema",),
    "Pleural Effusion": ("effusion",),
    "Emphysema": ("emphysema",),
    "Fibrosis": ("fibrosis",),
    "Hernia": ("hernia",),
    "Infiltration": (
        "infiltration", "infiltrates", "interstitial pattern", "ground glass pattern", "reticular interstitial pattern",
        "reticulonodular interstitial pattern", "alveolar pattern", "consolidation", "air bronchogram",
    ),
    "Mass": ("mass",),
    "Nodule": ("nodule",),
    "Pleural Thickening": ("pleural thickening",),
    "Pneumonia": ("pneumonia",),
    "Pneumothorax": ("pneumothorax",),
    "Fracture": ("fracture",),
    "Lung Lesion": (
        "mass", "nodular density", "nodular densities", "nodular opacity", "nodular opacities", "nodule", "lump",
        "cavitary lesion", "carcinoma", "neoplasm", "tumor",
    ),
    "Lung Opacity": (
        "opaci", "decreased translucency", "increased density", "airspace disease", "infiltrate",
        "interstitial marking", "interstitial pattern", "interstitial lung", "reticular pattern", "reticular marking",
        "reticulation", "parenchymal scarring", "peribronchial thickening",
    ),
    "Pleural Other": (
        "pleural thickening", "fibrosis", "fibrothorax", "pleural scar", "pleural parenchymal scar",
        "pleuro-parenchymal scar", "pleuro-pericardial scar",
    ),
    "Support Devices": (
        "pacer", "picc", "tube", "valve", "catheter", "pacemaker", "hardware", "arthroplast", "marker", "icd", "defib",
        "device", "drain", "plate", "screw", "cannula", "apparatus", "coil", "support", "equipment", "mediport",
    ),
}  # fmt: skip


@functools.cache
def padchest_rows() -> DonorRows | None:
    """PadChest's images (its loader's default rules: frontal, labelled, not excluded) over the main-union findings of
    :data:`PADCHEST_PHRASES`, each row conditioning on all of them; None without torchxrayvision's copy of the file."""
    from .public import KEY_COLUMN, PUBLIC_DATASETS, read_public_labels  # the loader's own rules, read lazily

    path = reference_file(PUBLIC_DATASETS["padchest"].reference)
    if path is None:
        return None
    raw, parsed = read_public_labels("padchest", path)
    kept = raw.drop_duplicates("ImageID").set_index("ImageID").loc[parsed[KEY_COLUMN], "Labels"]
    names = [[str(n).strip().lower() for n in ast.literal_eval(text) if isinstance(n, str)] for text in kept]
    labels = tuple(PADCHEST_PHRASES)
    strengths = np.array(
        [[any(p in name for p in PADCHEST_PHRASES[f] for name in found) for f in labels] for found in names], np.float32
    )
    return DonorRows(labels, strengths, conditioning=labels)


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
def finding_donors(use_reference: bool, co_occurrence: str = SHARED_ROWS) -> dict[str, Donor]:
    """Who lends each main-union finding: the file that labels it (NIH's, else CheXpert's frontal rows), or built-in
    frequencies (``use_reference`` False, or the files not installed); with ``co_occurrence`` ``padchest``, PadChest's
    rows lend every finding they label (:data:`PADCHEST_PHRASES`) and those files the rest."""
    if co_occurrence not in CO_OCCURRENCES:
        raise ValueError(f"unknown co_occurrence {co_occurrence!r}; choose one of {list(CO_OCCURRENCES)}")
    nih_file, chexpert_file = reference_file(NIH_LABEL_FILE), reference_file(CHEXPERT_LABEL_FILE)
    if use_reference and nih_file is not None and chexpert_file is not None:
        tokens = pd.read_csv(nih_file, usecols=["Finding Labels"])["Finding Labels"].str.split("|")
        nih = np.stack([tokens.map(lambda found, raw=raw: raw in found).to_numpy() for raw in NIH_RAW_LABELS], axis=1)
        chexpert = pd.read_csv(chexpert_file, usecols=["Frontal/Lateral", *CHEXPERT_LABELS])
        values = chexpert.loc[chexpert["Frontal/Lateral"] == "Frontal", list(CHEXPERT_LABELS)].to_numpy()
        nih_rows = DonorRows(NIH_LABELS, nih.astype(np.float32))
        chexpert_rows = DonorRows(CHEXPERT_LABELS, np.select([values == 1, values == -1], [1.0, 0.5], 0.0))
    elif co_occurrence == PADCHEST_ROWS and not use_reference:
        raise ValueError("co_occurrence 'padchest' draws from real label rows, not with label_source 'builtin'")
    elif co_occurrence == PADCHEST_ROWS:
        raise DataNotFoundError(
            "co_occurrence 'padchest' draws from the real NIH, CheXpert and PadChest label files: install "
            "torchxrayvision's data files with 'pip install --no-deps torchxrayvision==1.5.7'"
        )
    else:
        nih_rows = IndependentDraws({name: (rate, 0.0) for name, rate in NIH_PREVALENCE.items()})
        chexpert_rows = IndependentDraws({name: rates[:2] for name, rates in CHEXPERT_RATES.items()})
    donors: dict[str, Donor] = {name: nih_rows if name in nih_rows.labels else chexpert_rows for name in MAIN_UNION}
    if co_occurrence == PADCHEST_ROWS:
        joint = padchest_rows()
        if joint is None:
            raise DataNotFoundError(
                "co_occurrence 'padchest' needs PadChest's label file from torchxrayvision's data files "
                "('pip install --no-deps torchxrayvision==1.5.7')"
            )
        donors.update(dict.fromkeys(joint.labels, joint))
    return donors


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
