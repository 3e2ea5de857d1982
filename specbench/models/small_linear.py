"""The compiled float32 linear layer for the few rows of decoding on a CPU (``small_linear.c``).

A verification forward multiplies γ + 1 rows by every weight matrix. Float32 on a CPU is memory-bound there:
one row already streams every weight once, so 2..12 rows should cost about what one row costs. MKL's
``F.linear`` does not (on AMD EPYC, 1 thread, SmolLM2-135M's shapes: 1.5–1.9× the one-row time for 2 rows,
2–2.6× for 4), nor does any plain torch formulation measured (the transposed product ``(W @ xᵀ)ᵀ``,
``addmm``, ``bmm``, ``einsum``, ``mv`` per row: docs/engine.md#verification-cost-on-a-cpu). The kernel
multiplies each weight row with all the input rows as it streams in, so the weights are read once.

It also gives a row the same bits alone or among other rows (a fixed reduction order per output, see the C
file), one row included, where it is faster than ``F.linear`` too. Built and loaded like the exact attention
kernel (:func:`specbench.models.exact_attention.load_compiled`): without a compiler, or with
``SPECBENCH_SMALL_LINEAR=torch``, one line is printed and the torch products stay.

It runs on one thread, so it is used only when torch runs on one (``torch.get_num_threads() == 1``): with
more, MKL splits even one row's product over the threads, and the kernel would leave them idle.
"""

from __future__ import annotations

import ctypes
import os
from functools import cache
from pathlib import Path

import torch

from specbench.models.exact_attention import load_compiled

SOURCE = Path(__file__).with_name("small_linear.c")
MAX_ROWS = 12  # measured: at 16 rows F.linear costs as much (the product is no longer memory-bound)
ENABLED = True  # False: every layer takes torch's products (benchmarks/cpu_kernels.py --fp32 compares both)
_I64 = ctypes.c_int64


@cache
def kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or None (one line on stderr says why) where it cannot be built here."""
    if os.environ.get("SPECBENCH_SMALL_LINEAR", "").strip().lower() == "torch":
        return None
    library = load_compiled(SOURCE, "small-batch linear", "float32 linear layers keep torch's products")
    if library is None:
        return None
    function = library.small_linear
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 4 + [_I64] * 5
    return library


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return any(t is not None and t.requires_grad for t in tensors)


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether :func:`linear` takes this call: float32 CPU tensors, 1..MAX_ROWS rows, no gradient to record,
    one torch thread, and the kernel built."""
    width = x.shape[-1]
    rows = x.numel() // width if width else 0
    return (
        ENABLED
        and 1 <= rows <= MAX_ROWS
        and x.dtype == weight.dtype == torch.float32
        and x.device.type == "cpu"
        and weight.device.type == "cpu"
        and weight.stride(-1) == 1
        and (bias is None or (bias.dtype == torch.float32 and bias.device.type == "cpu"))
        and not (torch.is_grad_enabled() and _needs_grad(x, weight, bias))
        and torch.get_num_threads() == 1
        and kernel() is not None
    )


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` computed by the kernel; needs :func:`applies`."""
    width, outs = x.shape[-1], weight.shape[0]
    flat = x.reshape(-1, width)
    if flat.stride(-1) != 1:
        flat = flat.contiguous()
    bias = None if bias is None else bias.contiguous()
    out = torch.empty(flat.shape[0], outs, dtype=torch.float32)
    kernel().small_linear(
        flat.data_ptr(), weight.data_ptr(), None if bias is None else bias.data_ptr(), out.data_ptr(),
        flat.shape[0], outs, width, flat.stride(0), weight.stride(0),
    )  # fmt: skip
    return out.reshape(*x.shape[:-1], outs)
