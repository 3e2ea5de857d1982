"""One meaning per method, whichever way it was named: aliases and ``method.name=`` overrides resolved.

``method=static_en`` (an alias option, ``conf/method/static_en.yaml``), ``method.name=static_en`` and
``method=static_ensemble`` all run the static ensemble with its defaults
(``conf/method/static_ensemble.yaml``).
:func:`normalize_method` rewrites the composed ``method`` node in place: ``name`` becomes the canonical
name, ``alias`` the name the user typed (recorded as the tag ``specbench.method_alias``), a parameter the
method reads and nobody set takes the method's default, a parameter it does not read is an error when
someone set it (:class:`UnreadParamError`: ``method=sd method.draft_weight=0.1``) and cleared when it is a
default another method's yaml left behind (``method=static_ensemble method.name=lossy``), so the recorded
config (``config.yaml``, MLflow params) is what ran. A built-in method's yaml names its rule class
(``_target_``, read by the method table); that ``_target_`` is cleared too (the rule is built by the method's
name), and only one from outside the table (with ``params``, or typed) stays to be built with ``params``.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specbench.errors import ConfigError
from specbench.method_names import (
    ALL_METHODS,
    METHOD_ALIASES,
    METHOD_PARAMS,
    METHOD_TABLE,
    unread_param_error,
)

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
NOT_PARAMS = ("name", "alias", "_target_", "params", "target")
TABLE_RULES = frozenset(entry.rule for entry in METHOD_TABLE.values() if entry.rule)


class UnknownMethodError(ValueError):
    """``method.name`` is neither a method nor an alias."""


class UnreadParamError(ConfigError):
    """A ``method.*`` parameter was set for a method that does not read it (it would change nothing)."""


def canonical_name(requested: str) -> str:
    """``static_en`` → ``static_ensemble``; raises UnknownMethodError listing every allowed name."""
    canonical = METHOD_ALIASES.get(requested, requested)
    if canonical not in ALL_METHODS:
        allowed = sorted({*ALL_METHODS, *METHOD_ALIASES})
        raise UnknownMethodError(f"method.name: unknown method {requested!r}; allowed: {allowed}")
    return canonical


@cache
def method_defaults(canonical: str) -> dict[str, Any]:
    """The values ``conf/method/<canonical>.yaml`` sets (the method's defaults), without ``name``."""
    path = CONF_DIR / "method" / f"{canonical}.yaml"
    if not path.is_file():
        return {}
    values = OmegaConf.to_container(OmegaConf.load(path), resolve=True) or {}
    if isinstance(values.get("method"), dict):  # `# @package _global_`: it also sets other groups' defaults
        values = values["method"]
    return {k: v for k, v in values.items() if k not in ("defaults", *NOT_PARAMS)}


def normalize_method(cfg: DictConfig) -> tuple[str, str | None]:
    """Rewrite ``cfg.method`` into its canonical form (see the module doc); returns (canonical, alias)."""
    node = cfg.method
    requested = str(node.name)
    if node.get("target"):
        raise ConfigError(
            f"method.target is spelled method._target_ now (Hydra's convention, as for tasks, drafters and "
            f"schedules): write `_target_: {node.target}` in the yaml, or method._target_={node.target}"
        )
    typed = overridden_method_keys(cfg)
    if node.get("_target_") and not _names_table_rule(node, typed):
        node.alias = None  # a rule from outside the table (conf/method/<name>.yaml with _target_ + params)
        return requested, None
    node._target_ = None  # a built-in method's yaml names its rule class for the method table: built by name
    canonical = canonical_name(requested)
    alias = requested if requested != canonical else node.get("alias")
    if alias is not None and METHOD_ALIASES.get(alias) != canonical:
        alias = None  # e.g. method=sd_en method.name=lossy: the name the user typed last wins
    defaults = method_defaults(canonical)
    reads = METHOD_PARAMS[canonical]
    if alias is not None:  # what the alias's yaml sets (eagle3_opd: objective=opd), however it was named
        for key, value in method_defaults(alias).items():
            if key not in typed and key != "alias":
                node[key] = value
    for key in list(node.keys()):
        if key in NOT_PARAMS:
            continue
        if key not in reads:
            if node[key] is not None and (key in typed or not _left_behind(key, node[key])):
                raise UnreadParamError(unread_param_error(requested, key))
            node[key] = None
        elif node[key] is None and key in defaults:
            node[key] = defaults[key]
    node.name = canonical
    node.alias = alias
    return canonical, alias


def _names_table_rule(node: DictConfig, typed: set[str]) -> bool:
    """Whether ``method._target_`` is what a built-in method's yaml says (the rule class of a method of the
    table, without ``params``, not typed by the user; also when left behind by a rename such as
    ``method=lossy method.name=sd``) rather than a rule from outside the table."""
    return (
        node._target_ in TABLE_RULES
        and not node.get("params")
        and "_target_" not in typed
    )


def _left_behind(key: str, value: Any) -> bool:
    """Whether ``value`` is the default some method's yaml gives ``key`` (composed, then renamed away)."""
    return any(
        key in reads and method_defaults(name).get(key) == value for name, reads in METHOD_PARAMS.items()
    )


def overridden_method_keys(cfg: DictConfig) -> set[str]:
    """The ``method.<key>`` names set by an override (the command line, a sweep job's values), when known:
    from ``cfg.hydra`` (a config composed with its Hydra node) or the running Hydra app; else empty."""
    overrides = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if overrides is None:
        from hydra.core.hydra_config import HydraConfig

        overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    from specbench.tracking.naming import override_key

    keys = (override_key(str(override)) for override in overrides)
    return {key.split(".", 1)[1] for key in keys if key.startswith("method.") and key.count(".") == 1}
