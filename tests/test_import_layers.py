"""The shared layers stay below the rest: nothing under transforms/core/ or transforms/io/ imports
the launcher (beam_pipeline), classification or a branch, so they can be reused and tested alone.

Imports are read with ``ast`` (every one, including those inside functions), not by importing.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LOWER_LAYERS = ("transforms/core", "transforms/io")
FORBIDDEN = ("beam_pipeline", "transforms.classify", "transforms.knowledge",
             "transforms.instruction")
FILES = sorted(path for layer in LOWER_LAYERS for path in (ROOT / layer).rglob("*.py"))


def imported_modules(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in ``source``, a module of ``package``; ``from a import
    b`` gives ``a.b`` too, so that ``from transforms import classify`` is seen."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the package
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            found.append((node.lineno, base))
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def forbidden(module: str) -> bool:
    return any(module == name or module.startswith(f"{name}.") for name in FORBIDDEN)


def test_the_lower_layers_are_found():
    assert {"/".join(path.relative_to(ROOT).parts[:2]) for path in FILES} == set(LOWER_LAYERS)


@pytest.mark.parametrize("path", FILES, ids=lambda path: path.relative_to(ROOT).as_posix())
def test_core_and_io_import_nothing_from_the_layers_above(path):
    package = ".".join(path.parent.relative_to(ROOT).parts)
    upward = [f"{path.relative_to(ROOT)}:{line}: {module}"
              for line, module in imported_modules(path.read_text(encoding="utf-8"), package)
              if forbidden(module)]
    assert not upward, "imports from above transforms/core and transforms/io:\n" + "\n".join(
        upward)


def test_the_check_sees_every_form_of_import():
    source = ("import beam_pipeline.progress\n"
              "from transforms import classify\n"
              "from .. import instruction\n"
              "def f():\n    from transforms.knowledge.branch import KnowledgeBranch\n"
              "from transforms.core.records import Record\n"
              "from . import planning\n")
    modules = [module for _, module in imported_modules(source, "transforms.io")]
    assert [module for module in modules if forbidden(module)] == [
        "beam_pipeline.progress", "transforms.classify", "transforms.instruction",
        "transforms.knowledge.branch", "transforms.knowledge.branch.KnowledgeBranch"]
    assert "transforms.io.planning" in modules
