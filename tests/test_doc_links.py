"""The README stays short and every link between the repository's pages leads somewhere: moved sections
are reachable, and a renamed heading breaks a test instead of a reader's click."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
README_MAX_LINES = 200
PAGES = sorted(
    (
        page
        for page in [REPOSITORY / "README.md", *REPOSITORY.glob("docs/**/*.md"), *REPOSITORY.glob("*/README.md")]
        if not page.relative_to(REPOSITORY).parts[0].startswith(".")  # not a tool's own folder (.pytest_cache/)
    ),
    key=lambda page: str(page),
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def heading_anchors(page: Path) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    headings = re.findall(r"^#+ (.+)$", text, re.M)
    return {re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings}


def test_the_readme_is_at_most_200_lines():
    assert len((REPOSITORY / "README.md").read_text().splitlines()) <= README_MAX_LINES


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPOSITORY)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in LINK.findall(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ... are not checked here
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in heading_anchors(linked):
            broken.append(f"{target}: no heading '{anchor}' in {linked.relative_to(REPOSITORY)}")
    assert not broken, broken


TEST_NAME = re.compile(r"`(tests/[\w/]+\.py)::(\w+)")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(REPOSITORY)))
def test_every_test_a_page_names_exists(page):
    """A page that names a test (``tests/x.py::test_name``) as the proof of a claim names one that is there: a renamed
    or removed test breaks this, not the claim's evidence."""
    missing = [
        f"{path}::{name}"
        for path, name in TEST_NAME.findall(" ".join(page.read_text().split()))
        if not re.search(
            rf"^def {name}\(", (REPOSITORY / path).read_text() if (REPOSITORY / path).exists() else "", re.M
        )
    ]
    assert not missing, missing
