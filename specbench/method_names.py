"""The method table: every method's name, aliases, rule class and the ``method.*`` parameters it reads, each
with its type, its check and its short label (torch-free: configs are checked with it before torch is
imported; :mod:`specbench.decoding.methods` builds the rules from it).

The table is read, not written: ``conf/method/*.yaml`` gives the methods (``name``; a rule method's class as
``_target_``; an alias yaml composes its method under ``defaults`` and sets ``alias``), and each rule class
declares its parameters in its own body (``params = (Param("lenience", float, gt=0.0, le=1.0,
label="lenience"),)``, :mod:`specbench.method_params`), read with :mod:`ast` without importing the class.
The trained methods, whose parameters their trained parts read, are declared here (:data:`TRAINED_PARAMS`).

Everything else is derived from :data:`METHOD_TABLE`: the structured config ``MethodConfig``
(specbench/config/schema.py), the torch-free check of a method's values (:func:`check_rule_params`), the
error for a parameter the method does not read (:func:`unread_param_error`), the labels of the results
table (specbench/tasks/results.py) and of the sweep report (specbench/reporting/table.py), and the rule
registry (specbench/decoding/methods.py). A built-in rule with parameters takes three files:

1. its rule module (e.g. ``specbench/decoding/rules.py``): the ``VerificationRule`` subclass with its
   ``params`` declaration (and ``param_checks`` naming a check across parameters in
   ``specbench/method_params.py``'s ``CROSS_CHECKS``, only if it needs one);
2. ``conf/method/<name>.yaml``: ``name``, ``_target_`` (the class's dotted path) and each parameter's
   default;
3. its test (``tests/test_rules.py``).

tests/test_method_table.py fails when a rule class takes a parameter its declaration lacks (or declares one
it does not take), and when the parsed declaration differs from the imported one.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from specbench.method_params import CROSS_CHECKS, Param, read_declaration
from specbench.values import POOLS

CONF_METHODS = Path(__file__).resolve().parents[1] / "conf" / "method"
SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's when built with it: startup time


@dataclass(frozen=True)
class MethodEntry:
    """A method: the rule class it verifies with (dotted path, built by decoding/methods.py; None: no rule,
    or the trained part picks it), its parameters, and the checks across parameters it runs (names of
    :data:`specbench.method_params.CROSS_CHECKS`)."""

    rule: str | None
    params: tuple[Param, ...] = ()
    trained: bool = False
    checks: tuple[str, ...] = ()


# The trained methods and the parameters their trained parts read (they have no rule class to declare them).
POOL = Param("pool", str, choices=POOLS, label="pool", quiet="linear")
# How task=train trains an EAGLE-3 head or a DFlash drafter: sft on the target's trajectories, or on-policy
# distillation (the aliases eagle3_opd / dflash_opd; docs/training.md#on-policy-distillation). Decoding
# ignores both; the objective is recorded in the checkpoint.
OBJECTIVE = Param("objective", str, choices=("sft", "opd"), quiet="sft")
OPD_GAMMA = Param("opd_gamma", int, ge=1, nullable=True)  # drafts per rollout round (null: the drafter's γ)
TRAINED_PARAMS: dict[str, tuple[Param, ...]] = {
    "sd2": (),
    "distill": (Param("drafter_checkpoint", str, label="drafter ckpt", nullable=True, is_path=True),),
    "diversed": (POOL, Param("head_checkpoint", str, label="head", nullable=True, is_path=True)),
    "eagle3": (OBJECTIVE, OPD_GAMMA),
    "dflash": (OBJECTIVE, OPD_GAMMA),
}


def _yaml_node(path: Path) -> dict[str, Any]:
    raw = yaml.load(path.read_text(encoding="utf-8"), Loader=SAFE_LOADER) or {}
    node = raw["method"] if isinstance(raw.get("method"), dict) else raw  # `# @package _global_`
    return {**node, "defaults": raw.get("defaults") or []}


def _aliased(path: Path, node: dict[str, Any]) -> str:
    """The method an alias yaml composes (the first plain name of its ``defaults``)."""
    if node["alias"] != path.stem:
        raise ValueError(f"{path}: alias {node['alias']!r} is not the file's name {path.stem!r}")
    names = [entry for entry in node["defaults"] if isinstance(entry, str) and entry != "_self_"]
    if not names:
        raise ValueError(f"{path}: an alias yaml lists the method it stands for under defaults")
    return names[0]


@cache
def read_table(conf_dir: Path = CONF_METHODS) -> tuple[dict[str, MethodEntry], dict[str, str]]:
    """(method table, aliases) from ``conf_dir``'s yamls and the rule classes' declarations, in the order
    auto, the rule methods (by file name), the trained methods (as in TRAINED_PARAMS). A yaml with
    ``params`` names a rule from outside the table (built with ``method.params``) and is left out."""
    rules: dict[str, MethodEntry] = {}
    others: dict[str, MethodEntry] = {}
    aliases: dict[str, str] = {}
    for path in sorted(Path(conf_dir).glob("*.yaml")):
        node = _yaml_node(path)
        if "alias" in node:
            aliases[path.stem] = _aliased(path, node)
            continue
        if "params" in node:
            continue
        name, target = node.get("name"), node.get("_target_")
        if name != path.stem:
            raise ValueError(f"{path}: name {name!r} is not the file's name {path.stem!r}")
        if target:
            params, checks = read_declaration(str(target))
            rules[name] = MethodEntry(str(target), params, checks=checks)
        elif name in TRAINED_PARAMS:
            others[name] = MethodEntry(None, TRAINED_PARAMS[name], trained=True)
        elif name == "auto":
            others[name] = MethodEntry(None)
        else:
            raise ValueError(
                f"{path}: a rule method names its VerificationRule class as _target_ (a trained method is "
                f"declared in TRAINED_PARAMS, specbench/method_names.py)"
            )
    table = {name: others[name] for name in ("auto",) if name in others}
    table.update(rules)
    table.update((name, others[name]) for name in TRAINED_PARAMS if name in others)
    unknown = {alias: name for alias, name in aliases.items() if name not in table}
    if unknown:
        raise ValueError(f"{conf_dir}: aliases of no method: {unknown}")
    return table, aliases


METHOD_TABLE, METHOD_ALIASES = read_table()

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
    for check in entry.checks:
        problem = CROSS_CHECKS[check](params)
        if problem:
            raise ValueError(problem)


def readers_of(key: str) -> list[str]:
    """The methods (then their aliases) that read ``method.<key>``."""
    methods = [name for name, reads in METHOD_PARAMS.items() if key in reads]
    return methods + [alias for name in methods for alias, of in METHOD_ALIASES.items() if of == name]


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
