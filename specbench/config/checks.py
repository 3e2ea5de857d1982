"""Checks every plan shares (runtime, dataset, scoring, files, the method name) and the one way a failed check
becomes a ConfigError naming its key. Torch-free."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import DictConfig

from specbench import values
from specbench.config.methods import UnknownMethodError, normalize_method
from specbench.data.dataset_config import dataset_settings
from specbench.data.dataset_sources import DatasetUnavailableError, check_source
from specbench.errors import ConfigError, DatasetNotFoundError
from specbench.scoring.sandbox import ISOLATIONS

T = TypeVar("T")


def checked(key: str, build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``build``; re-raise its ValueError/TypeError as a ConfigError whose message names ``key``."""
    try:
        return build(*args, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        raise ConfigError(message if key in message else f"{key}: {message}") from err


def check_dataset(node: DictConfig) -> None:
    """Dataset values, then whether its data is here (a missing local copy fails before any model loads)."""
    try:
        check_source(dataset_settings(node))
    except DatasetUnavailableError as err:
        raise DatasetNotFoundError(str(err)) from err
    except ValueError as err:
        raise ConfigError(" ".join(str(err).split())) from err


def check_scoring(node: DictConfig) -> None:
    if node.isolation not in ISOLATIONS:
        raise ConfigError(f"scoring.isolation: unknown mode {node.isolation!r}; allowed: {list(ISOLATIONS)}")
    if node.timeout_s <= 0:
        raise ConfigError(f"scoring.timeout_s must be > 0, got {node.timeout_s}")
    if node.memory_mb < 64:
        raise ConfigError(f"scoring.memory_mb must be >= 64, got {node.memory_mb}")
    if node.workers < 1:
        raise ConfigError(f"scoring.workers must be >= 1, got {node.workers}")


def check_file(path: str | None, key: str) -> None:
    if path and not Path(path).expanduser().exists():
        raise ConfigError(f"{key}: {path!r} does not exist (relative paths start at {Path.cwd()})")


def check_runtime(cfg: DictConfig) -> tuple[str, str]:
    """``runtime.*`` values; the device's availability is checked when the plan resolves (torch)."""
    checked("runtime.device", values.check_device, cfg.runtime.device)
    checked("runtime.dtype", values.check_dtype, cfg.runtime.dtype)
    if cfg.runtime.num_threads is not None and cfg.runtime.num_threads < 1:
        raise ConfigError(f"runtime.num_threads must be >= 1 or null, got {cfg.runtime.num_threads}")
    return str(cfg.runtime.device), str(cfg.runtime.dtype)


def check_shards(num_shards: int, shard_id: int) -> None:
    if num_shards < 1:
        raise ConfigError(f"eval.num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ConfigError(f"eval.shard_id must be in [0, eval.num_shards={num_shards}), got {shard_id}")


def method_of(cfg: DictConfig) -> tuple[str, str | None]:
    try:
        return normalize_method(cfg)
    except UnknownMethodError as err:
        raise ConfigError(str(err)) from err
