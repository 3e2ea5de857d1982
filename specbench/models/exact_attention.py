"""The compiled row-invariant attention (``exact_attention.c``), built on first use with the system's cc.

One plain C file, no torch headers: ``cc -O3 -march=native -shared`` builds it in well under a second, into
``$SPECBENCH_KERNEL_DIR`` (default ``~/.cache/specbench/kernels``) under a name that hashes the source, the
compiler and the CPU's flags, so a home directory shared by other CPUs never loads a foreign build. It is
loaded with ``ctypes``. Without a compiler (or with ``SPECBENCH_EXACT_ATTENTION=torch``) :func:`kernel`
returns None after printing one line, and the row-wise attention keeps its torch formulation.

Why a kernel: the torch formulation is some forty small ops per layer call, several times SDPA's time for
one query over a few hundred keys on AMD EPYC. The kernel computes each output row with the same loop in the
same order (fp32 dot products over 16 fixed lanes of the head dimension, the lanes added by one fixed tree,
keys summed in index order, masked keys skipped), so a row gets the same bits alone or among any other rows,
in bf16 and float32 alike. It reads keys and values as stored (no transposed or converted copy).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("exact_attention.c")
FLAGS = ("-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-shared", "-fPIC")
PAIR = 32  # exact_attention.c reads a head as pairs of 16-float vectors: d and dv are multiples of it
MAX_DIM = 256  # exact_attention.c's MAX_VECS x 16: the largest query / key head size
DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_I64 = ctypes.c_int64


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


def _compiler() -> str | None:
    chosen = os.environ.get("CC", "").strip()
    return shutil.which(chosen) if chosen else (shutil.which("cc") or shutil.which("gcc"))


def _build(compiler: str, source: Path = SOURCE) -> Path:
    text = source.read_bytes()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False).stdout
    key = hashlib.sha256(text + version.encode() + _cpu_flags().encode() + " ".join(FLAGS).encode())
    folder = Path(os.environ.get("SPECBENCH_KERNEL_DIR") or Path.home() / ".cache" / "specbench" / "kernels")
    target = folder / f"{source.stem}-{key.hexdigest()[:16]}.so"
    if target.exists():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / target.name
        subprocess.run([compiler, *FLAGS, "-o", str(built), str(source), "-lm"], check=True,
                       capture_output=True, text=True)  # fmt: skip
        os.replace(built, target)  # atomic: concurrent builders each land a whole file
    return target


def load_compiled(source: Path, what: str, instead: str) -> ctypes.CDLL | None:
    """``source`` built (:func:`_build`) and loaded, or None after one line on stderr: "specbench: ``what``
    kernel not built (why); ``instead`` (install gcc to build it)". Shared by the compiled kernels."""
    compiler = _compiler()
    try:
        if compiler is None:
            raise FileNotFoundError("no C compiler (cc / gcc / $CC) on PATH")
        return ctypes.CDLL(str(_build(compiler, source)))
    except (OSError, subprocess.CalledProcessError) as error:
        detail = getattr(error, "stderr", None) or error
        print(f"specbench: {what} kernel not built ({str(detail).strip().splitlines()[0]}); {instead} "
              "(install gcc to build it)", file=sys.stderr)  # fmt: skip
        return None


@cache
def kernel() -> ctypes.CDLL | None:
    """The loaded kernel, or None (one line on stderr says why) where it cannot be built here."""
    if os.environ.get("SPECBENCH_EXACT_ATTENTION", "").strip().lower() == "torch":
        return None
    instead = "the row-wise attention uses its slower torch formulation"
    library = load_compiled(SOURCE, "exact attention", instead)
    if library is None:
        return None
    function = library.exact_attention
    function.restype = ctypes.c_int
    function.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 8 + [ctypes.c_float] + [_I64] * 9
    return library


def supports(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> bool:
    return (
        query.device.type == "cpu"
        and query.dtype in DTYPES
        and key.dtype == query.dtype
        and value.dtype == query.dtype
        and key.stride(-1) == 1
        and value.stride(-1) == 1
        and query.shape[-1] % PAIR == 0
        and query.shape[-1] <= MAX_DIM
        and value.shape[-1] % PAIR == 0
    )


def exact_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, allowed: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """Softmax attention, (B, Q, H, dv) (the layout transformers' attention returns). ``query`` (B, H, Q, d),
    ``key`` / ``value`` (B, Hk, K, ·) with Hk dividing H; ``allowed`` (B, 1, Q, K) bool, or None: causal
    over the last Q of the K keys. Needs :func:`kernel` and :func:`supports`."""
    library = kernel()
    if library is None:
        raise RuntimeError("the exact attention kernel is not built here; check kernel() first")
    batch, heads, queries, dim = query.shape
    key_heads, keys, width = key.shape[1], key.shape[2], value.shape[-1]
    query = query.contiguous()
    out = torch.empty(batch, queries, heads, width, dtype=query.dtype)
    mask, mask_strides = None, (0, 0, 0)
    if allowed is not None:
        allowed = allowed.expand(batch, 1, queries, keys)
        mask = allowed.view(torch.uint8) if allowed.dtype == torch.bool else (allowed != 0).view(torch.uint8)
        mask_strides = (mask.stride(0), mask.stride(2), mask.stride(3))
    failed = library.exact_attention(
        query.data_ptr(), key.data_ptr(), value.data_ptr(), None if mask is None else mask.data_ptr(),
        out.data_ptr(), DTYPES[query.dtype], batch, heads, key_heads, queries, keys, dim, width, scale,
        key.stride(0), key.stride(1), key.stride(2), value.stride(0), value.stride(1), value.stride(2),
        *mask_strides,
    )  # fmt: skip
    if failed == 2:
        raise ValueError(f"exact attention: head sizes {dim} / {width}, not multiples of {PAIR} to {MAX_DIM}")
    if failed:
        raise MemoryError(f"exact attention: no memory for {batch}x{heads}x{queries} rows over {keys} keys")
    return out
