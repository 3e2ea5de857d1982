"""The ``schedule`` group: which class builds it (``_target_``) and with what, checked before any model loads.

The built-in schedules are :class:`~specbench.decoding.schedules.DraftSchedule`, built with the group's
own keys (``name``, ``gamma``, ``max_gamma``, ...); ``cost_aware`` is priced into a CostAwareSchedule once
the models load (its cost profile needs them: ``specbench.evaluation.build_engines``). Any other
``_target_`` is a schedule from outside, built with ``schedule.params``; it must have the methods the engine
calls on a schedule.
"""

from __future__ import annotations

from typing import Any

from specbench import values
from specbench.config.checks import checked
from specbench.errors import ConfigError
from specbench.values import DRAFT_SCHEDULE

# What the engine calls on a schedule and reads of it (specbench/decoding/schedules.py, DraftSchedule).
SCHEDULE_METHODS = (
    "initial_gamma", "next_gamma", "bind", "caps", "trim", "observe", "continues", "observe_round",
)
SCHEDULE_ATTRIBUTES = ("name", "max_gamma", "learns_costs")


def schedule_arguments(schedule: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """The ``schedule`` group's ``_target_`` and the arguments it is built with."""
    target = schedule.get("_target_") or DRAFT_SCHEDULE
    if target != DRAFT_SCHEDULE:
        return target, dict(schedule.get("params") or {})
    return target, {k: v for k, v in schedule.items() if k not in ("_target_", "params", "profile")}


def check_schedule_config(schedule: dict[str, Any]) -> str:
    """The built-in schedule's values, or a schedule from outside built once (so its own checks run) and
    checked for what the engine uses; returns the schedule's name. Raises ConfigError naming the key."""
    target, kwargs = schedule_arguments(schedule)
    if target == DRAFT_SCHEDULE:
        if schedule.get("params"):
            raise ConfigError(
                "schedule.params is for a schedule from outside (schedule._target_); the built-in schedules "
                "take schedule.name, gamma, max_gamma, confidence_threshold, profile and learn_costs"
            )
        checked("schedule", values.check_schedule, **{k: v for k, v in schedule.items() if k in CHECKED_KEYS})
        return str(schedule["name"])
    from specbench.targets import build_target  # imports the schedule's module (and maybe torch)

    built = checked("schedule", build_target, target, kwargs, "schedule", "schedule.params")
    lacking = [name for name in SCHEDULE_METHODS if not callable(getattr(built, name, None))]
    lacking += [name for name in SCHEDULE_ATTRIBUTES if not hasattr(built, name)]
    if lacking:
        raise ConfigError(
            f"schedule._target_={target!r} is not a draft schedule: it lacks {lacking} (subclass "
            "specbench.decoding.schedules.DraftSchedule, or give it the same methods)"
        )
    return str(built.name)


CHECKED_KEYS = ("name", "gamma", "max_gamma", "confidence_threshold", "profile", "learn_costs")
