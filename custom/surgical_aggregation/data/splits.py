"""Patient-level, stratified, seeded train/validation/test splits.

Every image of a patient goes to the same split. Patients are stratified by their rarest
positive finding (patients without findings form their own stratum), shuffled within each
stratum with the seed, and dealt out so that every split's share of every stratum matches
the requested fractions as closely as whole patients allow.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from .table import PATIENT_COLUMN, LabelTable

DEFAULT_FRACTIONS = (0.7, 0.1, 0.2)
DEFAULT_SPLIT_NAMES = ("train", "val", "test")


def patient_strata(table: LabelTable) -> pd.Series:
    """Per patient: index of its rarest positive class (by patient prevalence), or -1 for none.

    Uses the table's ``split_classes`` when set, so a site restricted to some labels splits its
    patients exactly as the full dataset does (no patient changes split with the label subset).
    """
    classes = table.split_classes or table.classes
    positives = (table.frame[classes].fillna(0.0) == 1).groupby(table.frame[PATIENT_COLUMN], sort=True).any()
    prevalence = positives.sum(axis=0).to_numpy()
    # Rank classes from rarest to most common; a patient's stratum is its rarest finding.
    rarity_order = np.argsort(prevalence, kind="stable")
    ranked = positives.to_numpy()[:, rarity_order]
    has_any = ranked.any(axis=1)
    first = np.where(has_any, ranked.argmax(axis=1), -1)
    stratum = np.where(has_any, rarity_order[np.maximum(first, 0)], -1)
    return pd.Series(stratum, index=positives.index, name="stratum")


def assign_patients(strata: pd.Series, fractions: Sequence[float] = DEFAULT_FRACTIONS, seed: int = 0) -> dict[str, int]:
    """Patient -> split index. Deterministic for a given seed and patient set."""
    fractions = np.asarray(fractions, dtype=np.float64)
    if fractions.ndim != 1 or (fractions < 0).any() or not np.isclose(fractions.sum(), 1.0):
        raise ValueError(f"split fractions must be non-negative and sum to 1, got {fractions.tolist()}")
    rng = np.random.default_rng(seed)
    order = pd.DataFrame({"stratum": strata.to_numpy(), "shuffle": rng.permutation(len(strata))}, index=strata.index)
    order = order.sort_values(["stratum", "shuffle"], kind="stable")
    # Deal patients in stratum order, each to the split furthest below its target share.
    assigned = np.zeros(len(fractions))
    splits = np.empty(len(order), dtype=np.int64)
    for position in range(len(order)):
        split = int(np.argmax(fractions * (position + 1) - assigned))
        splits[position] = split
        assigned[split] += 1
    return dict(zip(order.index, splits.tolist(), strict=True))


def patient_split(
    table: LabelTable,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    seed: int = 0,
    names: Sequence[str] = DEFAULT_SPLIT_NAMES,
) -> dict[str, LabelTable]:
    """Split ``table`` by patient into ``names`` (default train/val/test at 70/10/20)."""
    if len(names) != len(fractions):
        raise ValueError(f"{len(names)} split names for {len(fractions)} fractions")
    split_of = assign_patients(patient_strata(table), fractions, seed)
    split_index = table.frame[PATIENT_COLUMN].map(split_of).to_numpy()
    return {name: table.subset(split_index == index) for index, name in enumerate(names)}
