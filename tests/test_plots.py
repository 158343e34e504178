"""The grid's mean-AUROC plot: one colour per method, its selected model solid and its last dashed."""

from __future__ import annotations

import matplotlib.colors

from surgical_aggregation.evaluation import plots


def test_a_methods_selected_and_last_models_share_its_colour_and_differ_in_style(tmp_path, monkeypatch):
    drawn = {}

    def keep(figure, path):
        drawn["figure"] = figure
        return path

    monkeypatch.setattr(plots, "_save", keep)
    points = [(0.0, 0.8, 0.75, 0.85), (0.5, 0.7, 0.65, 0.75)]
    # the order a groupby gives: each method's last model before its selected one
    curves = {f"{method}|{model}": points for method in ("centralized", "vanilla") for model in ("last", "selected")}
    plots.plot_metric_vs_factor(
        curves,
        tmp_path / "plot.png",
        "psi",
        "title",
        dashed=[key for key in curves if key.endswith("|last")],
        colour_of={key: key.split("|")[0] for key in curves},
    )
    axis = drawn["figure"].axes[0]
    lines = {line.get_gid(): line for line in axis.get_lines()}
    colour = {key: matplotlib.colors.to_hex(line.get_color()) for key, line in lines.items()}
    assert colour["centralized|last"] == colour["centralized|selected"] != colour["vanilla|selected"]
    assert colour["vanilla|last"] == colour["vanilla|selected"]
    assert {key: line.get_linestyle() for key, line in lines.items()} == {
        "centralized|last": "--",
        "centralized|selected": "-",
        "vanilla|last": "--",
        "vanilla|selected": "-",
    }
    bands = [matplotlib.colors.to_hex(band.get_facecolor()[0][:3]) for band in axis.collections]
    assert bands == [colour[key] for key in curves]  # each band in its line's colour
