"""Every ``surgical-aggregation`` command the docs show parses as written: its command and options exist and take
the values shown (a renamed option, a dropped command or a typo in a doc fails here). Placeholders such as
``<kit>`` stand for paths and parse as such; what the commands do is tested where each is."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from surgical_aggregation.cli import build_parser

REPOSITORY = Path(__file__).resolve().parents[1]
PAGES = [REPOSITORY / "README.md", *sorted(REPOSITORY.glob("*/README.md")), *sorted(REPOSITORY.glob("docs/**/*.md"))]
BLOCK = re.compile(r"```(?:bash|sh|shell)\n(.*?)```", re.DOTALL)


def documented_commands() -> list[tuple[str, list[str]]]:
    """(page, arguments) of each ``surgical-aggregation`` command in the pages' shell blocks, the block's own
    variables (``common="..."``) expanded as the shell would."""
    found = []
    for page in PAGES:
        for block in BLOCK.findall(page.read_text()):
            variables: dict[str, str] = {}
            for line in block.replace("\\\n", " ").splitlines():
                line = line.split(" #", 1)[0].strip()
                assignment = re.fullmatch(r"(\w+)=(.*)", line)
                if assignment:
                    variables[assignment[1]] = " ".join(shlex.split(assignment[2]))
                    continue
                for name, value in variables.items():
                    line = re.sub(rf"\$\{{?{name}\b\}}?", value, line)
                for part in re.split(r"&&|;|\|", line):
                    words = shlex.split(part, comments=True)
                    while words and re.fullmatch(r"\w+=.*", words[0]):  # VAR=value before the command
                        words = words[1:]
                    if words and words[0] == "surgical-aggregation":
                        found.append((str(page.relative_to(REPOSITORY)), words[1:]))
    return found


COMMANDS = documented_commands()


def test_the_docs_show_commands_to_check():
    assert len(COMMANDS) >= 10 and {page for page, _ in COMMANDS} >= {"README.md", "provisioning/README.md"}


@pytest.mark.parametrize(("page", "arguments"), COMMANDS, ids=[" ".join(a)[:60] for _, a in COMMANDS])
def test_a_documented_command_parses_as_written(page, arguments, capsys):
    try:
        build_parser().parse_args(arguments)
    except SystemExit as refused:
        if refused.code:
            pytest.fail(f"{page}: surgical-aggregation {' '.join(arguments)}: {capsys.readouterr().err}")


FLARE_SIMULATOR = re.compile(r"nvflare simulator\s+(\S+)[^`\n]*?\s-w\s+([^\s`]+)")
WORKSPACE_OR_OUTPUT = re.compile(r"(?:--workspace|--out|-w)[ =]([^\s`]+)")


def _inside(path: str, folder: str) -> bool:
    return Path(path) == Path(folder) or Path(folder) in Path(path).parents


def test_a_flare_simulator_workspace_the_docs_give_holds_nothing_another_command_writes():
    """FLARE's simulator empties the workspace it is given (``SimulatorRunner._cleanup_workspace``): a reader who
    follows the README and the docs top to bottom on one machine would lose an earlier command's results if any
    other command (or FLARE's simulator on another job) wrote into, or above, a workspace it is given."""
    flare: dict[str, set[str]] = {}  # workspace -> the jobs the docs run in it
    others: list[tuple[str, str]] = []  # (page, a folder another command writes)
    for page in PAGES:
        for line in page.read_text().splitlines():
            runs = FLARE_SIMULATOR.findall(line)
            for job, workspace in runs:
                flare.setdefault(workspace, set()).add(job)
            if not runs:
                others += [(page.name, folder) for folder in WORKSPACE_OR_OUTPUT.findall(line)]
    assert flare, "the docs show no nvflare simulator command"
    for workspace, jobs in flare.items():
        assert len(jobs) == 1, f"nvflare simulator runs {sorted(jobs)} in one workspace {workspace}"
        for page, folder in others:
            assert not _inside(folder, workspace) and not _inside(workspace, folder), (page, folder, workspace)


def test_ci_runs_the_readmes_install_and_test_commands():
    """``.ci/run`` is the README's install and test commands run on a fresh clone: a change to either place that is
    not made in the other fails here."""
    readme, ci = (REPOSITORY / "README.md").read_text(), (REPOSITORY / ".ci" / "run").read_text()
    (test_command,) = [line for block in BLOCK.findall(readme) for line in block.splitlines() if "pytest" in line]
    assert test_command.startswith("python -m pytest ") and test_command in ci.splitlines()
    (install,) = [line for block in BLOCK.findall(readme) for line in block.splitlines() if "pip install" in line]
    installs = [part.strip() for part in install.split("&&") if "pip install" in part]
    # CI leaves pip's byte-compiling of every module to the imports that need one: the same packages
    ci_installs = [
        line.replace(" --quiet", "").replace(" --no-compile", "")
        for line in ci.splitlines()
        if line.startswith("pip install")
    ]
    assert [part.replace(" --quiet", "") for part in installs] == ci_installs
    if "--no-compile" in ci:  # and the README says so; the .pyc files are written where bytecode may be written
        assert "\nunset PYTHONDONTWRITEBYTECODE\n" in ci
        assert "(byte-compiling what the tests import as they import it)" in " ".join(readme.split())
