"""What validation returns: the plan of a decoding run (:class:`RunPlan`) and of a training run
(:class:`TrainPlan`), plain data whose library objects (rule, schedule, settings, device, dtype) are built,
importing torch, on first use."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

from specbench.config.checks import checked
from specbench.config.schedule_checks import schedule_arguments
from specbench.models.spec import ModelSpec

if TYPE_CHECKING:
    import torch

    from specbench.decoding.engine import GenerationSettings
    from specbench.decoding.rules import VerificationRule
    from specbench.decoding.schedules import DraftSchedule


class _OnDevice:
    """``device`` / ``dtype`` built (importing torch) from ``device_name`` / ``dtype_name`` on first use."""

    device_name: str
    dtype_name: str

    @cached_property
    def device(self) -> torch.device:
        return _device(self.device_name)

    @cached_property
    def dtype(self) -> torch.dtype:
        return _dtype(self.dtype_name, self.device)


@dataclass(frozen=True)
class RunPlan(_OnDevice):
    """The validated pieces of a decoding run, built from the config without loading any model.

    Values are plain data; ``rule``, ``schedule``, ``settings``, ``device`` and ``dtype`` are the library
    objects, built (importing torch) on first use.
    """

    method: str  # canonical method name ("auto" = autoregressive)
    rule_params: dict[str, Any]
    schedule_params: dict[str, Any]
    gen_params: dict[str, Any]
    batch_size: int
    verifier: ModelSpec
    drafter: ModelSpec | None  # None when no drafter is needed (method=auto)
    device_name: str = "auto"
    dtype_name: str = "float32"
    steering: dict | None = None  # the steering group when steering=sd2
    checkpoint: str | None = None  # the trained part of sd2 / distill / diversed (None: untrained)
    pool: str = "linear"  # diversed
    alias: str | None = None  # the alias the method was asked for (e.g. sd_en), if any

    @cached_property
    def rule(self) -> VerificationRule | None:
        """The verification rule (None: autoregressive, or DIVERSED whose rule is built with its head)."""
        if self.method in ("sd2", "distill", "eagle3", "dflash"):
            from specbench.decoding.rules import VerificationRule

            return VerificationRule()
        if self.method == "diversed":
            return None
        if self.rule_params.get("_target_"):
            from specbench.decoding.methods import build_target_rule

            return checked(
                "method", build_target_rule, self.rule_params["_target_"], self.rule_params["params"]
            )
        from specbench.decoding.methods import build_rule

        return checked("method", build_rule, self.method, **self.rule_params)

    @cached_property
    def schedule(self) -> DraftSchedule:
        """``schedule._target_`` built (:func:`specbench.targets.build_target`): DraftSchedule with the
        group's keys (``cost_aware`` is priced into a CostAwareSchedule once the models load), a schedule from
        outside with ``schedule.params``."""
        from specbench.targets import build_target

        target, kwargs = schedule_arguments(self.schedule_params)
        return checked("schedule", build_target, target, kwargs, "schedule", "schedule.params")

    @cached_property
    def settings(self) -> GenerationSettings:
        from specbench.decoding.engine import GenerationSettings

        return checked("gen", GenerationSettings, **self.gen_params)

    def resolve(self) -> RunPlan:
        """Build every library object now; raises ConfigError for what only torch can tell (no CUDA)."""
        for name in ("device", "dtype", "schedule", "settings", "rule"):
            getattr(self, name)
        return self


@dataclass(frozen=True)
class TrainPlan(_OnDevice):
    """The validated pieces of a training run (``task=train``); ``device`` / ``dtype`` built on first use."""

    method: str  # sd2 | distill | diversed
    verifier: ModelSpec
    drafter: ModelSpec
    device_name: str = "auto"
    dtype_name: str = "float32"
    data: list[str] = field(default_factory=list)  # sd2 / distill: synthetic dataset dirs
    alias: str | None = None

    @cached_property
    def dtype(self) -> torch.dtype:
        """runtime.dtype=auto trains float32 weights on a CPU, even one with native bf16 (bf16 there is for
        decoding); on CUDA it is bf16, as for decoding."""
        if self.dtype_name.strip().lower() == "auto" and self.device.type == "cpu":
            return _dtype("float32", self.device)
        return _dtype(self.dtype_name, self.device)

    def resolve(self) -> TrainPlan:
        """Build device and dtype now (imports torch); raises ConfigError for e.g. a missing GPU."""
        for name in ("device", "dtype"):
            getattr(self, name)
        return self


def _device(name: str) -> torch.device:
    from specbench.models.devices import resolve_device

    return checked("runtime.device", resolve_device, name)


def _dtype(name: str, device: torch.device) -> torch.dtype:
    from specbench.models.devices import resolve_dtype

    return checked("runtime.dtype", resolve_dtype, name, device)
