"""Layering (docs/architecture.md): ``specbench/data/`` describes data and never runs the engine.

Every module under ``specbench/data`` is parsed with ``ast`` (nothing is imported), and every import in it
— at the top, inside functions, under ``TYPE_CHECKING``, or a constant passed to ``importlib.import_module``
— must stay out of the packages that run models or tasks.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "specbench" / "data"
FORBIDDEN = (
    "specbench.decoding",
    "specbench.evaluation",
    "specbench.serving",
    "specbench.tasks",
    "specbench.training",
    "specbench.pipelines",
)
MODULES = sorted(DATA.rglob("*.py"))


def imported_modules(source: str, package: str) -> set[str]:
    """The absolute names of the modules (and ``from`` targets) that ``source``, a module of
    ``package``, imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                module = ".".join([*parts[: len(parts) - node.level + 1], *([module] if module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id in ("import_module", "__import__"))
            )
        ):
            found.add(node.args[0].value)
    return found


def module_imports(path: Path) -> set[str]:
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    return imported_modules(path.read_text(encoding="utf-8"), package)


def test_the_scan_sees_imports():
    assert MODULES, f"no modules under {DATA}"
    everything = set().union(*(module_imports(path) for path in MODULES))
    assert "specbench.data.prompts" in everything  # the scan is not vacuous


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(ROOT)))
def test_data_modules_do_not_import_the_engine_or_tasks(path):
    bad = sorted(
        name
        for name in module_imports(path)
        if any(name == package or name.startswith(f"{package}.") for package in FORBIDDEN)
    )
    assert not bad, f"{path.relative_to(ROOT)} imports {bad}; specbench/data/ must not run the engine"


def test_relative_and_lazy_imports_are_caught():
    source = (
        "from ..decoding import engine\n"
        "from . import prompts\n"
        "def f():\n"
        "    from specbench.evaluation import build_engines\n"
        "    import importlib\n"
        "    importlib.import_module('specbench.serving.openai_backend')\n"
    )
    names = imported_modules(source, "specbench.data")
    assert {
        "specbench.decoding",
        "specbench.decoding.engine",
        "specbench.data.prompts",
        "specbench.evaluation",
        "specbench.serving.openai_backend",
    } <= names
