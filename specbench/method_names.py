"""The method table: every method's name, aliases, rule class and the ``method.*`` parameters it reads, each
with its type, its check and its short label (torch-free: configs are checked with it before torch is
imported; :mod:`specbench.decoding.methods` builds the rules from it).

Everything else is derived from :data:`METHOD_TABLE`: the structured config ``MethodConfig``
(specbench/config/schema.py), the torch-free check of a method's values (:func:`check_rule_params`), the
error for a parameter the method does not read (:func:`unread_param_error`), the labels of the results
table (specbench/tasks/results.py) and of the sweep report (specbench/reporting/table.py), and the rule
registry (specbench/decoding/methods.py). A built-in rule with parameters is one row here, its rule class,
``conf/method/<name>.yaml`` and its test; tests/test_rules.py fails when a rule class takes a parameter
that its row lacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from specbench.values import DEFERRALS, POOLS

# Names used by the DIVERSED code, accepted as aliases of the canonical names.
METHOD_ALIASES = {
    "sd_static": "static_ensemble",
    "static_en": "static_ensemble",
    "sd_en": "diversed",
    "sd_lossy": "lossy",
    "spe_cas": "cascade",
}


@dataclass(frozen=True)
class Param:
    """One ``method.<name>`` parameter: its Python type, what a value must satisfy, its label in tables.

    ``check`` returns True for a good value (None: any value of the type); ``expect`` says what a good value
    is, for the error message. ``label``: the short name in the results and report tables (None: not shown);
    ``quiet``: a value the tables leave out (a default nobody needs to read). ``nullable``: null is a value
    (not "take the method's default").
    """

    name: str
    kind: type
    check: Callable[[Any], bool] | None = None
    expect: str = ""
    label: str | None = None
    quiet: Any = None
    nullable: bool = False
    is_path: bool = False  # a checkpoint path: tables show its file name

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is not a good value of this parameter, or None."""
        if value is None:
            return None if self.nullable else f"method.{self.name} must be set ({self.expect or self.kind.__name__})"
        if self.kind is float:
            good_type = isinstance(value, (int, float)) and not isinstance(value, bool)
        else:
            good_type = isinstance(value, self.kind) and not (self.kind is int and isinstance(value, bool))
        if not good_type or (self.check is not None and not self.check(value)):
            return f"method.{self.name} must be {self.expect or 'a ' + self.kind.__name__}, got {value!r}"
        return None


@dataclass(frozen=True)
class MethodEntry:
    """A method: the rule class it verifies with (dotted path, built by decoding/methods.py; None: no rule,
    or the trained part picks it), its parameters, and a check across parameters (returns a problem or None)."""

    rule: str | None
    params: tuple[Param, ...] = ()
    trained: bool = False
    cross_check: Callable[[dict[str, Any]], str | None] | None = None


def _cascade_alpha(values: dict[str, Any]) -> str | None:
    if values.get("deferral") == "token" and values.get("alpha", 0) > 1:
        return f"method.alpha must be in [0, 1] for the token deferral rule, got {values['alpha']}"
    return None


POOL = Param("pool", str, lambda v: v in POOLS, f"one of {list(POOLS)}", label="pool", quiet="linear")
_RULES = "specbench.decoding.rules"
METHOD_TABLE: dict[str, MethodEntry] = {
    "auto": MethodEntry(None),
    "sd": MethodEntry(f"{_RULES}.VerificationRule"),
    "lossy": MethodEntry(f"{_RULES}.LenientRule", (
        Param("lenience", float, lambda v: 0.0 < v <= 1.0, "in (0, 1]", label="lenience"),
    )),
    "static_ensemble": MethodEntry(f"{_RULES}.EnsembleRule", (
        Param("draft_weight", float, lambda v: 0.0 <= v <= 1.0, "in [0, 1]", label="w"),
        POOL,
    )),
    "cascade": MethodEntry(f"{_RULES}.CascadeRule", (
        Param("deferral", str, lambda v: v in DEFERRALS, f"one of {list(DEFERRALS)}", label="deferral"),
        Param("alpha", float, lambda v: v >= 0, ">= 0", label="alpha"),
    ), cross_check=_cascade_alpha),
    "typical": MethodEntry(f"{_RULES}.TypicalRule", (
        Param("epsilon", float, lambda v: 0.0 < v <= 1.0, "in (0, 1]", label="epsilon"),
        Param("delta", float, lambda v: v > 0, "> 0", label="delta"),
    )),
    "block": MethodEntry("specbench.decoding.block.BlockRule"),
    "fly": MethodEntry("specbench.decoding.fly.FlyRule", (
        Param("window_size", int, lambda v: v >= 1, "an integer >= 1 or null", label="window", nullable=True),
        Param("entropy_threshold", float, lambda v: v >= 0, ">= 0", label="entropy"),
        Param("entropy_top_k", int, lambda v: v >= 1, "an integer >= 1", label="top_k"),
    )),
    "sd2": MethodEntry(None, trained=True),
    "distill": MethodEntry(None, (
        Param("drafter_checkpoint", str, label="drafter ckpt", nullable=True, is_path=True),
    ), trained=True),
    "diversed": MethodEntry(None, (
        POOL,
        Param("head_checkpoint", str, label="head", nullable=True, is_path=True),
    ), trained=True),
    "eagle3": MethodEntry(None, trained=True),
    "dflash": MethodEntry(None, trained=True),
}  # fmt: skip

