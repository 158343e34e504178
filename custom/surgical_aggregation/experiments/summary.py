"""The papers' statistics and figures from the finished runs of a grid: tables (markdown, CSV) and plots.

``summary.md`` / ``summary.csv`` are the papers' table: mean AUROC (bootstrap 95% CI) per setting, test set,
method and seed, with a paired two-tailed t-test across classes against surgical aggregation (Shapiro-Wilk
of the differences beside it, Wilcoxon in the CSV); ``shared_vs_unique.csv`` splits each mean into the
classes every site holds and the others; ``plots/`` has mean AUROC vs the grid's factor and per-class bars.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from ..core.errors import DataNotFoundError
from ..core.methods import COMPARATOR_LABELS
from ..metrics import paired_t_test
from ..plots import plot_metric_vs_factor, plot_per_class_by_method

logger = logging.getLogger(__name__)
REFERENCE_METHOD = "surgical"
RESULT_FILE = "result.json"
PER_CLASS_FILE = "per_class_auroc.csv"


def collect(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """All finished runs: (results, one row per test set; per-class AUROC with a ``shared`` column)."""
    planned = json.loads((out / "plan.json").read_text())
    shared = {s["name"]: set(s["shared_classes"]) for s in planned["settings"]}
    results, per_class = [], []
    for path in sorted((out / "runs").glob(f"*/*/seed*/{RESULT_FILE}")):
        result = json.loads(path.read_text())
        for test_set, values in result["test_sets"].items():
            results.append(
                {key: result[key] for key in ("setting", "factor", "value", "method", "seed")}
                | {"test_set": test_set, **values}
            )
        frame = pd.read_csv(path.parent / PER_CLASS_FILE)
        frame = frame.assign(
            setting=result["setting"],
            factor=result["factor"],
            value=result["value"],
            method=result["method"],
            seed=result["seed"],
        )
        frame["shared"] = frame["class_name"].isin(shared.get(result["setting"], set()))
        per_class.append(frame)
    if not results:
        raise DataNotFoundError(f"no finished run under {out / 'runs'}")
    order = {method: rank for rank, method in enumerate(planned["methods"])}  # the table follows --methods
    results_frame = pd.DataFrame(results)
    results_frame = results_frame.sort_values(
        ["value", "seed", "method"],
        key=lambda column: column.map(order) if column.name == "method" else column,
        kind="stable",
    )
    return results_frame.reset_index(drop=True), pd.concat(per_class, ignore_index=True)


def _reference(methods: Sequence[str]) -> str | None:
    if REFERENCE_METHOD in methods:
        return REFERENCE_METHOD
    return next((m for m in methods if m.startswith(REFERENCE_METHOD)), None)


def summary_table(results: pd.DataFrame, per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC (95% CI) per setting / test set / method / seed, with paired t-tests across classes
    against surgical aggregation (Shapiro-Wilk on the differences; Wilcoxon alongside)."""
    reference = _reference(list(results["method"].unique()))
    rows = []
    keys = ["setting", "test_set", "seed"]
    for (setting, test_set, seed), group in results.groupby(keys, sort=False):
        classes = per_class[
            (per_class.setting == setting) & (per_class.test_set == test_set) & (per_class.seed == seed)
        ]
        by_method = {m: frame.set_index("class_name")["auroc"] for m, frame in classes.groupby("method")}
        for row in group.itertuples(index=False):
            entry = row._asdict()
            entry["label"] = COMPARATOR_LABELS.get(row.method, row.method)
            entry.update(p_value=math.nan, shapiro_p=math.nan, wilcoxon_p=math.nan, mean_difference=math.nan)
            if reference and row.method != reference and reference in by_method:
                ours, theirs = by_method[reference].align(by_method[row.method], join="inner")
                try:
                    test = paired_t_test(ours.to_numpy(), theirs.to_numpy())
                    entry.update(
                        p_value=test.p_value,
                        shapiro_p=test.shapiro_p,
                        wilcoxon_p=test.wilcoxon_p,
                        mean_difference=test.mean_difference,
                    )
                except ValueError as error:  # fewer than two defined pairs
                    logger.warning("%s %s %s: no paired test (%s)", setting, test_set, row.method, error)
            rows.append(entry)
    return pd.DataFrame(rows)


