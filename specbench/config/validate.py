"""Check a composed config before any model is loaded, and turn it into library objects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.data.datasets import DatasetUnavailableError, check_source, dataset_settings
from specbench.decoding.engine import GenerationSettings
from specbench.decoding.methods import METHOD_ALIASES, METHODS, build_rule
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.embedded import CACHE_SUBDIR, cache_root, embedded_gguf_path
from specbench.models.loading import KINDS, ModelSpec
from specbench.scoring.sandbox import ISOLATIONS

T = TypeVar("T")

VERIFIER_KINDS = ("hub", "local", "embedded", "tiny_random")

# Options whose config composes but whose implementation lands with a later issue: (what, issue, meanwhile).
PLANNED_METHODS = {
    "diversed": ("the DIVERSED learned dynamic ensemble", "issue 6", "method=static_ensemble"),
    "sd2": ("SD² decoding with a steered drafter", "issue 5", "method=sd"),
    "distill": ("decoding with a distilled drafter", "issue 5", "method=sd"),
}
PLANNED_STEERING = {"sd2": ("SD² drafter steering", "issue 5", "steering=none")}
STEERING = ("none", *PLANNED_STEERING)
GUIDE_METHODS = ("merged", "simple")
FINETUNE_DRAFTER = ("full", "none", "lora")
POOLS = ("linear", "log_linear")


class ConfigError(ValueError):
    """A config value is invalid; the one-line message names the key and the allowed values."""


class DatasetNotFoundError(ConfigError, FileNotFoundError):
    """``dataset.path`` names a file that does not exist."""


@dataclass(frozen=True)
class RunPlan:
    """The validated pieces of a decoding run, built from the config without loading any model."""

    method: str  # canonical method name ("auto" = autoregressive)
    rule: VerificationRule | None
    schedule: DraftSchedule
    settings: GenerationSettings
    batch_size: int
    verifier: ModelSpec
    drafter: ModelSpec | None  # None when no drafter is needed (method=auto)
    device: torch.device
    dtype: torch.dtype


def _checked(key: str, build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``build``; re-raise its ValueError/TypeError as a ConfigError whose message names ``key``."""
    try:
        return build(*args, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        raise ConfigError(message if key in message else f"{key}: {message}") from err


def _model_spec(node: DictConfig, key: str) -> ModelSpec:
    if OmegaConf.is_missing(node, "kind"):
        raise ConfigError(f"{key}.kind is required; allowed: {list(KINDS)}")
    fields = OmegaConf.to_container(node, resolve=True)
    if fields.get("kind") not in KINDS:
        raise ConfigError(f"{key}.kind: unknown kind {fields.get('kind')!r}; allowed: {list(KINDS)}")
    return _checked(key, ModelSpec, **fields)


def _check_source(spec: ModelSpec, key: str) -> None:
    """Checks that need no download: a path where one is needed, local dirs and the embedded GGUF exist."""
    if spec.kind in ("hub", "local") and not spec.path:
        raise ConfigError(f"{key}.path is required for kind={spec.kind!r} (a hub id or a local directory)")
    if spec.kind == "local" and not Path(spec.path).expanduser().exists():
        raise ConfigError(f"{key}.path: local model directory {spec.path!r} does not exist")
    if spec.kind == "embedded" and not (cache_root() / CACHE_SUBDIR / "config.json").is_file():
        _checked(key, embedded_gguf_path)
    if spec.kind == "early_exit" and (spec.num_layers is None or spec.num_layers < 1):
        raise ConfigError(
            f"{key}.num_layers must be an integer >= 1 for kind='early_exit', got {spec.num_layers}"
        )


def _check_dataset(node: DictConfig) -> None:
    """Dataset values, then whether its data is here (a missing local copy fails before any model loads)."""
    try:
        check_source(dataset_settings(node))
    except DatasetUnavailableError as err:
        raise DatasetNotFoundError(str(err)) from err
    except ValueError as err:
        raise ConfigError(" ".join(str(err).split())) from err


def _check_scoring(node: DictConfig) -> None:
    if node.isolation not in ISOLATIONS:
        raise ConfigError(f"scoring.isolation: unknown mode {node.isolation!r}; allowed: {list(ISOLATIONS)}")
    if node.timeout_s <= 0:
        raise ConfigError(f"scoring.timeout_s must be > 0, got {node.timeout_s}")
    if node.memory_mb < 64:
        raise ConfigError(f"scoring.memory_mb must be >= 64, got {node.memory_mb}")
    if node.workers < 1:
        raise ConfigError(f"scoring.workers must be >= 1, got {node.workers}")


def _check_file(path: str | None, key: str) -> None:
    if path and not Path(path).expanduser().exists():
        raise ConfigError(f"{key}: {path!r} does not exist (relative paths start at {Path.cwd()})")


def _check_planned_method(method: str, params: dict[str, Any]) -> None:
    """Value checks of a method that is not implemented yet (its own fields only)."""
    if method == "diversed":
        if params.get("pool") not in POOLS:
            raise ConfigError(f"method.pool: unknown pool {params.get('pool')!r}; allowed: {list(POOLS)}")
        _check_file(params.get("head_checkpoint"), "method.head_checkpoint")
    if method == "distill":
        _check_file(params.get("drafter_checkpoint"), "method.drafter_checkpoint")


def _check_steering(node: DictConfig) -> str:
    """Check the ``steering`` group (methods.md §4) and return its name."""
    steering = OmegaConf.to_container(node, resolve=True)
    name = steering["name"]
    if name not in STEERING:
        raise ConfigError(f"steering.name: unknown steering {name!r}; allowed: {list(STEERING)}")
    if name == "none":
        return name
    v_layers = steering["v_layers"]
    if len(v_layers) != 3 or min(v_layers) < 0 or sorted(set(v_layers)) != v_layers:
        raise ConfigError(
            f"steering.v_layers must be three ascending verifier layer indices >= 0 (low, mid, high), "
            f"got {v_layers}"
        )
    if steering["guide_method"] not in GUIDE_METHODS:
        raise ConfigError(
            f"steering.guide_method: unknown {steering['guide_method']!r}; allowed: {list(GUIDE_METHODS)}"
        )
    d_layers = steering["d_layers"]
    if d_layers != "all" and not (
        isinstance(d_layers, list)
        and d_layers
        and all(isinstance(i, int) and i >= 0 for i in d_layers)
        and len(set(d_layers)) == len(d_layers)
    ):
        raise ConfigError(
            f"steering.d_layers must be 'all' or a non-empty list of distinct drafter layer indices >= 0, "
            f"got {d_layers!r}"
        )
    if steering["rank"] is not None and steering["rank"] < 1:
        raise ConfigError(f"steering.rank must be >= 1 or null (full W_s), got {steering['rank']}")
    if steering["finetune_drafter"] not in FINETUNE_DRAFTER:
        raise ConfigError(
            f"steering.finetune_drafter: unknown {steering['finetune_drafter']!r}; "
            f"allowed: {list(FINETUNE_DRAFTER)}"
        )
    _check_file(steering["checkpoint"], "steering.checkpoint")
    return name


def _not_implemented(key: str, requested: str, planned: str, table: dict[str, tuple[str, str, str]]) -> str:
    what, issue, meanwhile = table[planned]
    alias = f" (alias of {planned!r})" if requested != planned else ""
    return (
        f"{key}={requested!r}{alias} selects {what}, which is not implemented yet in this version of "
        f"specbench (it lands with {issue}); the config composes and its values are valid. "
        f"Meanwhile use {meanwhile}."
    )


def _check_shards(num_shards: int, shard_id: int) -> None:
    if num_shards < 1:
        raise ConfigError(f"eval.num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ConfigError(f"eval.shard_id must be in [0, eval.num_shards={num_shards}), got {shard_id}")


def validate(cfg: DictConfig) -> RunPlan:
    """Validate a composed config (method, schedule, generation, runtime, models, dataset).

    Loads no model and reads no weights; raises ConfigError (a ValueError) naming the bad key.
    """
    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    requested = method_cfg.pop("name")
    method = METHOD_ALIASES.get(requested, requested)
    rule: VerificationRule | None = None
    if method in PLANNED_METHODS:
        _check_planned_method(method, method_cfg)
    else:
        if method not in METHODS:
            allowed = sorted({*METHODS, *PLANNED_METHODS, *METHOD_ALIASES})
            raise ConfigError(f"method.name: unknown method {requested!r}; allowed: {allowed}")
        rule = _checked("method", build_rule, method, **method_cfg)
    steering = _check_steering(cfg.steering)
    schedule = _checked("schedule", DraftSchedule, **OmegaConf.to_container(cfg.schedule, resolve=True))
    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    batch_size = gen.pop("batch_size")
    if batch_size < 1:
        raise ConfigError(f"gen.batch_size must be >= 1, got {batch_size}")
    settings = _checked("gen", GenerationSettings, **gen)
    device = _checked("runtime.device", resolve_device, cfg.runtime.device)
    dtype = _checked("runtime.dtype", resolve_dtype, cfg.runtime.dtype, device)
    if cfg.runtime.num_threads is not None and cfg.runtime.num_threads < 1:
        raise ConfigError(f"runtime.num_threads must be >= 1 or null, got {cfg.runtime.num_threads}")
    _check_shards(cfg.eval.num_shards, cfg.eval.shard_id)

    verifier = _model_spec(cfg.model.verifier, "model.verifier")
    if verifier.kind not in VERIFIER_KINDS:
        raise ConfigError(
            f"model.verifier.kind={verifier.kind!r} is only valid for a drafter; allowed: {list(VERIFIER_KINDS)}"
        )
    _check_source(verifier, "model.verifier")
    drafter: ModelSpec | None = None
    if method != "auto":
        drafter = _model_spec(cfg.model.drafter, "model.drafter")
        if drafter.kind == "none":
            raise ConfigError(
                f"method {method!r} needs a drafter but model.drafter.kind is 'none': pick a drafter "
                "(e.g. model/drafter=early-exit) or use method=auto for autoregressive decoding"
            )
        _check_source(drafter, "model.drafter")
    _check_dataset(cfg.dataset)
    _check_scoring(cfg.scoring)
    # Last, so that every other value of a preset for a planned method is checked too.
    if method in PLANNED_METHODS:
        raise ConfigError(_not_implemented("method.name", requested, method, PLANNED_METHODS))
    if steering in PLANNED_STEERING:
        raise ConfigError(_not_implemented("steering.name", steering, steering, PLANNED_STEERING))
    return RunPlan(method, rule, schedule, settings, batch_size, verifier, drafter, device, dtype)
