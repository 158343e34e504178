"""The package's layers: imports run one way, FLARE stays in ``flare/``, and only the modality seam knows report kinds.

Read from the source with ``ast`` (runtime imports only: an ``if TYPE_CHECKING:`` block is for type
checkers, not a dependency), so a misplaced import fails here rather than in a reviewer's head.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import surgical_aggregation
from surgical_aggregation.layout import APART, LAYERS, layer_of, layer_table

PACKAGE = Path(surgical_aggregation.__file__).parent
SIBLINGS_APART = {first: second for pair in APART for first, second in (pair, pair[::-1])}


def _modules() -> dict[str, Path]:
    return {".".join(path.relative_to(PACKAGE).with_suffix("").parts): path for path in PACKAGE.rglob("*.py")}


def _top(module: str) -> str:
    return module.split(".")[0]


def _is_type_checking(node: ast.If) -> bool:
    return isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _runtime_imports(path: Path, module: str, for_type_checkers: bool = False) -> set[str]:
    """Absolute names (inside the package, without its prefix) of what ``module`` imports when it runs (and, with
    ``for_type_checkers``, in its ``if TYPE_CHECKING:`` blocks too)."""
    found: set[str] = set()
    package_parts = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node) and not for_type_checkers:
            return
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package_parts[: len(package_parts) - node.level + 1]
                target = ".".join([*base, node.module] if node.module else base)
                found.add(target)
                if not node.module:  # from . import x (a module; from .. import __version__ is the root's attribute)
                    found.update(
                        f"{target}.{alias.name}".lstrip(".") for alias in node.names if not alias.name.startswith("__")
                    )
            elif node.module and node.module.startswith("surgical_aggregation"):
                found.add(node.module.removeprefix("surgical_aggregation").lstrip("."))
            elif node.module:
                found.add("!" + node.module)  # third party
        elif isinstance(node, ast.Import):
            found.update("!" + alias.name for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {name for name in found if name}


MODULES = _modules()


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_run_one_way(module):
    own = layer_of(module)  # a KeyError names a module that no layer of surgical_aggregation/layout.py holds
    for imported in _runtime_imports(MODULES[module], module):
        if imported.startswith("!"):
            continue
        assert layer_of(imported) <= own, f"{module} imports {imported}, which sits above it"
        apart = SIBLINGS_APART.get(_top(module))
        assert apart != _top(imported), f"{module} imports {imported}: the modalities meet only in the seam"


def test_the_root_holds_only_the_packages_and_the_entry_points():
    loose = sorted(path.stem for path in PACKAGE.glob("*.py"))
    assert loose == ["__init__", "__main__", "layout"]
    assert {part.split(".")[0] for layer in LAYERS for part in layer.parts} >= {
        path.name for path in PACKAGE.iterdir() if (path / "__init__.py").is_file()
    }


def test_the_librarys_layer_table_is_written_from_the_layout():
    page = (PACKAGE.parents[1] / "docs" / "library.md").read_text()
    assert f"\n{layer_table()}\n" in page, "run: python -m surgical_aggregation.layout docs/library.md"


def test_flare_is_imported_only_in_the_flare_layer():
    offenders = {
        module
        for module, path in MODULES.items()
        if _top(module) != "flare" and any(name.startswith("!nvflare") for name in _runtime_imports(path, module))
    }
    assert offenders == set()


def test_only_the_modality_seam_knows_report_kinds():
    words = re.compile(r"\b(iu_reports|report_csv|REPORT_KINDS|report_mlp)\b")
    for module, path in MODULES.items():
        if _top(module) not in ("reports", "modalities"):
            found = words.findall(path.read_text())
            assert not found, f"{module} mentions {found}: ask the modality (modalities.registry) instead"


def test_the_site_config_names_no_field_of_a_modality():
    from dataclasses import fields

    from surgical_aggregation.modalities.registry import registered_modalities

    text = (PACKAGE / "training" / "config.py").read_text()
    for modality in registered_modalities():
        for field in fields(modality.settings_type):
            assert not re.search(rf"\b{field.name}\b", text), f"config.py names {modality.name}'s {field.name}"


def _import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it names in an import, a type checker's included."""
    graph = {}
    for module, path in MODULES.items():
        named = set()
        for name in _runtime_imports(path, module, for_type_checkers=True):
            found = next((found for found in (name, f"{name}.__init__") if found in MODULES), None)
            if found and found != module:
                named.add(found)
        graph[module] = named
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each circle of imports a depth-first walk meets, as the modules around it."""
    done: set[str] = set()
    circles = []

    def visit(module: str, path: list[str]) -> None:
        if module in done:
            return
        if module in path:
            circles.append([*path[path.index(module) :], module])
            return
        for imported in sorted(graph[module]):
            visit(imported, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return circles


def test_no_modules_import_each_other_even_through_others_or_for_type_checkers():
    assert _circles(_import_graph()) == []


def test_the_circle_walk_sees_an_import_made_for_type_checkers(tmp_path):
    probe = tmp_path / "registry.py"
    lines = ["from typing import TYPE_CHECKING", "if TYPE_CHECKING:", "    from ..training.config import SiteConfig"]
    probe.write_text("\n".join(lines) + "\n")
    assert "training.config" in _runtime_imports(probe, "modalities.registry", for_type_checkers=True)
    assert "training.config" not in _runtime_imports(probe, "modalities.registry")
    graph = {"modalities.registry": {"training.config"}, "training.config": {"modalities.registry"}}
    assert _circles(graph) == [["modalities.registry", "training.config", "modalities.registry"]]
