"""The benchmark's page quotes only numbers its grids' own generated summaries hold: every figure of its prose and
tables is one a reader finds in a seeds.md or summary.md of docs/benchmark/ (the tables the grids wrote)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

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
