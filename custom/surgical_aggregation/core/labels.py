"""Finding names: one canonical vocabulary, the spellings each dataset uses, and their label lists.

Every place that pairs a label with a number (a CSV column, a head row, an AUROC) goes
through :func:`canonical_name`, so "Effusion" (NIH) and "Pleural Effusion" (CheXpert) are one
class and a typo fails loudly instead of silently creating a 21st class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from .errors import DuplicateLabelError, UnknownLabelError

# CXR-LT 2023 spelling (26 names): the 20-label NIH + CheXpert union, "No Finding" and five
# findings that only CXR-LT annotates.
CANONICAL_FINDINGS: tuple[str, ...] = (
    "Atelectasis",
    "Calcification of the Aorta",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Emphysema",
    "Enlarged Cardiomediastinum",
    "Fibrosis",
    "Fracture",
    "Hernia",
    "Infiltration",
    "Lung Lesion",
    "Lung Opacity",
    "Mass",
    "No Finding",
    "Nodule",
    "Pleural Effusion",
    "Pleural Other",
    "Pleural Thickening",
    "Pneumomediastinum",
    "Pneumonia",
    "Pneumoperitoneum",
    "Pneumothorax",
    "Subcutaneous Emphysema",
    "Support Devices",
    "Tortuous Aorta",
)

NO_FINDING = "No Finding"

# Other spellings seen in NIH ChestX-ray14, CheXpert, MIMIC-CXR, Open-i and CXR-LT files.
# Keys are compared after normalisation (case, "_" and repeated spaces ignored).
ALIASES: dict[str, str] = {
    "Effusion": "Pleural Effusion",
    "Pleural Effusions": "Pleural Effusion",
    "Pleural_Thickening": "Pleural Thickening",
    "Pleural Thickenings": "Pleural Thickening",
    "Opacity": "Lung Opacity",
    "Airspace Opacity": "Lung Opacity",
    "Lesion": "Lung Lesion",
    "Enlarged Cardiom.": "Enlarged Cardiomediastinum",
    "Aortic Calcification": "Calcification of the Aorta",
    "Calcification of Aorta": "Calcification of the Aorta",
    "Support Device": "Support Devices",
    "No_Finding": "No Finding",
    "Normal": "No Finding",
}

# NIH ChestX-ray14's own spellings ("Finding Labels" tokens), in file order ("No Finding" dropped).
NIH_RAW_LABELS: tuple[str, ...] = (
    "Atelectasis",
    "Cardiomegaly",
    "Consolidation",
    "Edema",
    "Effusion",
    "Emphysema",
    "Fibrosis",
    "Hernia",
    "Infiltration",
    "Mass",
    "Nodule",
    "Pleural_Thickening",
    "Pneumonia",
    "Pneumothorax",
)


def _normal_form(name: str) -> str:
    return re.sub(r"[\s_]+", " ", name).strip().casefold()


_LOOKUP: dict[str, str] = {_normal_form(name): name for name in CANONICAL_FINDINGS}
_LOOKUP.update({_normal_form(alias): target for alias, target in ALIASES.items()})


# Each dataset's findings in the order of its own label file ("No Finding" dropped, as in
# the papers), in canonical spelling.
NIH_LABELS: tuple[str, ...] = tuple(_LOOKUP[_normal_form(raw)] for raw in NIH_RAW_LABELS)
CHEXPERT_LABELS: tuple[str, ...] = (
    "Enlarged Cardiomediastinum",
    "Cardiomegaly",
    "Lung Opacity",
    "Lung Lesion",
    "Edema",
    "Consolidation",
    "Pneumonia",
    "Atelectasis",
    "Pneumothorax",
    "Pleural Effusion",
    "Pleural Other",
    "Fracture",
    "Support Devices",
)
# MIMIC-CXR-JPG labels come from the CheXpert labeler: same 13 findings, same columns.
MIMIC_LABELS: tuple[str, ...] = CHEXPERT_LABELS
CXR_LT_LABELS: tuple[str, ...] = tuple(name for name in CANONICAL_FINDINGS if name != NO_FINDING)

DATASET_LABELS: dict[str, tuple[str, ...]] = {
    "nih": NIH_LABELS,
    "chexpert": CHEXPERT_LABELS,
    "mimic": MIMIC_LABELS,
    "cxr-lt": CXR_LT_LABELS,
}


def canonical_name(name: str, where: str = "") -> str:
    """The canonical spelling of ``name``; raises :class:`UnknownLabelError` naming ``where``.

    ``where`` says where the name came from (a file, a site, a config field) so the error can
    point the user at it.
    """
    if not isinstance(name, str):
        raise UnknownLabelError(f"{where + ': ' if where else ''}label {name!r} is not a string")
    found = _LOOKUP.get(_normal_form(name))
    if found is None:
        origin = f"{where}: " if where else ""
        raise UnknownLabelError(
            f"{origin}unknown label {name!r}. Known findings: {', '.join(CANONICAL_FINDINGS)}. "
            f"Accepted other spellings: {', '.join(sorted(ALIASES))}."
        )
    return found


def canonical_names(names: Iterable[str], where: str = "") -> list[str]:
    """Canonicalise a label list, keeping its order; a duplicate (after aliasing) is an error."""
    result: list[str] = []
    for name in names:
        canonical = canonical_name(name, where)
        if canonical in result:
            origin = f"{where}: " if where else ""
            raise DuplicateLabelError(f"{origin}label {name!r} duplicates {canonical!r} already in the list")
        result.append(canonical)
    return result


def dataset_labels(dataset: str) -> tuple[str, ...]:
    """The canonical label list of a known dataset kind ("nih", "chexpert", "mimic", "cxr-lt")."""
    try:
        return DATASET_LABELS[dataset.lower()]
    except KeyError:
        raise ValueError(f"unknown dataset kind {dataset!r}; known: {', '.join(DATASET_LABELS)}") from None


def union_labels(*label_lists: Sequence[str]) -> list[str]:
    """Union of label lists in order of first appearance (the order surgical aggregation uses)."""
    union: list[str] = []
    for labels in label_lists:
        for name in labels:
            canonical = canonical_name(name)
            if canonical not in union:
                union.append(canonical)
    return union
