"""Structured configs registered in Hydra's ConfigStore, and validation before any model loads: the entry
points in validate.py, the checks per group (checks, model_checks, steering_checks, train_checks,
draft_vocab, methods) and the plans they return (plans.py).

Importing this package only registers the schemas; it loads no model and touches no file.
"""

from specbench.config.plans import RunPlan
from specbench.config.schema import (
    Config,
    DatasetConfig,
    EvalConfig,
    GenConfig,
    MethodConfig,
    ModelConfig,
    ReportTaskConfig,
    RuntimeConfig,
    ScheduleConfig,
    SteeringConfig,
    TaskConfig,
)
from specbench.config.store import register_configs
from specbench.config.validate import validate
from specbench.errors import ConfigError, DatasetNotFoundError

register_configs()

__all__ = [
    "Config",
    "ConfigError",
    "DatasetConfig",
    "DatasetNotFoundError",
    "EvalConfig",
    "GenConfig",
    "MethodConfig",
    "ModelConfig",
    "ReportTaskConfig",
    "RunPlan",
    "RuntimeConfig",
    "ScheduleConfig",
    "SteeringConfig",
    "TaskConfig",
    "register_configs",
    "validate",
]
