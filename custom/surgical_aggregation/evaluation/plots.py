"""PNG figures of results people would rather see than read (matplotlib, no display needed)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use("Agg"): no display needed


def validated_models(history: Sequence[Mapping]) -> list[tuple[int, Mapping]]:
    """(round, validation) of each global model of the history with a validation loss."""
    return [
        (entry["round"], entry["validation"])
        for entry in history
        if not math.isnan(entry.get("validation", {}).get("mean_val_loss", math.nan))
    ]


def plot_training_curves(history: Sequence[Mapping], path: str | Path) -> Path:
    """Validation loss and mean AUROC of each global model (the round that produced it; -1: before training),
    per site and their mean, as the round history records them."""
    validated = validated_models(history)
    if not validated:
        raise ValueError("no validated global model to plot yet")
    rounds = [round_number for round_number, _ in validated]
    sites = sorted({site for _, validation in validated for site in validation.get("sites", {})})
    figure, (loss_axis, auroc_axis) = plt.subplots(1, 2, figsize=(11, 4))
    loss_axis.plot(rounds, [v["mean_val_loss"] for _, v in validated], "k-o", label="mean of sites")
    auroc_axis.plot(rounds, [v["mean_val_auroc"] for _, v in validated], "k-o", label="mean of sites")
    for site in sites:
        points = [(r, v["sites"][site]) for r, v in validated if site in v.get("sites", {})]
        x = [point[0] for point in points]
        loss_axis.plot(x, [metrics.get("val_loss", math.nan) for _, metrics in points], "--", label=site)
        auroc_axis.plot(x, [metrics.get("val_mean_auroc", math.nan) for _, metrics in points], "--", label=site)
    best = [round_number for round_number, validation in validated if validation.get("best")]
    for axis in (loss_axis, auroc_axis):
        for round_number in best[-1:]:
            axis.axvline(round_number, color="tab:green", alpha=0.4, label="best model")
        axis.set_xticks(rounds, ["init" if r < 0 else str(r) for r in rounds])
        axis.set_xlabel("global model after round (init: before training)")
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    loss_axis.set_ylabel("validation BCE loss")
    auroc_axis.set_ylabel("validation mean AUROC")
    figure.suptitle("Global model, validated by each site on its own classes")
    return _save(figure, path)


def plot_per_class_auroc(aurocs: Mapping[str, float], path: str | Path, title: str) -> Path:
    """Horizontal bars of per-class AUROC (undefined classes shown as empty)."""
    names = list(aurocs)
    values = [aurocs[name] for name in names]
    figure, axis = plt.subplots(figsize=(7, 0.32 * len(names) + 1.2))
    axis.barh(names, [0 if math.isnan(v) else v for v in values], color="tab:blue")
    axis.axvline(0.5, color="grey", linestyle=":", label="chance")
    for row, value in enumerate(values):
        label = "undefined" if math.isnan(value) else f"{value:.3f}"
        axis.text(0.01 if math.isnan(value) else value + 0.01, row, label, va="center", fontsize=8)
    axis.set_xlim(0, 1.08)
    axis.invert_yaxis()
    axis.set_xlabel("AUROC")
    axis.set_title(title)
    return _save(figure, path)


def _save(figure, path: str | Path, bottom: float = 0.0) -> Path:
    """``bottom``: the share of the figure's height kept free below the axes (for a figure legend)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.tight_layout(rect=(0, bottom, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


FACTOR_NAMES = {
    "psi": "label heterogeneity ψ",
    "K": "number of sites K",
    "N": "dataset size N",
    "shared": "labels shared by both sites",
}


def plot_metric_vs_factor(
    curves: Mapping[str, Sequence[tuple[float, float, float, float]]],
    path: str | Path,
    factor: str,
    title: str,
    labels: Mapping[str, str] | None = None,
    dashed: Sequence[str] = (),
    colour_of: Mapping[str, str] | None = None,
) -> Path:
    """One line per curve: (factor value, mean AUROC, low, high) points, the band (the CI or seed range) in the
    line's colour. ``colour_of`` groups curves under one colour (e.g. a method's selected and last models: the
    method); the curves in ``dashed`` are drawn dashed."""
    figure, axis = plt.subplots(figsize=(7, 4.5))
    groups = list(dict.fromkeys((colour_of or {}).get(key, key) for key in curves))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {group: palette[index % len(palette)] for index, group in enumerate(groups)}
    for key, points in curves.items():
        points = sorted(points)
        x = [p[0] for p in points]
        colour = colours[(colour_of or {}).get(key, key)]
        axis.plot(
            x,
            [p[1] for p in points],
            "--o" if key in dashed else "-o",
            label=(labels or {}).get(key, key),
            color=colour,
            gid=key,
        )
        band = 0.05 if key in dashed else 0.15
        axis.fill_between(x, [p[2] for p in points], [p[3] for p in points], color=colour, alpha=band)
    axis.set_xlabel(FACTOR_NAMES.get(factor, factor))
    axis.set_ylabel("mean AUROC (95% CI)")
    axis.set_title(title)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
    return _save(figure, path)


