"""The measured cost model of speculative decoding on one machine (methods.md §7, cost-aware drafting).

Leviathan's S(α, γ, c) assumes that verifying γ + 1 tokens costs as much as one decoding step. On a CPU
(and on a GPU at batch > 1) it does not: ``v(n)``, the verifier's time for a forward over ``n`` new tokens
relative to one token, grows with ``n``. A :class:`CostProfile` holds what was measured for one device,
dtype, model pair, batch size and context length: ``v(n)`` for ``n = 1..max_n`` and the drafter's cost per
drafted token ``c`` (relative to ``v(1)``). From it,

    predicted speedup of a run = Σ emitted tokens / Σ_rounds (drafted·c + v(drafted + 1)),

the time of autoregressive decoding being one ``v(1)`` per token.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

PROFILE_FORMAT = "specbench-cost-profile"
PROFILE_VERSION = 1


@dataclass
class CostProfile:
    """``verify_ms[n-1]``: median time of a verifier forward over ``n`` new tokens (batch ``batch_size``,
    ``context_len`` tokens already cached); ``draft_ms``: the drafter's time per drafted token."""

    verify_ms: list[float]
    draft_ms: float
    batch_size: int = 1
    context_len: int = 0
    device: str = "cpu"
    dtype: str = "float32"
    verifier: str = ""
    drafter: str = ""
    threads: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.verify_ms or any(t <= 0 for t in self.verify_ms):
            raise ValueError(f"a cost profile needs positive verify times for n = 1.., got {self.verify_ms}")
        if self.draft_ms < 0:
            raise ValueError(f"draft_ms must be >= 0, got {self.draft_ms}")

    @property
    def max_n(self) -> int:
        return len(self.verify_ms)

    def v(self, n: int) -> float:
        """Verifier time for ``n`` new tokens relative to one (extrapolated linearly past ``max_n``)."""
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if n <= self.max_n:
            return self.verify_ms[n - 1] / self.verify_ms[0]
        slope = (self.verify_ms[-1] - self.verify_ms[0]) / max(self.max_n - 1, 1)
        return (self.verify_ms[-1] + slope * (n - self.max_n)) / self.verify_ms[0]

    @property
    def c(self) -> float:
        """Drafter cost per drafted token relative to one verifier step."""
        return self.draft_ms / self.verify_ms[0]

    def round_cost(self, drafted: int) -> float:
        """Time of a round that drafts ``drafted`` tokens, in units of one autoregressive step."""
        return drafted * self.c + self.v(drafted + 1)

    def predicted_speedup(self, rounds: Sequence[tuple[int, int]]) -> float:
        """Speedup over autoregressive decoding predicted for rounds of (drafted, emitted)."""
        cost = sum(self.round_cost(d) for d, _ in rounds)
        return sum(e for _, e in rounds) / cost if cost > 0 else 0.0

    def to_dict(self) -> dict:
        return {"format": PROFILE_FORMAT, "version": PROFILE_VERSION, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> CostProfile:
        path = Path(path).expanduser()
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(
                f"cost profile {str(path)!r} does not exist; make one with `python launch.py task=profile`"
            ) from None
        except (OSError, ValueError) as err:
            raise ValueError(f"cost profile {str(path)!r} is not readable JSON ({err})") from err
        return cls.from_dict(data, repr(str(path)))

    @classmethod
    def from_dict(cls, data: Any, source: str = "the data") -> CostProfile:
        """A profile from its :meth:`to_dict` form; ``source`` names it in errors."""
        if not isinstance(data, dict) or data.get("format") != PROFILE_FORMAT:
            raise ValueError(f"{source} is not a specbench cost profile (written by task=profile)")
        fields = {k: v for k, v in data.items() if k not in ("format", "version")}
        try:
            return cls(**fields)
        except TypeError as err:
            raise ValueError(f"cost profile {source} has unexpected fields ({err})") from err

    def table(self) -> str:
        lines = [f"{'n':>3} {'verify ms':>10} {'v(n)':>6}"]
        for n in range(1, self.max_n + 1):
            lines.append(f"{n:>3} {self.verify_ms[n - 1]:>10.2f} {self.v(n):>6.3f}")
        vocab = self.meta.get("draft_vocab_size")
        over = f", draft vocabulary {vocab}" if vocab else ""
        lines.append(f"drafter: {self.draft_ms:.3f} ms per drafted token, c = {self.c:.4f}{over}")
        return "\n".join(lines)


def monotone(values: Sequence[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators).

    A forward over more tokens never costs less; on a shared machine single medians still do, and a
    schedule that trusted such a dip would pick a draft length for noise."""
    blocks: list[list[float]] = []  # [sum, count]
    for value in values:
        blocks.append([float(value), 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            total, count = blocks.pop()
            blocks[-1][0] += total
            blocks[-1][1] += count
    return [total / count for total, count in blocks for _ in range(int(count))]


@torch.no_grad()
def measure_verify_ms(
    verifier: torch.nn.Module,
    vocab_size: int,
    max_n: int,
    batch_size: int = 1,
    context_len: int = 128,
    repeats: int = 5,
    seed: int = 0,
) -> list[float]:
    """Median time of a verifier forward over n = 1..max_n new tokens after ``context_len`` cached ones,
    made non-decreasing in n (:func:`monotone`).

    Each repeat times every n once, in turn, so a change of load on a shared machine falls on all n alike
    instead of on one n's block of repeats
    (docs/drafters-model-free.md#a-lookup-drafter-with-a-model-drafter-as-fallback)."""
    from specbench.decoding.cache import CachedModel
    from specbench.models.devices import synchronize

    cached = CachedModel(verifier, vocab_size)
    device = cached.device
    generator = torch.Generator().manual_seed(seed)
    context = torch.randint(0, vocab_size, (batch_size, max(context_len, 1)), generator=generator).to(device)
    cached.reset(batch_size)
    cached.forward(context)
    keep = cached.num_valid.clone()
    blocks = [
        torch.randint(0, vocab_size, (batch_size, n), generator=generator).to(device)
        for n in range(1, max_n + 1)
    ]

    def step(block: torch.Tensor) -> None:
        cached.forward(block)
        cached.keep(keep)

    times: list[list[float]] = [[] for _ in blocks]
    for block in blocks:  # warm-up
        step(block)
    for _ in range(repeats):
        for n, block in enumerate(blocks):
            synchronize(device)
            start = time.perf_counter()
            step(block)
            synchronize(device)
            times[n].append((time.perf_counter() - start) * 1000.0)
    return monotone([statistics.median(t) for t in times])
