"""A grid's dry run: the label subsets and per-site counts its settings imply, from the NIH label file.

Nothing is trained; on the real NIH label file (torchxrayvision's, labels only) this shows what a
site of the papers' simulated federations would hold before anyone runs a GPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pandas as pd

from ..core.errors import SiteConfigError
from ..data.reference import NIH_LABEL_FILE, reference_file
from ..data.table import LabelTable
from ..images.layouts import load_table
from ..images.nih import read_nih_labels
from ..training.config import site_config_from_dict
from ..training.site_data import resolve_table, split_table
from .grids import DataSources, Setting

COUNTS_FILE = "site_label_counts.csv"


def nih_label_table(sources: DataSources) -> tuple[LabelTable, str]:
    """The NIH label table the simulated federations are cut from, and where it came from:
    the given NIH folder, else the real label file shipped with torchxrayvision (labels only), else
    the embedded generated dataset."""
    if sources.nih:
        return load_table("nih", sources.nih), f"NIH data at {sources.nih}"
    reference = reference_file(NIH_LABEL_FILE)
    if reference is not None:
        return read_nih_labels(reference), f"the real NIH label file {reference} (labels only)"
    config = site_config_from_dict({"data": {"kind": "nih"}, "embedded": sources.embedded()})
    return resolve_table(config), "the embedded generated NIH dataset"


def site_label_counts(setting: Setting, table: LabelTable) -> pd.DataFrame:
    """Per site, split and class: images, patients and positives, as the site configs cut ``table``."""
    rows = []
    for site, values in setting.sites.items():
        config = site_config_from_dict(values, f"{setting.name} {site}")
        labels = config.data.labels or table.classes
        site_table = replace(table, classes=list(labels), split_classes=list(table.split_classes or table.classes))
        for split, part in split_table(site_table, config).items():
            if split == "test" and config.data.partition_count > 1:
                continue  # the common held-out set, not the site's
            for name in labels:
                rows.append(
                    {
                        "setting": setting.name,
                        "site": site,
                        "split": split,
                        "class_name": name,
                        "images": len(part),
                        "patients": part.n_patients,
                        "positives": int((part.frame[name] == 1).sum()),
                    }
                )
    return pd.DataFrame(rows)


def plan_grid(settings: Sequence[Setting], sources: DataSources, out: Path) -> list[str]:
    """Write each site's label counts to ``out/site_label_counts.csv``; returns the lines to print."""
    simulated = [setting for setting in settings if setting.factor != "labels"]
    if not simulated:
        raise SiteConfigError("this grid has no simulated NIH setting to plan")
    table, origin = nih_label_table(sources)
    counts = pd.concat([site_label_counts(setting, table) for setting in simulated], ignore_index=True)
    out.mkdir(parents=True, exist_ok=True)
    counts.to_csv(out / COUNTS_FILE, index=False)
    lines = []
    for setting in simulated:
        lines.append(f"{setting.name}: shared {setting.shared_classes}")
        for site, labels in setting.label_sets.items():
            train = counts[(counts.setting == setting.name) & (counts.site == site) & (counts.split == "train")]
            lines.append(f"  {site}: {len(labels)} labels, {train['images'].iloc[0]} training images: {labels}")
    lines.append(f"label counts from {origin} -> {out / COUNTS_FILE}")
    return lines
