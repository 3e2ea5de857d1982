"""A rule's ``method.*`` parameters, declared on its class and read without importing it (torch-free).

A rule class declares its parameters as a class attribute of :class:`Param` calls with literal arguments::

    class LenientRule(VerificationRule):
        params = (Param("lenience", float, gt=0.0, le=1.0, label="lenience"),)

and, when a check spans several parameters, names it in ``param_checks`` (a key of :data:`CROSS_CHECKS`).
:func:`read_declaration` finds the class's source file without importing its module, parses it with
:mod:`ast` and evaluates the declaration's literals, so the method table (:mod:`specbench.method_names`)
knows every rule's parameters before torch is imported. Names in a declaration may refer to literals assigned
in the class body or at the module's top level (``choices=POOLS``); anything else is refused with the file
and the class named. tests/test_method_table.py checks that this reading equals the imported attribute.
"""

from __future__ import annotations

import ast
import importlib.machinery
import importlib.util
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass
from functools import cache
from pathlib import Path
from typing import Any

TYPES: dict[str, type] = {"float": float, "int": int, "str": str, "bool": bool}


class DeclarationError(ValueError):
    """A rule's ``params`` declaration cannot be read without importing it."""


def _number(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


@dataclass(frozen=True)
class Param:
    """One ``method.<name>`` parameter: its Python type, what a value must satisfy, its label in tables.

    The check is declarative: ``gt`` / ``ge`` / ``lt`` / ``le`` bounds and ``choices`` (None: any value of the
    type); ``expect`` (what a good value is, for the error message) is derived from them unless given.
    ``label``: the short name in the results and report tables (None: not shown); ``quiet``: a value the
    tables leave out (a default nobody needs to read). ``nullable``: null is a value (not "take the method's
    default"). ``is_path``: a checkpoint path, whose file name the tables show.
    """

    name: str
    kind: type
    _: KW_ONLY
    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None
    choices: tuple[Any, ...] | None = None
    label: str | None = None
    quiet: Any = None
    nullable: bool = False
    is_path: bool = False
    expect: str = ""

    def __post_init__(self) -> None:
        if self.choices is not None:
            object.__setattr__(self, "choices", tuple(self.choices))
        if not self.expect:
            object.__setattr__(self, "expect", self._describe())

    def _describe(self) -> str:
        if self.choices is not None:
            text = f"one of {list(self.choices)}"
        else:
            low = ("(", self.gt) if self.gt is not None else ("[", self.ge) if self.ge is not None else None
            high = (self.lt, ")") if self.lt is not None else (self.le, "]") if self.le is not None else None
            if low and high:
                text = f"in {low[0]}{_number(low[1])}, {_number(high[0])}{high[1]}"
            elif low:
                text = f"{'>' if low[0] == '(' else '>='} {_number(low[1])}"
            elif high:
                text = f"{'<' if high[1] == ')' else '<='} {_number(high[0])}"
            else:
                return ""
            if self.kind is int:
                text = f"an integer {text}"
        return f"{text} or null" if self.nullable else text

    def accepts(self, value: Any) -> bool:
        """Whether a value of the right type passes the declared bounds and choices."""
        return not (
            (self.gt is not None and not value > self.gt)
            or (self.ge is not None and not value >= self.ge)
            or (self.lt is not None and not value < self.lt)
            or (self.le is not None and not value <= self.le)
            or (self.choices is not None and value not in self.choices)
        )

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a good value of this parameter, or None."""
        if value is None:
            expect = self.expect or self.kind.__name__
            return None if self.nullable else f"method.{self.name} must be set ({expect})"
        if self.kind is float:
            good_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            good_type = isinstance(value, self.kind) and not (self.kind is int and isinstance(value, bool))
        if not good_type or not self.accepts(value):
            return f"method.{self.name} must be {self.expect or 'a ' + self.kind.__name__}, got {value!r}"
        return None


def _token_deferral_alpha(values: dict[str, Any]) -> str | None:
    if values.get("deferral") == "token" and values.get("alpha", 0) > 1:
        return f"method.alpha must be in [0, 1] for the token deferral rule, got {values['alpha']}"
    return None


# Checks across a rule's parameters, named by a rule class's ``param_checks``: values -> a problem or None.
CROSS_CHECKS: dict[str, Callable[[dict[str, Any]], str | None]] = {
    "token_deferral_alpha": _token_deferral_alpha,
}


def module_file(module: str) -> Path:
    """The source file of ``module``, found without importing it or its packages (their ``__init__`` may
    import torch); raises DeclarationError when there is none."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    for index, part in enumerate(rest, 1):
        locations = spec.submodule_search_locations if spec else None
        if not locations:
            spec = None
            break
        spec = importlib.machinery.PathFinder.find_spec(".".join([top, *rest[:index]]), list(locations))
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise DeclarationError(f"cannot find the source file of module {module!r}")
    return Path(spec.origin)


def _literals(body: list[ast.stmt]) -> dict[str, Any]:
    """Names assigned a literal in ``body`` (a module's or a class's statements)."""
    found: dict[str, Any] = {}
    for statement in body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            target, value = statement.targets[0], statement.value
        elif isinstance(statement, ast.AnnAssign) and statement.value is not None:
            target, value = statement.target, statement.value
        else:
            continue
        if isinstance(target, ast.Name):
            try:
                found[target.id] = ast.literal_eval(value)
            except ValueError:
                pass
    return found


def _value(node: ast.expr, names: dict[str, Any], where: str) -> Any:
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return tuple(_value(element, names, where) for element in node.elts)
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise DeclarationError(
            f"{where}: {ast.unparse(node)!r} is no literal (write the value, or a name assigned a literal in "
            "the class body or at the module's top level)"
        ) from None


def _param(call: ast.expr, names: dict[str, Any], where: str) -> Param:
    if not (isinstance(call, ast.Call) and ast.unparse(call.func).rpartition(".")[2] == "Param"):
        raise DeclarationError(f"{where}: {ast.unparse(call)!r} is not a Param(...) call")
    kwargs = {k.arg: k.value for k in call.keywords if k.arg is not None}
    if len(call.args) > 2 or len(kwargs) < len(call.keywords):
        raise DeclarationError(f"{where}: Param takes a name, a type, then keywords: {ast.unparse(call)!r}")
    positional = dict(zip(("name", "kind"), call.args, strict=False))
    kind = positional.get("kind", kwargs.pop("kind", None))
    if not (isinstance(kind, ast.Name) and kind.id in TYPES):
        raise DeclarationError(f"{where}: the type of {ast.unparse(call)!r} must be one of {list(TYPES)}")
    values = {key: _value(node, names, where) for key, node in kwargs.items()}
    name = _value(positional["name"], names, where) if "name" in positional else values.pop("name", None)
    try:
        return Param(name, TYPES[kind.id], **values)
    except TypeError as err:
        raise DeclarationError(f"{where}: {ast.unparse(call)!r}: {err}") from None


@cache
def _parsed(path: Path) -> ast.Module:
    """A module's syntax tree, parsed once for all its classes."""
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


@cache
def read_declaration(target: str) -> tuple[tuple[Param, ...], tuple[str, ...]]:
    """The ``params`` and ``param_checks`` declared in the body of the class ``target`` (a dotted path), read
    from its source without importing it; () for one the class body leaves out. Raises DeclarationError
    naming the file and the class when the class is missing or a declaration is not literal."""
    module, _, class_name = target.rpartition(".")
    path = module_file(module)
    tree = _parsed(path)
    found = [node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == class_name]
    if not found:
        raise DeclarationError(f"{path}: no class {class_name!r} at the top level (the _target_ {target!r})")
    names = {**_literals(tree.body), **_literals(found[0].body)}
    declared: dict[str, ast.expr] = {}
    for statement in found[0].body:
        if isinstance(statement, (ast.Assign, ast.AnnAssign)) and statement.value is not None:
            for name_node in statement.targets if isinstance(statement, ast.Assign) else [statement.target]:
                if isinstance(name_node, ast.Name) and name_node.id in ("params", "param_checks"):
                    declared[name_node.id] = statement.value
    where = f"{path}: class {class_name}"
    params = declared.get("params")
    if params is not None and not isinstance(params, (ast.Tuple, ast.List)):
        raise DeclarationError(f"{where}: params must be a tuple of Param(...) calls")
    checks = _value(declared["param_checks"], names, where) if "param_checks" in declared else ()
    unknown = [name for name in checks if name not in CROSS_CHECKS]
    if unknown:
        raise DeclarationError(f"{where}: param_checks {unknown} are not in {list(CROSS_CHECKS)}")
    return tuple(_param(call, names, where) for call in (params.elts if params else ())), tuple(checks)
