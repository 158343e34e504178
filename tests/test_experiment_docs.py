"""The benchmark's page quotes only numbers its grids' own generated summaries hold: every figure of its prose and
tables is one a reader finds in a seeds.md or summary.md of docs/benchmark/ (the tables the grids wrote)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pandas as pd

BENCHMARK = Path(__file__).resolve().parents[1] / "docs" / "benchmark"
FIGURE = re.compile(r"(?<![\d.])[+-]?0\.\d{3,}(?!\d)")  # an AUROC, a loss, a difference as the summaries print them


def test_every_figure_the_benchmark_page_quotes_is_in_a_summary_of_its_grids():
    printed = set()
    for summary in [*BENCHMARK.glob("*/seeds.md"), *BENCHMARK.glob("*/summary.md")]:
        printed |= set(FIGURE.findall(summary.read_text()))
    quoted = FIGURE.findall((BENCHMARK / "README.md").read_text())
    assert quoted and printed
    assert [figure for figure in quoted if figure not in printed] == []


def test_the_pages_tables_are_the_grids_seed_tables():
    spec = importlib.util.spec_from_file_location(
        "benchmark_tables", BENCHMARK.parents[1] / "benchmarks" / "benchmark_tables.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    found = module.tables()
    assert set(found) == {path.parent.name for path in BENCHMARK.glob("*/seeds.csv")}
    assert {f"head-{grid}" for grid in module.GRIDS} | {"full-psi"} <= set(found)
    text = (BENCHMARK / "README.md").read_text()
    assert module.replace_tables(text, found) == text, "run: python benchmarks/benchmark_tables.py"


def test_a_marked_block_is_rewritten_and_the_rest_kept():
    from surgical_aggregation.experiments.summary import rewrite_marked_block

    text = "intro\n<!-- t -->\nold\n<!-- /t -->\nafter <!-- t --> again"
    assert rewrite_marked_block(text, "<!-- t -->", "<!-- /t -->", "new") == (
        "intro\n<!-- t -->\nnew\n<!-- /t -->\nafter <!-- t --> again"
    )
    assert rewrite_marked_block("no markers", "<!-- t -->", "<!-- /t -->", "new") == "no markers"


def test_the_readmes_evidence_figures_are_the_grids_psi_12_of_14_differences():
    """The README's vanilla-minus-surgical figures at psi = 12/14: the head-only grid's with missing findings and
    under absent, and the full network's with missing findings, each read from its grid's seeds.csv."""

    def difference(grid: str, control: str) -> str:
        seeds = pd.read_csv(BENCHMARK / grid / "seeds.csv")
        row = seeds[
            (seeds.factor == "psi") & (seeds.value.round(6) == round(12 / 14, 6)) & (seeds.control == control)
            & (seeds.test_set == "nih") & (seeds.model == "selected") & (seeds.method == "vanilla")
        ]  # fmt: skip
        return f"{row.difference.item():+.3f}".replace("+", "")

    readme = " ".join((BENCHMARK.parents[1] / "README.md").read_text().split())
    head_missing, head_absent = difference("head-psi", "missing"), difference("head-psi", "absent")
    full_missing = difference("full-psi", "missing")
    assert (
        f"(5 seeds, psi = 12/14): {head_missing} with frozen features and missing findings, {head_absent} under "
        f"absent; training the whole network (on a GPU) {full_missing}, which does not separate them" in readme
    )
