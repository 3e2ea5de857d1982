"""Layering (docs/architecture.md): imports point down, never in a loop, and no module is over 400 lines.

Every module under ``specbench/`` (and ``launch.py``) is parsed with ``ast`` — nothing is imported — and
every import in it counts: at the top, inside functions, under ``TYPE_CHECKING``, relative ones, and a
constant passed to ``importlib.import_module``. Each module belongs to one layer (``LAYERS``, from the ground
up); a module may import its own layer and the layers below, never one above; the modules import no one in a
circle; and none is longer than ``MAX_LINES``. No function in ``specbench/``, ``benchmarks/`` or
``launch.py`` is longer than ``MAX_FUNCTION_LINES`` (from its ``def`` to its last line, docstring included).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "specbench"
DATA = PACKAGE / "data"
MAX_LINES = 400
MAX_FUNCTION_LINES = 80

# From the ground up: the first entry of a dotted name below ``specbench.`` (a package or a top-level module)
# sits in one layer. docs/architecture.md says what each is for and why this order.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "values", "method_params", "method_names", "targets", "data", "scoring", "tracking",
     "results"),
    ("models",),
    ("decoding",),
    ("drafters",),
    ("pairs", "evaluation", "training", "pipelines", "reporting", "serving", "config"),
    ("tasks",),
    ("launch",),
)

# Imports known to break the rules, to be emptied: (importer, imported) pairs pointing up, cycles as sorted
# tuples of modules, and modules over MAX_LINES.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_CYCLES: set[tuple[str, ...]] = set()
KNOWN_LONG: set[str] = set()
# Functions over MAX_FUNCTION_LINES, as "path::qualified.name", to be emptied.
KNOWN_LONG_FUNCTIONS: set[str] = set()


def imported_modules(source: str, package: str) -> set[str]:
    """The absolute names of the modules (and ``from`` targets) that ``source``, a module of
    ``package``, imports."""
    return {name for name, _ in imports_with_lines(source, package)}


def imports_with_lines(source: str, package: str) -> list[tuple[str, int]]:
    """Every name ``source`` (a module of ``package``) imports, absolute, with the line of the import."""
    found: list[tuple[str, int]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                parts = package.split(".")
                module = ".".join([*parts[: len(parts) - node.level + 1], *([module] if module else [])])
            found.append((module, node.lineno))
            found.extend((f"{module}.{alias.name}", node.lineno) for alias in node.names)
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
            found.append((node.args[0].value, node.lineno))
    return found


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def package_of(path: Path) -> str:
    name = module_name(path)
    return name if path.name == "__init__.py" else name.rpartition(".")[0]


def module_imports(path: Path) -> set[str]:
    return imported_modules(path.read_text(encoding="utf-8"), package_of(path))


PATHS = sorted(PACKAGE.rglob("*.py"))
MODULES = {module_name(path): path for path in PATHS}
SCANNED = {**MODULES, "launch": ROOT / "launch.py"}


def resolve(name: str) -> str | None:
    """The specbench module an imported name loads: itself, or the module that defines the attribute."""
    if not (name == "specbench" or name.startswith("specbench.")):
        return None
    while name not in MODULES:
        name = name.rpartition(".")[0]
    return name


@cache
def edges(module: str) -> tuple[tuple[str, int], ...]:
    """The specbench modules ``module`` imports, each with the line of the first import that loads it."""
    path = SCANNED[module]
    seen: dict[str, int] = {}
    names = imports_with_lines(
        path.read_text(encoding="utf-8"), package_of(path) if module != "launch" else ""
    )
    by_line: dict[int, set[str]] = {}
    for name, line in names:
        by_line.setdefault(line, set()).add(name)
    for name, line in names:
        # ``from package import submodule`` loads the submodule, not what the package's __init__ imports
        others = by_line[line] - {name}
        if (
            name in MODULES
            and others
            and all(other in MODULES and other.startswith(f"{name}.") for other in others)
        ):
            continue
        target = resolve(name)
        if target and target != module:
            seen.setdefault(target, line)
    return tuple(sorted(seen.items()))


def layer(module: str) -> int | None:
    """The layer index of a module (None for the ``specbench`` package itself)."""
    parts = module.split(".")
    if module == "launch":
        return len(LAYERS) - 1
    if len(parts) < 2:
        return None
    for index, names in enumerate(LAYERS):
        if parts[1] in names:
            return index
    raise AssertionError(f"{module} is in no layer: add {parts[1]!r} to LAYERS in tests/test_layers.py")


Graph = Mapping[str, Sequence[tuple[str, int]]]


def import_graph() -> Graph:
    """Every scanned module → the specbench modules it imports, with lines."""
    return {module: edges(module) for module in SCANNED}


def upward_imports(graph: Graph | None = None) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for each import from a lower layer to a higher one."""
    graph = import_graph() if graph is None else graph
    found = []
    for module, targets in graph.items():
        for target, line in targets:
            low, high = layer(module), layer(target)
            if low is not None and high is not None and high > low:
                found.append((module, target, line))
    return found


