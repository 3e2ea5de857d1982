"""Check a composed config before any model is loaded, and turn it into library objects."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import torch
from omegaconf import DictConfig, OmegaConf

from specbench.data.prompts import DATASETS
from specbench.decoding.engine import GenerationSettings
from specbench.decoding.methods import build_rule, canonical_method
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.embedded import CACHE_SUBDIR, cache_root, embedded_gguf_path
from specbench.models.loading import KINDS, ModelSpec

T = TypeVar("T")

VERIFIER_KINDS = ("hub", "local", "embedded", "tiny_random")


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
    if node.name not in DATASETS:
        raise ConfigError(f"dataset.name: unknown dataset {node.name!r}; allowed: {list(DATASETS)}")
    if node.limit is not None and node.limit < 1:
        raise ConfigError(f"dataset.limit must be >= 1 or null, got {node.limit}")
    if node.name != "jsonl":
        return
    if OmegaConf.is_missing(node, "path") or not node.path:
        raise ConfigError("dataset.path is required for dataset=jsonl: pass dataset.path=FILE.jsonl")
    if not Path(node.path).expanduser().is_file():
        raise DatasetNotFoundError(
            f"dataset.path: file {node.path!r} does not exist (relative paths start at {Path.cwd()}); "
            "pass dataset.path=FILE with a jsonl file whose rows have 'prompt' or 'turns'"
        )


def validate(cfg: DictConfig) -> RunPlan:
    """Validate a composed config (method, schedule, generation, runtime, models, dataset).

    Loads no model and reads no weights; raises ConfigError (a ValueError) naming the bad key.
    """
    method_cfg = OmegaConf.to_container(cfg.method, resolve=True)
    method = _checked("method.name", canonical_method, method_cfg.pop("name"))
    rule = _checked("method", build_rule, method, **method_cfg)
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
    return RunPlan(method, rule, schedule, settings, batch_size, verifier, drafter, device, dtype)
