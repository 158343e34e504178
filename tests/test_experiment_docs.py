"""The experiment pages under docs/ quote only numbers their own generated summary holds: every figure of their prose
is one a reader finds in the summary.md beside it (the tables and the per-round validation the grid wrote)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
PAGES = sorted(page for page in DOCS.glob("experiments-*/**/README.md") if (page.parent / "summary.md").is_file())
FIGURE = re.compile(r"(?<![\d.])0\.\d{3,}(?!\d)")  # an AUROC, a loss or a p-value as the summary prints them


def test_there_are_experiment_pages():
    assert {page.parent.name for page in PAGES} >= {"experiments-small", "experiments-psi", "fedavg"}


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(DOCS)))
def test_every_figure_an_experiment_page_quotes_is_in_its_summary(page):
    summary = page.parent / "summary.md"
    printed = set(FIGURE.findall(summary.read_text()))
    quoted = FIGURE.findall(page.read_text())
    assert quoted, f"{page} quotes no figure"
    assert [figure for figure in quoted if figure not in printed] == [], f"not in {summary}"
