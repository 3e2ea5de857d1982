"""Method names → verification rules. A method = drafter choice + rule + schedule.

One small registry: the rule class of each rule method, built with the ``method.*`` keys the method reads
(:data:`specbench.method_names.METHOD_PARAMS`; their config defaults live in ``conf/method/<name>.yaml``).
"""

from __future__ import annotations

from specbench.decoding.block import BlockRule
from specbench.decoding.fly import FlyRule
from specbench.decoding.rules import CascadeRule, EnsembleRule, LenientRule, TypicalRule, VerificationRule
from specbench.method_names import METHOD_ALIASES, METHOD_PARAMS, METHODS, RULE_METHODS, canonical_method  # noqa: F401
from specbench.targets import import_target

RULES: dict[str, type[VerificationRule]] = {
    "sd": VerificationRule,
    "lossy": LenientRule,
    "static_ensemble": EnsembleRule,
    "cascade": CascadeRule,
    "typical": TypicalRule,
    "block": BlockRule,
    "fly": FlyRule,
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
