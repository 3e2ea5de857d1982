"""Method names → verification rules. A method = drafter choice + rule + schedule."""

from __future__ import annotations

from specbench.decoding.rules import CascadeRule, EnsembleRule, LenientRule, TypicalRule, VerificationRule

# Names used by the DIVERSED code, accepted as aliases.
METHOD_ALIASES = {
    "sd_static": "static_ensemble",
    "static_en": "static_ensemble",
    "sd_en": "diversed",
    "sd_lossy": "lossy",
    "spe_cas": "cascade",
}
RULE_METHODS = ("sd", "lossy", "static_ensemble", "cascade", "typical")
METHODS = ("auto",) + RULE_METHODS


def canonical_method(name: str) -> str:
    """Resolve aliases and check the name; raises ValueError listing the allowed values."""
    name = METHOD_ALIASES.get(name, name)
    if name not in METHODS:
        allowed = sorted(set(METHODS) | set(METHOD_ALIASES))
        raise ValueError(f"method.name: unknown method {name!r}; allowed: {allowed}")
    return name


def build_rule(name: str, **params) -> VerificationRule | None:
    """The verification rule of a method (None for autoregressive decoding).

    params: lenience (lossy), draft_weight + pool (static_ensemble), deferral + alpha (cascade),
    epsilon + delta (typical). Unused params are ignored so one method config can carry them all.
    """
    name = canonical_method(name)
    if name == "auto":
        return None
    if name == "sd":
        return VerificationRule()
    if name == "lossy":
        return LenientRule(params.get("lenience", 1.0))
    if name == "static_ensemble":
        return EnsembleRule(params.get("draft_weight", 0.0), params.get("pool", "linear"))
    if name == "cascade":
        return CascadeRule(params.get("deferral", "chow"), params.get("alpha", 0.0))
    return TypicalRule(params.get("epsilon", 0.09), params.get("delta", 0.3))