RULE_METHODS = tuple(name for name, entry in METHOD_TABLE.items() if entry.rule is not None)
METHODS = ("auto",) + RULE_METHODS  # methods whose rule needs no trained part
TRAINED_METHODS = tuple(name for name, entry in METHOD_TABLE.items() if entry.trained)
ALL_METHODS = METHODS + TRAINED_METHODS

# The ``method.*`` keys each method reads (methods.md §2); every other key is unused by it.
METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    name: tuple(p.name for p in entry.params) for name, entry in METHOD_TABLE.items()
}


def all_params() -> tuple[Param, ...]:
    """Every parameter of the table once, in table order (the fields of ``MethodConfig``)."""
    seen: dict[str, Param] = {}
    for entry in METHOD_TABLE.values():
        for param in entry.params:
            seen.setdefault(param.name, param)
    return tuple(seen.values())


def canonical_method(name: str) -> str:
    """Resolve aliases and check the name; raises ValueError listing the allowed values."""
    name = METHOD_ALIASES.get(name, name)
    if name not in METHODS:
        allowed = sorted(set(METHODS) | set(METHOD_ALIASES))
        raise ValueError(f"method.name: unknown method {name!r}; allowed: {allowed}")
    return name


def check_rule_params(method: str, params: dict[str, Any]) -> None:
    """The values of the parameters ``method`` reads (types, ranges, across parameters); raises ValueError
    naming ``method.<key>``. Keys the method does not read are not looked at here."""
    entry = METHOD_TABLE[METHOD_ALIASES.get(method, method)]
    for param in entry.params:
        problem = param.problem(params.get(param.name))
        if problem:
            raise ValueError(problem)
    if entry.cross_check is not None:
        problem = entry.cross_check(params)
        if problem:
            raise ValueError(problem)


def readers_of(key: str) -> list[str]:
    """The methods (then their aliases) that read ``method.<key>``."""
    methods = [name for name, reads in METHOD_PARAMS.items() if key in reads]
    return methods + [alias for alias, name in METHOD_ALIASES.items() if name in methods]


def unread_param_error(method: str, key: str) -> str:
    """``method=sd does not read draft_weight; static_ensemble, sd_static and static_en do``."""
    readers = readers_of(key)
    if not readers:
        known = sorted(p.name for p in all_params())
        return f"method.{key} is no parameter of any method; the method parameters are {known}"
    listed = readers[0] if len(readers) == 1 else ", ".join(readers[:-1]) + " and " + readers[-1]
    return (
        f"method={method} does not read {key}; {listed} {'does' if len(readers) == 1 else 'do'} "
        f"(add method={readers[0]}, or drop method.{key})"
    )


def table_labels(*, paths: bool = True, skip: tuple[str, ...] = ()) -> tuple[tuple[str, str], ...]:
    """(parameter, label) of every labelled parameter, in table order: the results and report labels."""
    return tuple(
        (p.name, p.label) for p in all_params()
        if p.label is not None and (paths or not p.is_path) and p.name not in skip
    )  # fmt: skip


def quiet_value(key: str) -> Any:
    """The value of ``method.<key>`` that tables leave out (None: show every value)."""
    return next((p.quiet for p in all_params() if p.name == key), None)
