"""Cost profiles cached per machine: ``schedule=cost_aware`` with ``schedule.profile: null``.

v(n) belongs to a machine, a dtype, a thread count and a model pair, not to a run. Measuring it at every
run start costs seconds of forwards, and a profile timed in one busy minute would steer that run alone. So
the first run on a machine measures the profile and stores it under :func:`cache_root`, keyed by
everything that changes the figures (:func:`profile_identity`); later runs read it. ``schedule.profile:
measure`` measures again and replaces the entry. A cache file that does not read back is measured again
and rewritten (it holds nothing that a measurement does not give back), with one printed line that names it.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specbench.decoding.cost import CostProfile
from specbench.results.machine import cpu_model

CACHE_ENV = "SPECBENCH_COST_CACHE"
MEASURE = "measure"  # schedule.profile=measure: measure now, refresh the cached entry


def cache_root() -> Path:
    """``$SPECBENCH_COST_CACHE``, else ``$XDG_CACHE_HOME/specbench/cost-profiles`` (``~/.cache`` by
    default)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV]).expanduser()
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "specbench" / "cost-profiles"


def machine_identity(device: str) -> dict[str, Any]:
    """What of the machine changes a forward's cost: the processor (or GPU), its core count, torch."""
    import torch

    identity: dict[str, Any] = {"cpu": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__}
    if device.startswith("cuda") and torch.cuda.is_available():
        identity["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return identity


def kernels_identity() -> dict[str, Any]:
    """The CPU products a forward runs through: each compiled kernel's source hash where it loads here (None
    where it does not, or is switched off) and the bf16 linear product. A faster kernel changes v(n), so a
    profile timed before it is not reused after."""
    from specbench.models import exact_attention, small_linear
    from specbench.models.row_invariant import LINEAR_PRODUCT

    def source(module: Any, enabled: bool = True) -> str | None:
        if not enabled or module.kernel() is None:
            return None
        return hashlib.sha256(module.SOURCE.read_bytes()).hexdigest()[:12]

    return {
        "small_linear": source(small_linear, small_linear.ENABLED),
        "exact_attention": source(exact_attention),
        "linear_product": LINEAR_PRODUCT,
    }


def profile_identity(verifier: Any, drafter: Any, max_n: int, context_len: int) -> dict[str, Any]:
    """Everything a cached profile must agree with: the machine, the verifier (name, size, dtype, device),
    the drafter (its ``describe()``), torch's thread count, the CPU kernels (:func:`kernels_identity`),
    ``max_n`` and the context length timed."""
    import torch

    model = verifier.model
    device = str(model.device)
    described = json.loads(json.dumps(drafter.describe(), sort_keys=True, default=str)) if drafter else None
    return {
        "machine": machine_identity(device),
        "threads": torch.get_num_threads(),
        "kernels": kernels_identity() if device == "cpu" else None,
        "device": device,
        "dtype": str(model.dtype).removeprefix("torch."),
        "verifier": verifier.name,
        "verifier_parameters": sum(p.numel() for p in model.parameters()),
        "drafter": described,
        "max_n": int(max_n),
        "context_len": int(context_len),
    }


def profile_path(identity: dict[str, Any], root: Path | None = None) -> Path:
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    return (root or cache_root()) / f"{digest}.json"


def _read(path: Path, identity: dict[str, Any]) -> CostProfile | None:
    """The cached profile, or None when there is none or it does not read back as this identity's."""
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("identity") != identity:
            raise ValueError("it was measured for another machine, dtype or model pair")
        return CostProfile.from_dict(data["profile"], repr(str(path)))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        print(f"cost profile cache {path} is unreadable ({err}); measuring again", file=sys.stderr)
        return None


def _write(path: Path, identity: dict[str, Any], profile: CostProfile) -> None:
    """Atomically: a killed run leaves the old entry or none, never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps({"identity": identity, "profile": profile.to_dict()}, indent=2) + "\n")
    partial.replace(path)


def cached_profile(
    identity: dict[str, Any],
    measure: Callable[[], CostProfile],
    refresh: bool = False,
    root: Path | None = None,
) -> tuple[CostProfile, Path, bool]:
    """(profile, its cache file, whether it came from the cache). ``measure`` runs on a miss, or always
    with ``refresh``; its result is stored."""
    path = profile_path(identity, root)
    profile = None if refresh else _read(path, identity)
    if profile is not None:
        return profile, path, True
    profile = measure()
    try:
        _write(path, identity, profile)
    except OSError as err:  # a read-only home still runs, measuring each time
        print(f"cost profile not cached: {path.parent} is not writable ({err})", file=sys.stderr)
    return profile, path, False


def machine_profile(
    measure: Callable[..., CostProfile], verifier: Any, drafter: Any, vocab_size: int, max_n: int,
    context_len: int, refresh: bool = False,
) -> CostProfile:
    """This machine's cached profile for the pair; on a miss (or with ``refresh``)
    ``measure(verifier, drafter, vocab_size, max_n, context_len=context_len)`` makes it. One line on stderr
    says where it came from."""
    identity = profile_identity(verifier, drafter, max_n, context_len)
    if not refresh and not profile_path(identity).exists():
        print("measuring the cost profile for schedule=cost_aware on this machine (cached after) ...",
              file=sys.stderr)  # fmt: skip
    profile, path, hit = cached_profile(
        identity, lambda: measure(verifier, drafter, vocab_size, max_n, context_len=context_len), refresh
    )
    how = "read from" if hit else "measured, cached in"
    print(f"cost profile (v({max_n}) = {profile.v(max_n):.2f}, c = {profile.c:.3f}): {how} {path}",
          file=sys.stderr)  # fmt: skip
    return profile
