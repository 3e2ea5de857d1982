"""Device and dtype parsing, device synchronisation, and synchronised wall-clock timing."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from typing_extensions import Self

T = TypeVar("T")

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
}


def resolve_device(name: str | torch.device) -> torch.device:
    """Parse "cpu", "cuda", "cuda:N" or "auto" (cuda if available, else cpu) into a torch.device."""
    if isinstance(name, torch.device):
        name = str(name)
    key = name.strip().lower()
    if key == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if key == "cpu":
        return torch.device("cpu")
    if key == "cuda" or key.startswith("cuda:"):
        index_text = key.partition(":")[2]
        if index_text and not index_text.isdigit():
            raise ValueError(f"Unknown device {name!r}: expected 'cuda:N' with an integer N.")
        if not torch.cuda.is_available():
            raise ValueError(
                f"Device {name!r} requested but CUDA is not available in this torch build/machine; "
                "use device=cpu or device=auto."
            )
        if index_text and int(index_text) >= torch.cuda.device_count():
            raise ValueError(
                f"Device {name!r} requested but only {torch.cuda.device_count()} CUDA device(s) exist."
            )
        return torch.device(key)
    raise ValueError(f"Unknown device {name!r}: expected one of 'auto', 'cpu', 'cuda', 'cuda:N'.")


def cpu_has_native_bf16(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """Whether this CPU computes bf16 dot products in hardware (x86: AVX512-BF16 or AMX; Arm: the BF16
    extension), where bf16 decoding is faster than float32. Without them torch emulates bf16 and it is slower.

    ``cpuinfo`` / ``machine``: the text of /proc/cpuinfo and ``platform.machine()`` (read when not given)."""
    import platform

    machine = (machine or platform.machine()).lower()
    if machine in ("x86_64", "amd64", "i686", "x86") and cpuinfo is None:
        probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, probe, lambda: False)() for probe in probes)
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as handle:
                cpuinfo = handle.read()
        except OSError:
            return False  # not Linux: no way to tell, so the safe choice
    wanted = {"avx512_bf16", "amx_bf16"} if machine in ("x86_64", "amd64", "i686", "x86") else {"bf16"}
    for line in cpuinfo.splitlines():
        key, _, flags = line.partition(":")
        if key.strip().lower() in ("flags", "features") and wanted & set(flags.split()):
            return True
    return False


def resolve_dtype(name: str | torch.dtype, device: str | torch.device | None = None) -> torch.dtype:
    """Parse a dtype name. "auto": bfloat16 on CUDA and on a CPU with native bf16 dot products
    (:func:`cpu_has_native_bf16`), float32 elsewhere (no device given: the CPU)."""
    if isinstance(name, torch.dtype):
        return name
    key = name.strip().lower().removeprefix("torch.")
    if key == "auto":
        on_cuda = device is not None and resolve_device(device).type == "cuda"
        return torch.bfloat16 if on_cuda or cpu_has_native_bf16() else torch.float32
    if key not in _DTYPES:
        raise ValueError(f"Unknown dtype {name!r}: expected one of 'auto', {', '.join(map(repr, _DTYPES))}.")
    return _DTYPES[key]


def synchronize(device: str | torch.device) -> None:
    """Wait for queued kernels on a CUDA device; no-op on CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Timer:
    """Context manager measuring wall-clock seconds, synchronising the device at start and end."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self.start: float | None = None
        self.end: float | None = None

    def __enter__(self) -> Self:
        synchronize(self.device)
        self.start = time.perf_counter()
        self.end = None
        return self

    def __exit__(self, *exc: object) -> None:
        synchronize(self.device)
        self.end = time.perf_counter()

    @property
    def seconds(self) -> float:
        """Elapsed seconds (so far, if still running)."""
        if self.start is None:
            raise RuntimeError("Timer was never started.")
        end = self.end if self.end is not None else time.perf_counter()
        return end - self.start


def timed(
    fn: Callable[..., T], *args: Any, device: str | torch.device = "cpu", **kwargs: Any
) -> tuple[T, float]:
    """Call ``fn(*args, **kwargs)`` and return ``(result, seconds)`` measured with a synchronised Timer."""
    with Timer(device) as timer:
        result = fn(*args, **kwargs)
    return result, timer.seconds
