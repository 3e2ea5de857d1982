"""Method names → verification rules. A method = drafter choice + rule + schedule.

The rule class of each rule method and the ``method.*`` keys it reads come from the method table
(:data:`specbench.method_names.METHOD_TABLE`); their config defaults live in ``conf/method/<name>.yaml``.
"""

from __future__ import annotations

from specbench.decoding.rules import VerificationRule
from specbench.method_names import (  # noqa: F401
    METHOD_ALIASES,
    METHOD_PARAMS,
    METHOD_TABLE,
    METHODS,
    RULE_METHODS,
    canonical_method,
)
from specbench.targets import import_target

RULES: dict[str, type[VerificationRule]] = {
    name: import_target(METHOD_TABLE[name].rule, f"the method table's rule of {name}") for name in RULE_METHODS
}


def build_target_rule(target: str, params: dict | None = None) -> VerificationRule:
    """A rule named by its class's dotted path (``method.target``) built with ``method.params``; raises
    ValueError naming the key for a class that cannot be imported, is not a rule or refuses the params."""
    cls = import_target(target, "method.target")
    if not (isinstance(cls, type) and issubclass(cls, VerificationRule)):
        raise TypeError(f"method.target={target!r} is not a VerificationRule subclass (specbench.decoding.rules)")
    try:
        return cls(**dict(params or {}))
    except TypeError as err:
        raise ValueError(f"method.params: {target} {err}") from err


def build_rule(name: str, **params) -> VerificationRule | None:
    """The verification rule of a method (None for autoregressive decoding).

    ``params``: the method's keys (e.g. lenience for lossy); keys it does not read are ignored, so one
    method config can carry them all; a key left out takes the rule's own default.
    """
    name = canonical_method(name)
    if name == "auto":
        return None
    reads = METHOD_PARAMS[name]
    return RULES[name](**{k: v for k, v in params.items() if k in reads and v is not None})
