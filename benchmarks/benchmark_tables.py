"""The grids' results on docs/benchmark: their tables and plots copied there, and the page's tables written from them.

For each grid folder ``docs/benchmark/<variant>-<grid>/`` (what ``surgical-aggregation experiment --grid <grid> ...
--out`` wrote; variant ``head`` for ``--variant head_only``, ``full`` for the full network; a suffix names a grid run
with ``--co-occurrence``, ``head-psi-padchest``, or on CPU, ``full-psi-cpu``), the page gets, between its
``<!-- benchmark:<folder> -->`` markers, the selected models' mean AUROC on the NIH test split over the seeds with its
95% CI across seeds, per factor value, control and method, and vanilla FL's and partial loss's paired difference to
surgical aggregation.
``tests/test_experiment_docs.py`` holds the page to them.

    python benchmarks/benchmark_tables.py --grids results    # results/head-psi, ..., full-psi, full-K: copy, then write
    python benchmarks/benchmark_tables.py                     # the tables only, from what docs/benchmark holds
"""

from __future__ import annotations

import argparse
import math
import shutil
from pathlib import Path

import pandas as pd

from surgical_aggregation.experiments.choices import CONTROLS
from surgical_aggregation.experiments.summary import factor_value, rewrite_marked_block

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmark" / "README.md"
GRIDS = ("psi", "K", "N")
VARIANTS = ("head", "full")  # --variant head_only, the full network
# grids also run with --co-occurrence padchest (unlabelled findings drawn from PadChest's rows), and the full network's
# psi grid on CPU from the stand-in (cpu: its runs kept in the folder, so that it resumes across sessions): their
# folders' suffix
SUFFIXED_GRIDS = {"head-psi": ("padchest",), "full-psi": ("cpu",)}
TEST_SET = "nih"
METHODS = ("surgical", "vanilla", "partial_loss", "centralized", "centralized_full", "individual")
HEADERS = ("surgical", "vanilla FL", "partial loss", "centralized", "centralized (all labels)", "individual")
COMPARED = ("vanilla", "partial_loss")
MARK = "<!-- benchmark:{} -->", "<!-- /benchmark:{} -->"  # a folder's name: head-psi, full-K, ...
COPIED = ("seeds.md", "seeds.csv", "summary.md", "summary.csv", "plan.json")  # not the runs, models and per-class rows
# the full network's validation curves explain its tables (they flatten within rounds); the head-only grids' are many
COPIED_PLOTS = {"head": ("mean_auroc_vs_*.png",), "full": ("mean_auroc_vs_*.png", "validation_*.png")}


def folder_names() -> list[str]:
    plain = [f"{variant}-{grid}" for variant in VARIANTS for grid in GRIDS]
    return plain + [f"{name}-{rule}" for name in plain for rule in SUFFIXED_GRIDS.get(name, ())]


def grid_folder(name: str) -> Path:
    return PAGE.parent / name


def _across_seeds(low: float, high: float) -> str:
    return "one seed" if math.isnan(low) or math.isnan(high) else f"{low:.3f}–{high:.3f}"


def _cell(row: tuple | None) -> str:  # a row of DataFrame.itertuples
    if row is None:
        return "—"
    cell = f"{row.mean_auroc:.3f} ({_across_seeds(row.seed_ci_low, row.seed_ci_high)})"
    correlation = getattr(row, "logit_correlation", math.nan)  # full-network grids: how finding-specific
    return cell if math.isnan(correlation) else f"{cell}, r {correlation:.2f}"


def _difference(row: tuple | None) -> str:
    if row is None or math.isnan(row.difference):
        return "—"
    return f"{row.difference:+.3f} ({_across_seeds(row.difference_low, row.difference_high)})"


def grid_table(seeds: pd.DataFrame, factor_name: str) -> str:
    """One grid's table: a row per factor value and control, a column per method, then the differences."""
    selected = seeds[(seeds.model == "selected") & (seeds.test_set == TEST_SET)]
    header = (
        f"| {factor_name} | control | seeds | "
        + " | ".join(HEADERS)
        + " | vanilla minus surgical | partial loss minus surgical |"
    )
    lines = [header, "|" + " --- |" * (len(HEADERS) + 5)]
    order = {control: index for index, control in enumerate(CONTROLS)}
    groups = selected.groupby(["factor", "value", "control"], sort=False)
    for (factor, value, control), group in sorted(groups, key=lambda item: (item[0][1], order[item[0][2]])):
        by_method = {row.method: row for row in group.itertuples(index=False)}
        seeds_run = sorted({row.seeds for row in by_method.values()})
        cells = [_cell(by_method.get(method)) for method in METHODS]
        differences = [_difference(by_method.get(method)) for method in COMPARED]
        name = factor_value(factor, value) if factor == factor_name else f"{factor} = {factor_value(factor, value)}"
        lines.append(
            f"| {name} | {control} | {'/'.join(map(str, seeds_run))} | " + " | ".join(cells + differences) + " |"
        )
    return "\n".join(lines)


def tables() -> dict[str, str]:
    """The page's tables by folder name (head-psi, full-K, ...), for the grids whose seed table is there."""
    found = {}
    for name in folder_names():
        path = grid_folder(name) / "seeds.csv"
        if path.is_file():
            found[name] = grid_table(pd.read_csv(path), name.split("-")[1])
    return found


def replace_tables(text: str, found: dict[str, str]) -> str:
    """``text`` with each grid's table between its markers rewritten."""
    for name, table in found.items():
        start, end = (mark.format(name) for mark in MARK)
        if start not in text or end not in text:
            raise ValueError(f"{PAGE}: no {start} ... {end} markers")
        text = rewrite_marked_block(text, start, end, table)
    return text


def copy_grid(source: Path, name: str) -> Path:
    """A finished grid's tables, plan and plots (:data:`COPIED_PLOTS` of its variant) into its docs folder."""
    target = grid_folder(name)
    if target.exists():
        shutil.rmtree(target)
    (target / "plots").mkdir(parents=True)
    for file_name in COPIED:
        shutil.copy2(source / file_name, target / file_name)
    for pattern in COPIED_PLOTS[name.split("-", 1)[0]]:
        for plot in sorted((source / "plots").glob(pattern)):
            shutil.copy2(plot, target / "plots" / plot.name)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--grids", type=Path, help="the folder holding the grids' outputs, head-<grid>/ and full-<grid>/ each"
    )
    arguments = parser.parse_args()
    if arguments.grids:
        for name in folder_names():
            source = arguments.grids / name
            if (source / "seeds.csv").is_file():
                print(f"copied {source} to {copy_grid(source, name)}")
    found = tables()
    PAGE.write_text(replace_tables(PAGE.read_text(), found))
    print(f"wrote the {', '.join(found)} tables of {PAGE}")


if __name__ == "__main__":
    main()
