"""The end of a federated run in a few lines: which global model is best, how it validates, where the files are.

Read from the round history the controller writes (one entry per global model, ``round`` -1 before
training, ``validation`` with each site's metrics and ``best`` on the best model). Printed last by
``surgical-aggregation simulate`` and ``poc``, and logged by the controller as its last lines.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

INITIAL_ROUND = -1  # the history's entry for the model before training
# what the server writes next to its models (the export reads them there)
HISTORY_FILE = "round_history.json"
UNION_FILE = "union_classes.csv"  # each class of the union, which sites label it (on the server only)


def model_label(round_number: int) -> str:
    return "before training" if round_number == INITIAL_ROUND else f"after round {round_number}"


def _validated(history: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [
        entry for entry in history if not math.isnan(float(entry.get("validation", {}).get("mean_val_loss", math.nan)))
    ]


def _describe(entry: Mapping[str, Any]) -> str:
    validation = entry["validation"]
    sites = ", ".join(
        f"{site} {metrics['val_mean_auroc']:.3f}"
        for site, metrics in sorted(validation.get("sites", {}).items())
        if "val_mean_auroc" in metrics
    )
    statistic, loss = "mean", validation["mean_val_loss"]
    judged_by = validation.get("judged_by", {})
    if judged_by.get("statistic") in ("mean", "median") and judged_by.get("sites") != sorted(validation["sites"]):
        statistic = f"{judged_by['statistic']} of {', '.join(judged_by['sites'])}'s"
        loss = validation["judged_val_loss"]
    elif judged_by.get("statistic") == "median":
        statistic, loss = "median", validation["judged_val_loss"]
    return (
        f"{model_label(entry['round'])}: {statistic} validation loss {loss:.4f}, "
        f"mean AUROC {validation['mean_val_auroc']:.3f} ({sites})"
    )


def summary_lines(history: Sequence[Mapping[str, Any]], files: Mapping[str, Path | str]) -> list[str]:
    """The best, final and initial global models' validation, then the files: each ``Path`` that exists, and
    each ``str`` (a pattern, e.g. ``<workspace>/<site>/log.txt``) as it is."""
    validated = _validated(history)
    best = [entry for entry in validated if entry["validation"].get("best")]
    lines = ["results of the federation"]
    lines.append(f"  best global model   {_describe(best[-1])}" if best else "  best global model   none")
    trained = [entry for entry in validated if entry["round"] != INITIAL_ROUND]
    if trained:
        lines.append(f"  final global model  {_describe(trained[-1])}")
    initial = [entry for entry in validated if entry["round"] == INITIAL_ROUND]
    if initial:
        lines.append(f"  initial model       {_describe(initial[0])}")
    lines += screening_lines(history)
    started = next((entry["initial_model"] for entry in history if "initial_model" in entry), None)
    if started:
        lines.append(f"  started from        {started['origin']}; backbone strategy {started['backbone_strategy']}")
    width = max((len(label) for label in files), default=0)
    shown = {label: path for label, path in files.items() if isinstance(path, str) or path.exists()}
    lines += [f"  {label.ljust(width)}  {path}" for label, path in shown.items()]
    return lines


def screening_lines(history: Sequence[Mapping[str, Any]]) -> list[str]:
    """Who the screening left out of which rounds, and the flags it kept on record (``core.judging.decide``)."""
    excluded: dict[str, list[int]] = {}
    flagged: dict[str, list[int]] = {}
    for entry in history:
        screening = entry.get("screening") or {}
        for site in screening.get("excluded", []):
            excluded.setdefault(site, []).append(entry["round"])
        if screening.get("action") != "stop":
            for site in screening.get("flags", {}):
                flagged.setdefault(site, []).append(entry["round"])
    lines = []
    for label, sites in (("excluded", excluded), ("harm on record", flagged)):
        for site, rounds in sorted(sites.items()):
            lines.append(f"  {label.ljust(18)}  {site} (round{'s' if len(rounds) > 1 else ''} "
                         f"{', '.join(map(str, rounds))})")  # fmt: skip
    return lines


def union_table(site_classes: Mapping[str, Sequence[str]]) -> list[dict[str, Any]]:
    """One row per class of the union: which sites label it, and whether it is shared (by 2+ sites) or unique.

    Sorted by how many sites label the class (most first), then by name. The server alone knows this (from
    the handshake); it stays on the server, like the sites' class sets.
    """
    holders: dict[str, list[str]] = {}
    for site in sorted(site_classes):
        for name in site_classes[site]:
            holders.setdefault(name, []).append(site)
    rows = [
        {"class": name, "sites": sites, "labelled_by": len(sites), "shared": len(sites) > 1}
        for name, sites in holders.items()
    ]
    return sorted(rows, key=lambda row: (-row["labelled_by"], row["class"]))


def union_table_lines(rows: Sequence[Mapping[str, Any]], limit: int | None = None) -> list[str]:
    """The union table in Markdown; only its first ``limit`` rows (and how many are left out) when given."""
    shared = sum(row["shared"] for row in rows)
    lines = [
        f"union of {len(rows)} classes: {shared} shared by 2+ sites, {len(rows) - shared} labelled by one site",
        "| class | sites | labelled by | shared |",
        "| --- | --- | --- | --- |",
    ]
    shown = rows if limit is None else rows[:limit]
    lines += [
        f"| {row['class']} | {', '.join(row['sites'])} | {row['labelled_by']} | {'yes' if row['shared'] else 'no'} |"
        for row in shown
    ]
    if len(shown) < len(rows):
        lines.append(f"... {len(rows) - len(shown)} more")
    return lines


def write_union_table(rows: Sequence[Mapping[str, Any]], path: Path) -> Path:
    """The union table as CSV (class, sites joined by ';', labelled_by, shared)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["class", "sites", "labelled_by", "shared"])
        for row in rows:
            writer.writerow(
                [row["class"], ";".join(row["sites"]), row["labelled_by"], "yes" if row["shared"] else "no"]
            )
    return path