def plot_controls_vs_factor(
    panels: Mapping[str, Mapping[str, Sequence[tuple[float, float, float, float]]]],
    path: str | Path,
    factor: str,
    title: str,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Side by side, one panel per control (e.g. missing, absent), sharing the y axis: one line per method of
    (factor value, mean over seeds, seed CI low, high) points, the band its seed CI, one colour per method in every
    panel."""
    figure, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.5), sharey=True, squeeze=False)
    methods = list(dict.fromkeys(method for lines in panels.values() for method in lines))
    palette = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    colours = {method: palette[index % len(palette)] for index, method in enumerate(methods)}
    for axis, (panel, lines) in zip(axes[0], panels.items(), strict=True):
        for method, points in lines.items():
            points = sorted(points)
            x = [p[0] for p in points]
            axis.plot(x, [p[1] for p in points], "-o", label=(labels or {}).get(method, method), color=colours[method])
            axis.fill_between(x, [p[2] for p in points], [p[3] for p in points], color=colours[method], alpha=0.15)
        axis.set_title(panel)
        axis.set_xlabel(FACTOR_NAMES.get(factor, factor))
        axis.grid(alpha=0.3)
    axes[0][0].set_ylabel("mean AUROC (mean over seeds, 95% CI)")
    handles = {}  # every method once, whichever panel drew it (a control may run fewer methods)
    for axis in axes[0]:
        for handle, label in zip(*axis.get_legend_handles_labels(), strict=True):
            handles.setdefault(label, handle)
    figure.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(len(handles), 3), fontsize=8)
    figure.suptitle(title)
    return _save(figure, path, bottom=0.06 * math.ceil(len(handles) / 3))


def plot_per_class_by_method(
    aurocs: Mapping[str, Mapping[str, float]],
    path: str | Path,
    title: str,
    labels: Mapping[str, str] | None = None,
    marked: Sequence[str] = (),
) -> Path:
    """Grouped horizontal bars: per class, one bar per method. Classes in ``marked`` get a '*' (e.g. shared)."""
    methods = list(aurocs)
    classes = list(dict.fromkeys(name for values in aurocs.values() for name in values))
    height = 0.8 / max(len(methods), 1)
    figure, axis = plt.subplots(figsize=(8, 0.28 * len(classes) * max(len(methods), 2) / 2 + 1.5))
    for index, method in enumerate(methods):
        rows = [row + index * height for row in range(len(classes))]
        values = [aurocs[method].get(name, math.nan) for name in classes]
        axis.barh(rows, [0 if math.isnan(v) else v for v in values], height, label=(labels or {}).get(method, method))
    axis.set_yticks([row + 0.4 - height / 2 for row in range(len(classes))])
    axis.set_yticklabels([f"{name} *" if name in marked else name for name in classes], fontsize=8)
    axis.axvline(0.5, color="grey", linestyle=":")
    axis.set_xlim(0, 1)
    axis.invert_yaxis()
    axis.set_xlabel("AUROC" + ("   (* held by every site)" if marked else ""))
    axis.set_title(title)
    axis.legend(fontsize=8, loc="lower right")
    return _save(figure, path)


def plot_validation_curves(
    series: Mapping[str, Sequence[tuple[int, float, float]]],
    marks: Mapping[str, int | None],
    path: str | Path,
    title: str,
    labels: Mapping[str, str] | None = None,
) -> Path:
    """Per method, (round, validation loss, validation mean AUROC) by round, the round in ``marks`` (the selected
    model) circled: what explains the selected and the last models' test figures."""
    figure, (loss_axis, auroc_axis) = plt.subplots(1, 2, figsize=(11, 4))
    for method, points in series.items():
        points = sorted(points)
        rounds = [p[0] for p in points]
        label = (labels or {}).get(method, method)
        (line,) = loss_axis.plot(rounds, [p[1] for p in points], "-o", markersize=3, label=label)
        auroc_axis.plot(rounds, [p[2] for p in points], "-o", markersize=3, color=line.get_color(), label=label)
        chosen = [p for p in points if p[0] == marks.get(method)]
        for axis, index in ((loss_axis, 1), (auroc_axis, 2)):
            for point in chosen:
                axis.plot(point[0], point[index], "o", markersize=11, fillstyle="none", color=line.get_color())
    loss_axis.set_ylabel("validation loss (selects the model)")
    auroc_axis.set_ylabel("validation mean AUROC")
    auroc_axis.axhline(0.5, color="grey", linestyle=":")
    for axis in (loss_axis, auroc_axis):
        axis.set_xlabel("round (-1: before training; circled: the selected model)")
        axis.grid(alpha=0.3)
    auroc_axis.legend(fontsize=8)
    figure.suptitle(title)
    return _save(figure, path)
