"""Method names → verification rules. A method = drafter choice + rule + schedule.

The rule class of each rule method and the ``method.*`` keys it reads come from the method table
(:data:`specbench.method_names.METHOD_TABLE`, read from ``conf/method/<name>.yaml``'s ``_target_`` and the
class's ``params`` declaration); their config defaults live in the same yaml.
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
from specbench.targets import build_target, import_target

RULES: dict[str, type[VerificationRule]] = {
    name: import_target(METHOD_TABLE[name].rule, f"the method table's rule of {name}")
    for name in RULE_METHODS
}


def build_target_rule(target: str, params: dict | None = None) -> VerificationRule:
    """A rule named by its class's dotted path (``method._target_``) built with ``method.params``
    (:func:`specbench.targets.build_target`); raises ValueError naming the key for a class that cannot be
    imported or refuses the params, TypeError for one that is not a rule."""
    cls = import_target(target, "method._target_")
    if not (isinstance(cls, type) and issubclass(cls, VerificationRule)):
        raise TypeError(
            f"method._target_={target!r} is not a VerificationRule subclass (specbench.decoding.rules)"
        )
    return build_target(target, dict(params or {}), "method", "method.params")


def build_rule(name: str, **params) -> VerificationRule | None:
    """The verification rule of a method (None for autoregressive decoding): the method table's class (its
    ``_target_``) built with the method's keys (:func:`specbench.targets.build_target`).

    ``params``: the method's keys (e.g. lenience for lossy); keys it does not read are ignored, so one
    method config can carry them all; a key left out takes the rule's own default.
    """
    name = canonical_method(name)
    if name == "auto":
        return None
    reads = METHOD_PARAMS[name]
    kwargs = {k: v for k, v in params.items() if k in reads and v is not None}
    return build_target(METHOD_TABLE[name].rule, kwargs, "method")
