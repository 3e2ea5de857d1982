"""A faster LM head for the few-row forwards of verification on a CPU.

A verification forward runs the verifier over γ + 1 positions, so its LM head multiplies 2–9 rows by the
(vocab × H) output matrix. On the CPUs measured here (AMD EPYC, MKL, fp32) ``F.linear`` takes that size
through a path that costs 2–3× the one-row product, although both stream the same weights once; the transposed
product ``W @ xᵀ`` stays within 1.1–1.3× of one row up to 8 rows and is faster up to 64
(docs/engine.md#verification-cost-on-a-cpu; measured by the retired benchmarks/verify_cost.py, its record in
results/verify_cost/). Where the compiled small-linear kernel is built and torch runs on one thread, 1..12
float32 rows take it first (:mod:`specbench.models.small_linear`: about the one-row time up to 8 rows, and
the same bits for a row in any block); otherwise one float32 row keeps ``F.linear`` (its matrix-vector path
is already the fast one), and so does anything not on a CPU; bf16 / fp16 CPU inputs take
:class:`RowInvariantLinear`'s forward (the transposed product too, and one row as two). The result differs
from ``F.linear`` only by float rounding.
"""

from __future__ import annotations

import torch
from torch import nn

from specbench.models import small_linear
from specbench.models.row_invariant import RowInvariantLinear

MAX_ROWS = 64  # measured: beyond this the two products cost the same


class SmallBatchLinear(RowInvariantLinear):
    """``nn.Linear`` whose forward computes ``(W @ xᵀ)ᵀ`` for 2..MAX_ROWS rows of float32 on a CPU (other
    inputs: :class:`RowInvariantLinear`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if small_linear.applies(x, self.weight, self.bias):  # float32, 1..12 rows, 1 thread: the C kernel
            return small_linear.linear(x, self.weight, self.bias)
        rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
        if 2 <= rows <= MAX_ROWS and x.device.type == "cpu" and x.dtype == self.weight.dtype == torch.float32:
            out = (self.weight @ x.reshape(rows, x.shape[-1]).T).T
            if self.bias is not None:
                out = out + self.bias
            return out.reshape(*x.shape[:-1], self.out_features)
        return super().forward(x)


def use_small_batch_lm_head(model: nn.Module) -> bool:
    """Give ``model``'s LM head the small-batch forward when it is a plain ``nn.Linear``; True if it did.

    The module keeps its parameters (tied embeddings stay tied), state dict and hooks; only its class
    changes, so it deep-copies and pickles like any ``nn.Linear``."""
    getter = getattr(model, "get_output_embeddings", None)
    head = getter() if getter is not None else None
    if type(head) in (nn.Linear, RowInvariantLinear):
        head.__class__ = SmallBatchLinear
        return True
    return isinstance(head, SmallBatchLinear)
