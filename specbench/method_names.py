"""Method names, their aliases and the parameters each method reads (torch-free: configs are checked
with these before torch is imported; :mod:`specbench.decoding.methods` builds the rules)."""

from __future__ import annotations

# Names used by the DIVERSED code, accepted as aliases of the canonical names.
METHOD_ALIASES = {
    "sd_static": "static_ensemble",
    "static_en": "static_ensemble",
    "sd_en": "diversed",
    "sd_lossy": "lossy",
    "spe_cas": "cascade",
}
RULE_METHODS = ("sd", "lossy", "static_ensemble", "cascade", "typical", "block", "fly")
METHODS = ("auto",) + RULE_METHODS  # methods whose rule needs no trained part
TRAINED_METHODS = ("sd2", "distill", "diversed", "eagle3", "dflash")  # methods that decode with a trained part
ALL_METHODS = METHODS + TRAINED_METHODS

# The ``method.*`` keys each method reads (methods.md §2); every other key is unused by it.
METHOD_PARAMS: dict[str, tuple[str, ...]] = {
    "auto": (),
    "sd": (),
    "lossy": ("lenience",),
    "static_ensemble": ("draft_weight", "pool"),
    "cascade": ("deferral", "alpha"),
    "typical": ("epsilon", "delta"),
    "block": (),
    "fly": ("window_size", "entropy_threshold", "entropy_top_k"),
    "eagle3": (),
    "dflash": (),
    "sd2": (),
    "distill": ("drafter_checkpoint",),
    "diversed": ("pool", "head_checkpoint"),
}


def canonical_method(name: str) -> str:
    """Resolve aliases and check the name; raises ValueError listing the allowed values."""
    name = METHOD_ALIASES.get(name, name)
    if name not in METHODS:
        allowed = sorted(set(METHODS) | set(METHOD_ALIASES))
        raise ValueError(f"method.name: unknown method {name!r}; allowed: {allowed}")
    return name
