"""The papers' statistics and figures from the finished runs of a grid: tables (markdown, CSV) and plots.

``summary.md`` / ``summary.csv`` are the papers' table for both models of every run, the selected one (lowest
validation loss) and the last round's: mean AUROC (bootstrap 95% CI) per setting, test set, method, seed and model,
with the model's round and validation mean AUROC, and a paired two-tailed t-test across classes against surgical
aggregation's model of the same kind (Shapiro-Wilk of the differences beside it, Wilcoxon in the CSV). A selected
model that validates below chance, or far below the last round's, is flagged with its round. ``summary.md`` also
states the initial model and the selection rule, and lists each run's per-round validation;
``shared_vs_unique.csv`` splits each mean into the classes every site holds and the others; ``plots/`` has mean
AUROC vs the grid's factor (selected solid, last dashed), per-class bars and the per-round validation curves.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Sequence
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from ..core.errors import DataNotFoundError
from ..core.methods import COMPARATOR_LABELS
from ..evaluation.metrics import paired_t_test
from ..evaluation.plots import (
    plot_controls_vs_factor,
    plot_metric_vs_factor,
    plot_per_class_by_method,
    plot_validation_curves,
)
from .choices import ABSENT, CONTROLS, MISSING
from .runner import FINDING_SPECIFICITY

logger = logging.getLogger(__name__)
REFERENCE_METHOD = "surgical"
RESULT_FILE = "result.json"
PER_CLASS_FILE = "per_class_auroc.csv"
MODELS = ("selected", "last")  # the models of every run, as result.json names them
# how finding-specific a full-network model is (runner.run_specificity): one generic score cannot show the method's harm
SPECIFICITY_COLUMNS = ("logit_correlation", "shared_score_auroc_loss")
SPECIFICITY_HEADER = "logit correlation / AUROC lost to one score (validation)"
# A full-network comparison counts only where the ceiling (centralized_full) scores each finding on its own: a model
# whose logits move together ranks by one generic score, which cannot show vanilla FL's false negatives (issue 49).
SPECIFIC_LOGIT_CORRELATION = 0.3
FLAG_DROP = 0.05  # a selected model whose validation mean AUROC is this far below the last round's is flagged
SELECTION_RULE = (
    "the global model (a baseline: the round) with the lowest validation loss, the sites' binary cross-entropy of "
    "the model they received on their own validation images and over their own classes only (a class a site does "
    "not label never counts, for every method: vanilla FL's forced negatives are training labels, not validation "
    "labels)"
)


def collect(out: Path) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """All finished runs: (results, one row per model and test set; per-class AUROC with ``model`` and ``shared``
    columns; the per-round validation curves)."""
    planned = json.loads((out / "plan.json").read_text())
    shared = {s["name"]: set(s["shared_classes"]) for s in planned["settings"]}
    results, per_class, curves = [], [], []
    for path in sorted((out / "runs").glob(f"*/*/seed*/{RESULT_FILE}")):
        result = json.loads(path.read_text())
        keys = {key: result[key] for key in ("setting", "factor", "value", "method", "seed")}
        keys["control"] = result.get("control", MISSING)
        models = result.get("models") or {
            "selected": {"round": None, "validation": None, "test_sets": result["test_sets"]}
        }
        rounds, last = result.get("training", {}).get("rounds"), models.get("last", {}).get("round")
        # early stopping ended it (patience ran out: validation had flattened) before the planned rounds did
        stopped_early = rounds is not None and last is not None and last + 1 < rounds
        for kind, model in models.items():
            validation = model.get("validation") or {}
            for test_set, values in model["test_sets"].items():
                specificity = values.get(FINDING_SPECIFICITY) or {}  # on the set's validation images
                results.append(
                    keys
                    | {
                        "model": kind,
                        "round": model.get("round"),
                        "stopped_early": stopped_early,
                        "val_mean_auroc": validation.get("val_mean_auroc", math.nan),
                        "test_set": test_set,
                        **{key: value for key, value in values.items() if key != FINDING_SPECIFICITY},
                        **{key: specificity.get(key, math.nan) for key in SPECIFICITY_COLUMNS},
                    }
                )
        curves += [keys | point for point in result.get("curve", [])]
        frame = pd.read_csv(path.parent / PER_CLASS_FILE)
        if "model" not in frame:
            frame["model"] = "selected"
        frame = frame.assign(**keys)
        shared_classes = set(result["shared_classes"]) if "shared_classes" in result else shared.get(result["setting"])
        frame["shared"] = frame["class_name"].isin(shared_classes or set())
        per_class.append(frame)
    if not results:
        raise DataNotFoundError(f"no finished run under {out / 'runs'}")
    order = {method: rank for rank, method in enumerate(planned["methods"])}  # the table follows --methods
    results_frame = pd.DataFrame(results)
    results_frame = results_frame.sort_values(
        ["value", "seed", "method", "model"],
        key=lambda column: (
            column.map(order)
            if column.name == "method"
            else column.map(MODELS.index)
            if column.name == "model"
            else column
        ),
        kind="stable",
    )
    return results_frame.reset_index(drop=True), pd.concat(per_class, ignore_index=True), pd.DataFrame(curves)


def _reference(methods: Sequence[str]) -> str | None:
    if REFERENCE_METHOD in methods:
        return REFERENCE_METHOD
    return next((m for m in methods if m.startswith(REFERENCE_METHOD)), None)


def _with_model(frame: pd.DataFrame) -> pd.DataFrame:
    return frame if "model" in frame else frame.assign(model="selected")


def summary_table(results: pd.DataFrame, per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC (95% CI) per setting / test set / method / seed / model, with paired t-tests across classes
    against surgical aggregation's model of the same kind (Shapiro-Wilk on the differences; Wilcoxon alongside)."""
    results, per_class = _with_model(results), _with_model(per_class)
    reference = _reference(list(results["method"].unique()))
    rows = []
    keys = ["setting", "test_set", "seed", "model"]
    for (setting, test_set, seed, model), group in results.groupby(keys, sort=False):
        classes = per_class[
            (per_class.setting == setting)
            & (per_class.test_set == test_set)
            & (per_class.seed == seed)
            & (per_class.model == model)
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
                    logger.warning("%s %s %s %s: no paired test (%s)", setting, test_set, row.method, model, error)
            rows.append(entry)
    return pd.DataFrame(rows)


def shared_vs_unique(per_class: pd.DataFrame) -> pd.DataFrame:
    """Mean AUROC over the classes every site holds, and over the others (held by some sites only)."""
    per_class = _with_model(per_class)
    keys = ["setting", "test_set", "method", "seed", "model"]
    grouped = per_class.groupby([*keys, "shared"])["auroc"].mean().unstack()
    grouped = grouped.rename(columns={True: "shared_classes", False: "other_classes"}).reset_index()
    for column in ("shared_classes", "other_classes"):
        if column not in grouped:
            grouped[column] = math.nan
    return grouped[[*keys, "shared_classes", "other_classes"]]


def specificity_gate(results: pd.DataFrame) -> list[str]:
    """Per setting and test set where ``centralized_full``'s selected models were measured: whether their mean logit
    correlation is at most :data:`SPECIFIC_LOGIT_CORRELATION`, so that the setting's full-network comparison counts,
    and beside it the AUROC they would lose to one shared score: a correlation lowered by fitting each finding less
    lowers that too (``docs/benchmark``: a stand-in of three shapes an image), so the verdict is read with it."""
    if not _has_specificity(results):
        return []
    ceiling = _with_model(results)
    ceiling = ceiling[(ceiling.method == "centralized_full") & (ceiling.model == "selected")]
    lines = []
    for (setting, test_set), group in ceiling.groupby(["setting", "test_set"], sort=False):
        correlation = group["logit_correlation"].mean()
        if math.isnan(correlation):
            continue
        counts = correlation <= SPECIFIC_LOGIT_CORRELATION
        shared_score_loss = group["shared_score_auroc_loss"].mean()
        lines.append(
            f"{setting}, {test_set}: centralized (all labels) has a mean logit correlation of {correlation:.2f} over "
            f"{len(group)} seed(s), {'at most' if counts else 'above'} {SPECIFIC_LOGIT_CORRELATION}: the comparison "
            + (
                "counts by this figure"
                if counts
                else "does not count (its models may rank every finding by one generic score)"
            )
            + f"; ranking every finding by one shared score would cost them {shared_score_loss:.3f} of mean AUROC"
        )
    return lines


def flags(results: pd.DataFrame) -> list[str]:
    """Selected models that validate below chance, or more than :data:`FLAG_DROP` below the last round's model."""
    lines = []
    runs = results.drop_duplicates(["setting", "method", "seed", "model"])
    for (setting, method, seed), group in runs.groupby(["setting", "method", "seed"], sort=False):
        by_model = group.set_index("model")
        if "selected" not in by_model.index:
            continue
        selected = by_model.loc["selected"]
        value, label = selected["val_mean_auroc"], COMPARATOR_LABELS.get(method, method)
        where = f"{setting}, {label}, seed {seed}: the selected model (round {_round(selected['round'])})"
        if not math.isnan(value) and value < 0.5:
            lines.append(f"{where} validates at mean AUROC {value:.3f}, below chance")
        if "last" in by_model.index:
            last = by_model.loc["last"]["val_mean_auroc"]
            if not math.isnan(value) and not math.isnan(last) and last - value > FLAG_DROP:
                lines.append(
                    f"{where} validates at mean AUROC {value:.3f}, {last - value:.3f} below the last round's "
                    f"(round {_round(by_model.loc['last']['round'])}, {last:.3f})"
                )
    return lines


def _number(value: float) -> str:
    return "—" if value is None or math.isnan(value) else f"{value:.3f}"


def _section(title: str, columns: Sequence[str]) -> list[str]:
    """A markdown section's title, a blank line, and its table's header and separator rows."""
    return [title, "", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]


def _round(value) -> str:
    return "—" if value is None or (isinstance(value, float) and math.isnan(value)) else str(int(value))


def _markdown(table: pd.DataFrame, reference: str | None) -> str:
    lines = []
    thresholded = "mean_accuracy" in table and table["mean_accuracy"].notna().any()  # report labellers
    for (setting, test_set), group in table.groupby(["setting", "test_set"], sort=False):
        columns = ["method", "seed", "model (round)", "validation mean AUROC", "mean AUROC (95% CI)"]
        if thresholded:
            columns.append("accuracy / sensitivity / specificity (Youden)")
        specific = _has_specificity(group)
        if specific:
            columns.append(SPECIFICITY_HEADER)
        lines += _section(
            f"### {setting} — {test_set} test set", [*columns, "classes", f"p vs {reference or '-'}", "Shapiro-Wilk p"]
        )
        for row in group.itertuples(index=False):
            p = "—" if math.isnan(row.p_value) else f"{row.p_value:.3g}"
            shapiro = "—" if math.isnan(row.shapiro_p) else f"{row.shapiro_p:.3g}"
            extra = (
                f" {row.mean_accuracy:.3f} / {row.mean_sensitivity:.3f} / {row.mean_specificity:.3f} |"
                if thresholded
                else ""
            )
            if specific:
                extra += f" {_specificity(row.logit_correlation, row.shared_score_auroc_loss)} |"
            lines.append(
                f"| {row.label} | {row.seed} | {row.model} ({_round(row.round)}) | {_number(row.val_mean_auroc)} "
                f"| {row.mean_auroc:.3f} ({row.ci_low:.3f}–{row.ci_high:.3f}) |{extra} {row.classes} | {p} "
                f"| {shapiro} |"
            )
        lines.append("")
    return "\n".join(lines)


def _curves_markdown(curves: pd.DataFrame, results: pd.DataFrame) -> str:
    """Per setting and seed, each method's validation mean AUROC and loss by round (* marks the selected model)."""
    if curves.empty:
        return ""
    selected = {
        (row.setting, row.method, row.seed): row.round
        for row in results[results.model == "selected"].itertuples(index=False)
    }
    lines = [
        "",
        "### Per-round validation (mean AUROC over the sites' validation / the validation loss that selects; "
        "* the selected model)",
        "",
    ]
    for (setting, seed), group in curves.groupby(["setting", "seed"], sort=False):
        rounds = sorted(group["round"].unique())
        lines += _section(f"**{setting}, seed {seed}**", ["method", *("before" if r < 0 else str(r) for r in rounds)])
        for method, points in group.groupby("method", sort=False):
            aurocs = dict(zip(points["round"], points["val_mean_auroc"], strict=True))
            losses = dict(zip(points["round"], points["val_loss"], strict=True))
            chosen = selected.get((setting, method, seed))
            cells = [
                f"{_number(aurocs.get(r, math.nan))} / {_number(losses.get(r, math.nan))}"
                + ("*" if chosen is not None and r == chosen else "")
                for r in rounds
            ]
            lines.append(f"| {COMPARATOR_LABELS.get(method, method)} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


SEEDS_FILE = "seeds.md"  # the grid across seeds: means with seed CIs, differences to surgical, round-0 selections


def t_interval(values: np.ndarray) -> tuple[float, float]:
    """The 95% t-interval of the mean of ``values`` (NaN bounds for fewer than two)."""
    if len(values) < 2:
        return math.nan, math.nan
    half = stats.t.ppf(0.975, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
    return float(values.mean() - half), float(values.mean() + half)


def seed_table(results: pd.DataFrame) -> pd.DataFrame:
    """Per factor, value, control, test set, method and model, over seeds: mean AUROC with its 95% t-interval across
    seeds and the mean half-width of the runs' bootstrap CIs (across images); the share of seeds whose selected model
    is the first round's; and the paired difference to surgical aggregation over the seeds (mean, t-interval, p)."""
    results = _with_model(results).assign(control=results.get("control", MISSING))
    reference = _reference(list(results["method"].unique()))
    keys = ["factor", "value", "control", "test_set", "model"]
    rows = []
    for group_keys, group in results.groupby(keys, sort=False):
        by_method = {method: frame.set_index("seed") for method, frame in group.groupby("method", sort=False)}
        for method, frame in by_method.items():
            values = frame["mean_auroc"].to_numpy(dtype=float)
            low, high = t_interval(values)
            row = dict(zip(keys, group_keys, strict=True)) | {
                "method": method,
                "label": COMPARATOR_LABELS.get(method, method),
                "seeds": len(values),
                "mean_auroc": float(values.mean()),
                "seed_ci_low": low,
                "seed_ci_high": high,
                "image_ci_half_width": float(((frame["ci_high"] - frame["ci_low"]) / 2).mean()),
                "first_round_selected": float((frame["round"] == 0).mean()),
                "stopped_early": float(frame["stopped_early"].mean()) if "stopped_early" in frame else math.nan,
                **{key: float(frame[key].mean()) if key in frame else math.nan for key in SPECIFICITY_COLUMNS},
                "difference": math.nan,
                "difference_low": math.nan,
                "difference_high": math.nan,
                "p_value": math.nan,
            }
            if reference and method != reference and reference in by_method:
                ours, theirs = by_method[reference]["mean_auroc"].align(frame["mean_auroc"], join="inner")
                differences = (theirs - ours).to_numpy(dtype=float)
                if len(differences):
                    row["difference"] = float(differences.mean())
                    row["difference_low"], row["difference_high"] = t_interval(differences)
                if len(differences) >= 2 and np.ptp(differences) > 0:
                    row["p_value"] = float(stats.ttest_1samp(differences, 0.0).pvalue)
            rows.append(row)
    return pd.DataFrame(rows)


def rewrite_marked_block(text: str, start: str, end: str, content: str) -> str:
    """``text`` with what lies between its first ``start`` and the next ``end`` marker replaced by ``content`` (the
    generated tables of the docs' pages); unchanged when ``start`` is not in it."""
    if start not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{content}\n{end}{tail}"


def factor_value(factor: str, value: float) -> str:
    """A grid's factor value as its pages write it: psi in fourteenths of NIH's labels (12/14), N as a fraction
    (1/10), K as a number."""
    if factor == "psi" and value not in (0, 1):
        return f"{round(value * 14)}/14"
    if factor == "N" and value not in (0, 1):
        fraction = Fraction(value).limit_denominator(14)
        return f"{fraction.numerator}/{fraction.denominator}"
    return f"{value:g}"


def _share(value: float) -> str:
    return "—" if math.isnan(value) else f"{value:.0%}"


def _has_specificity(frame: pd.DataFrame) -> bool:
    """Whether any of ``frame``'s models was measured for finding specificity (full-network runs are)."""
    return set(SPECIFICITY_COLUMNS) <= set(frame) and bool(frame[list(SPECIFICITY_COLUMNS)].notna().to_numpy().any())


def _specificity(correlation: float, lost: float) -> str:
    return "—" if math.isnan(correlation) else f"{correlation:.2f} / {lost:.3f}"


def _interval(low: float, high: float) -> str:
    return "—" if math.isnan(low) else f"{low:.3f}–{high:.3f}"


def seeds_markdown(table: pd.DataFrame, reference: str | None) -> str:
    """The selected models' seed table, one section per factor and test set."""
    lines = []
    selected = table[table.model == "selected"]
    for (factor, test_set), group in selected.groupby(["factor", "test_set"], sort=False):
        columns = [factor, "control", "method", "seeds", "mean AUROC", "95% CI across seeds", "± across images"]
        columns += [f"minus {reference or '-'} (95% CI across seeds)", "p", "selected at round 0", "stopped early"]
        specific = _has_specificity(group)
        if specific:
            columns.append(SPECIFICITY_HEADER)
        lines += _section(f"### {factor} — {test_set} test set (selected models; mean over seeds)", columns)
        for row in group.sort_values(["value", "control"], kind="stable").itertuples(index=False):
            difference = (
                "—"
                if math.isnan(row.difference)
                else f"{row.difference:+.3f} ({_interval(row.difference_low, row.difference_high)})"
            )
            p = "—" if math.isnan(row.p_value) else f"{row.p_value:.3g}"
            lines.append(
                f"| {factor_value(factor, row.value)} | {row.control} | {row.label} | {row.seeds} "
                f"| {row.mean_auroc:.3f} | {_interval(row.seed_ci_low, row.seed_ci_high)} "
                f"| {row.image_ci_half_width:.3f} | {difference} | {p} | {row.first_round_selected:.0%} "
                f"| {_share(row.stopped_early)} |"
                + (f" {_specificity(row.logit_correlation, row.shared_score_auroc_loss)} |" if specific else "")
            )
        lines.append("")
    return "\n".join(lines)


def summarize(out: str | Path) -> Path:
    """Write the tables and plots of every finished run under ``out``; returns ``summary.md``."""
    out = Path(out)
    planned = json.loads((out / "plan.json").read_text())
    results, per_class, curves = collect(out)
    per_class.to_csv(out / PER_CLASS_FILE, index=False)
    table = summary_table(results, per_class)
    table.to_csv(out / "summary.csv", index=False)
    reference = _reference(list(results["method"].unique()))
    options = planned.get("options", {})
    text = (
        f"Initial model of every method: {options.get('initial_model') or 'not recorded'}; backbone strategy of the "
        f"federated methods and the baselines: {options.get('backbone_strategy', '?')}.\n\n"
        f"Selected model: {SELECTION_RULE}; patience {planned.get('profile', {}).get('patience', '?')}. "
        "Last model: the last round's.\n\n"
    )
    gate = specificity_gate(results)
    if gate:
        text += "**Finding-specificity gate**\n\n" + "".join(f"- {line}\n" for line in gate) + "\n"
    flagged = flags(results)
    if flagged:
        text += "**Flagged selected models**\n\n" + "".join(f"- {line}\n" for line in flagged) + "\n"
    text += _markdown(table, reference)
    text += _curves_markdown(curves, results)
    split = shared_vs_unique(per_class)
    split.to_csv(out / "shared_vs_unique.csv", index=False)
    columns = ["setting", "test set", "method", "seed", "model", "shared", "others"]
    text += "\n" + "\n".join(_section("### Classes every site holds vs the others (mean AUROC)", columns)) + "\n"
    for row in split.itertuples(index=False):
        text += (
            f"| {row.setting} | {row.test_set} | {COMPARATOR_LABELS.get(row.method, row.method)} | {row.seed} "
            f"| {row.model} | {_number(row.shared_classes)} | {_number(row.other_classes)} |\n"
        )
    path = out / "summary.md"
    path.write_text(text)
    if results["seed"].nunique() > 1:
        seeds = seed_table(results)
        seeds.to_csv(out / "seeds.csv", index=False)
        (out / SEEDS_FILE).write_text(
            "Across seeds: each seed draws the label subsets, the patient split and partition, and the training "
            "anew.\n\n" + seeds_markdown(seeds, reference)
        )
        _control_plots(seeds, out / "plots")
    _plots(results, per_class, curves, out / "plots")
    return path


def _control_plots(seeds: pd.DataFrame, folder: Path) -> None:
    """Mean AUROC vs each factor, the controls side by side (missing, absent), seed CIs shaded: selected models."""
    selected = seeds[seeds.model == "selected"]
    for (factor, test_set), group in selected.groupby(["factor", "test_set"], sort=False):
        if group["value"].nunique() < 2:
            continue
        panels = {}
        for control in [c for c in CONTROLS if c in set(group["control"])]:
            lines: dict[str, list[tuple[float, float, float, float]]] = {}
            for row in group[group.control == control].itertuples(index=False):
                lines.setdefault(row.method, []).append((row.value, row.mean_auroc, row.seed_ci_low, row.seed_ci_high))
            panels[f"{control}: {CONTROL_TITLES[control]}"] = lines
        plot_controls_vs_factor(
            panels,
            folder / f"mean_auroc_vs_{factor}_{test_set}_controls.png",
            factor,
            f"{test_set} test set (selected models)",
            COMPARATOR_LABELS,
        )


CONTROL_TITLES = {
    MISSING: "a site's unlabelled findings in its images",
    ABSENT: "left out of its images",
}


def _plots(results: pd.DataFrame, per_class: pd.DataFrame, curves: pd.DataFrame, folder: Path) -> None:
    """Mean AUROC vs the grid's factor (mean over seeds; band = CI for one seed, seed range otherwise; selected
    models solid, last dashed), per-class AUROC of the selected models per setting and test set (seed mean), and
    the per-round validation curves per setting and seed."""
    for (factor, test_set), group in results.groupby(["factor", "test_set"]):
        lines: dict[str, list[tuple[float, float, float, float]]] = {}
        for (method, model, value), points in group.groupby(["method", "model", "value"]):
            if len(points) == 1:
                band = (points["ci_low"].iloc[0], points["ci_high"].iloc[0])
            else:
                band = (points["mean_auroc"].min(), points["mean_auroc"].max())
            lines.setdefault(f"{method}|{model}", []).append((value, points["mean_auroc"].mean(), *band))
        if group["value"].nunique() > 1:
            labels = {
                key: f"{COMPARATOR_LABELS.get(key.split('|')[0], key.split('|')[0])} ({key.split('|')[1]})"
                for key in lines
            }
            plot_metric_vs_factor(
                lines,
                folder / f"mean_auroc_vs_{factor}_{test_set}.png",
                factor,
                f"{test_set} test set (selected models solid, last dashed)",
                labels,
                dashed=[key for key in lines if key.endswith("|last")],
                colour_of={key: key.split("|")[0] for key in lines},  # a method's selected and last: one colour
            )
    selected = per_class[per_class.model == "selected"]
    for (setting, test_set), group in selected.groupby(["setting", "test_set"]):
        means = group.groupby(["method", "class_name"], sort=False)["auroc"].mean()
        aurocs = {method: means[method].to_dict() for method in group["method"].unique()}
        shared = sorted(set(group.loc[group["shared"], "class_name"]))
        plot_per_class_by_method(
            aurocs,
            folder / f"per_class_{setting}_{test_set}.png",
            f"{setting}: {test_set} test set (selected models)",
            COMPARATOR_LABELS,
            shared,
        )
    if curves.empty:
        return
    chosen = results[results.model == "selected"].drop_duplicates(["setting", "method", "seed"])
    for (setting, seed), group in curves.groupby(["setting", "seed"]):
        series = {
            method: [(row.round, row.val_loss, row.val_mean_auroc) for row in points.itertuples(index=False)]
            for method, points in group.groupby("method", sort=False)
        }
        marks = {
            row.method: row.round
            for row in chosen[(chosen.setting == setting) & (chosen.seed == seed)].itertuples(index=False)
        }
        plot_validation_curves(
            series, marks, folder / f"validation_{setting}_seed{seed}.png", f"{setting}, seed {seed}", COMPARATOR_LABELS
        )