def shared_vs_unique(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC over the classes every site holds, and over the others (held by some sites only)."""
    grouped = per_class.groupby(["setting", "test_set", "method", "seed", "shared"])["auroc"].mean().unstack()
    grouped = grouped.rename(columns={True: "shared_classes", False: "other_classes"}).reset_index()
    for column in ("shared_classes", "other_classes"):
        if column not in grouped:
            grouped[column] = math.nan
    return grouped[["setting", "test_set", "method", "seed", "shared_classes", "other_classes"]]


def _number(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.3f}"


def _markdown(table: pd.DataFrame, reference: str | None) -> str:
    lines = []
    thresholded = "mean_accuracy" in table and table["mean_accuracy"].notna().any()  # report labellers
    extra_header = " accuracy / sensitivity / specificity (Youden) |" if thresholded else ""
    for (setting, test_set), group in table.groupby(["setting", "test_set"], sort=False):
        lines += [
            f"### {setting} — {test_set} test set",
            "",
            f"| method | seed | mean AUROC (95% CI) |{extra_header} classes | p vs {reference or '-'} "
            "| Shapiro-Wilk p |",
            "| --- | --- | --- |" + (" --- |" if thresholded else "") + " --- | --- | --- |",
        ]
        for row in group.itertuples(index=False):
            p = "—" if math.isnan(row.p_value) else f"{row.p_value:.3g}"
            shapiro = "—" if math.isnan(row.shapiro_p) else f"{row.shapiro_p:.3g}"
            extra = (
                f" {row.mean_accuracy:.3f} / {row.mean_sensitivity:.3f} / {row.mean_specificity:.3f} |"
                if thresholded
                else ""
            )
            lines.append(
                f"| {row.label} | {row.seed} | {row.mean_auroc:.3f} ({row.ci_low:.3f}–{row.ci_high:.3f}) |{extra}"
                f" {row.classes} | {p} | {shapiro} |"
            )
        lines.append("")
    return "\n".join(lines)


def summarize(out: str | Path) -> Path:
    """Write the tables and plots of every finished run under ``out``; returns ``summary.md``."""
    out = Path(out)
    results, per_class = collect(out)
    per_class.to_csv(out / PER_CLASS_FILE, index=False)
    table = summary_table(results, per_class)
    table.to_csv(out / "summary.csv", index=False)
    reference = _reference(list(results["method"].unique()))
    text = _markdown(table, reference)
    split = shared_vs_unique(per_class)
    split.to_csv(out / "shared_vs_unique.csv", index=False)
    text += "\n### Classes every site holds vs the others (mean AUROC)\n\n| setting | test set | method | seed | shared | others |\n| --- | --- | --- | --- | --- | --- |\n"  # noqa: E501
    for row in split.itertuples(index=False):
        text += (
            f"| {row.setting} | {row.test_set} | {COMPARATOR_LABELS.get(row.method, row.method)} | {row.seed} "
            f"| {_number(row.shared_classes)} | {_number(row.other_classes)} |\n"
        )
    path = out / "summary.md"
    path.write_text(text)
    _plots(results, per_class, out / "plots")
    return path


def _plots(results: pd.DataFrame, per_class: pd.DataFrame, folder: Path) -> None:
    """Mean AUROC vs the grid's factor (mean over seeds; band = CI for one seed, seed range otherwise),
    and per-class AUROC per setting and test set (seed mean)."""
    for (factor, test_set), group in results.groupby(["factor", "test_set"]):
        curves: dict[str, list[tuple[float, float, float, float]]] = {}
        for (method, value), points in group.groupby(["method", "value"]):
            if len(points) == 1:
                band = (points["ci_low"].iloc[0], points["ci_high"].iloc[0])
            else:
                band = (points["mean_auroc"].min(), points["mean_auroc"].max())
            curves.setdefault(method, []).append((value, points["mean_auroc"].mean(), *band))
        if group["value"].nunique() > 1:
            plot_metric_vs_factor(
                curves,
                folder / f"mean_auroc_vs_{factor}_{test_set}.png",
                factor,
                f"{test_set} test set",
                COMPARATOR_LABELS,
            )
    for (setting, test_set), group in per_class.groupby(["setting", "test_set"]):
        means = group.groupby(["method", "class_name"], sort=False)["auroc"].mean()
        aurocs = {method: means[method].to_dict() for method in group["method"].unique()}
        shared = sorted(set(group.loc[group["shared"], "class_name"]))
        plot_per_class_by_method(
            aurocs,
            folder / f"per_class_{setting}_{test_set}.png",
            f"{setting}: {test_set} test set",
            COMPARATOR_LABELS,
            shared,
        )