def cycles(graph: Graph | None = None) -> list[tuple[str, ...]]:
    """The strongly connected groups of more than one module (Tarjan), each as a sorted tuple."""
    graph = import_graph() if graph is None else graph
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[tuple[str, ...]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target, _ in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                groups.append(tuple(sorted(group)))

    for node in graph:
        if node not in index:
            visit(node)
    return groups


def cycle_path(group: tuple[str, ...], graph: Graph | None = None) -> str:
    """One loop through ``group``, written ``a -> b -> ... -> a`` with the line of each import."""
    graph = import_graph() if graph is None else graph
    members = set(group)
    start = group[0]
    path, lines, node = [start], [], start
    while True:
        target, line = next((t, n) for t, n in graph[node] if t in members and t not in path[1:])
        lines.append(line)
        if target == start or target in path:
            path.append(target)
            break
        path.append(target)
        node = target
    return " -> ".join(f"{a} (line {n})" for a, n in zip(path, lines)) + f" -> {path[-1]}"


def test_the_scan_sees_imports():
    assert MODULES, f"no modules under {PACKAGE}"
    everything = set().union(*(module_imports(path) for path in sorted(DATA.rglob("*.py"))))
    assert "specbench.data.prompts" in everything  # the scan is not vacuous
    assert any(edges(module) for module in MODULES)


def test_every_module_has_a_layer():
    for module in SCANNED:
        layer(module)


def test_no_import_points_up():
    found = upward_imports()
    bad = [
        f"{module} (line {line}) imports {target}: layer {layer(module)} -> {layer(target)}"
        for module, target, line in found
        if (module, target) not in KNOWN_UPWARD
    ]
    assert not bad, "imports from a lower layer to a higher one:\n" + "\n".join(bad)
    stale = KNOWN_UPWARD - {(module, target) for module, target, _ in found}
    assert not stale, f"KNOWN_UPWARD lists imports that no longer exist: {sorted(stale)}"


def test_no_import_cycle():
    found = cycles()
    bad = [cycle_path(group) for group in found if group not in KNOWN_CYCLES]
    assert not bad, "import cycles:\n" + "\n".join(bad)
    stale = KNOWN_CYCLES - set(found)
    assert not stale, f"KNOWN_CYCLES lists cycles that no longer exist: {sorted(stale)}"


def test_no_module_is_too_long():
    lengths = {module: len(path.read_text(encoding="utf-8").splitlines()) for module, path in MODULES.items()}
    bad = [
        f"{module}: {n} lines"
        for module, n in sorted(lengths.items())
        if n > MAX_LINES and module not in KNOWN_LONG
    ]
    assert not bad, f"modules over {MAX_LINES} lines (split them by job):\n" + "\n".join(bad)
    stale = {module for module in KNOWN_LONG if lengths.get(module, 0) <= MAX_LINES}
    assert not stale, f"KNOWN_LONG lists modules no longer over {MAX_LINES} lines: {sorted(stale)}"


FUNCTION_SOURCES = sorted([*PATHS, *(ROOT / "benchmarks").rglob("*.py"), ROOT / "launch.py"])


def function_lengths(source: str) -> dict[str, int]:
    """Every function and method of ``source`` (nested ones too), by qualified name, with its line count."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found[name] = child.end_lineno - child.lineno + 1
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return found


def long_functions() -> dict[str, int]:
    return {
        f"{path.relative_to(ROOT)}::{name}": n
        for path in FUNCTION_SOURCES
        for name, n in function_lengths(path.read_text(encoding="utf-8")).items()
        if n > MAX_FUNCTION_LINES
    }


def test_no_function_is_too_long():
    found = long_functions()
    bad = [f"{name}: {n} lines" for name, n in sorted(found.items()) if name not in KNOWN_LONG_FUNCTIONS]
    assert not bad, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps):\n" + "\n".join(
        bad
    )
    stale = KNOWN_LONG_FUNCTIONS - set(found)
    assert not stale, (
        f"KNOWN_LONG_FUNCTIONS lists functions no longer over {MAX_FUNCTION_LINES} lines: {sorted(stale)}"
    )


def test_the_function_scan_counts_methods_and_nested_functions():
    source = (
        "class A:\n    def f(self):\n        def g():\n            pass\n        return g\n\n"
        "def h():\n    pass\n"
    )
    assert function_lengths(source) == {"A.f": 4, "A.f.g": 2, "h": 2}
    assert "specbench/pipelines/synthesize.py" in {str(p.relative_to(ROOT)) for p in FUNCTION_SOURCES}
    assert any(p.parent.name == "benchmarks" for p in FUNCTION_SOURCES)


def test_the_known_exceptions_are_empty():
    assert not (KNOWN_UPWARD or KNOWN_CYCLES or KNOWN_LONG), "the layering has exceptions left"


@pytest.mark.parametrize("path", sorted(DATA.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_data_modules_do_not_import_the_engine_or_tasks(path):
    forbidden = [
        f"specbench.{name}"
        for names in LAYERS[layer("specbench.data") + 1 :]
        for name in names
        if name != "launch"
    ]
    bad = sorted(
        name
        for name in module_imports(path)
        if any(name == package or name.startswith(f"{package}.") for package in forbidden)
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


def test_the_checks_catch_a_loop_and_an_upward_import():
    loop = {
        "specbench.data.a": (("specbench.data.b", 1),),
        "specbench.data.b": (("specbench.data.c", 2),),
        "specbench.data.c": (("specbench.data.a", 3),),
        "specbench.models.d": (("specbench.data.a", 4), ("specbench.drafters.e", 5)),
        "specbench.drafters.e": (),
    }
    assert cycles(loop) == [("specbench.data.a", "specbench.data.b", "specbench.data.c")]
    assert cycle_path(cycles(loop)[0], loop) == (
        "specbench.data.a (line 1) -> specbench.data.b (line 2) -> specbench.data.c (line 3) -> "
        "specbench.data.a"
    )
    assert upward_imports(loop) == [("specbench.models.d", "specbench.drafters.e", 5)]


def test_layers_and_resolution():
    assert (
        layer("specbench.models.loading") < layer("specbench.drafters.base") < layer("specbench.tasks.eval")
    )
    assert resolve("specbench.decoding.engine.SpeculativeEngine") == "specbench.decoding.engine"
    assert resolve("os.path") is None


def test_no_long_line_exceptions():
    """pyproject.toml's ruff config selects E501 and exempts no file from it (the per-file-ignores of lines
    written before E501 was enforced are all wrapped: a new long line fails ``make lint``), and the lint step
    runs in CI."""
    tomllib = pytest.importorskip("tomllib")
    ruff = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    assert {"I", "E501"} <= set(ruff["lint"]["extend-select"])
    assert "E501" not in {*ruff["lint"].get("ignore", ()), *ruff["lint"].get("extend-ignore", ())}
    ignored = [path for path, codes in ruff["lint"].get("per-file-ignores", {}).items() if "E501" in codes]
    assert not ignored, f"per-file-ignores exempts files from E501 (wrap their lines instead): {ignored}"
    assert "make lint" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
