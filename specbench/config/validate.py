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

# Methods that decode with a trained part: (checkpoint key, what trains it).
TRAINED_METHODS = {
    "sd2": ("steering.checkpoint", "task=train method=sd2 steering=sd2"),
    "distill": ("method.drafter_checkpoint", "task=train method=distill"),
    "diversed": ("method.head_checkpoint", "task=train method=diversed"),
}
STEERING = ("none", "sd2")
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
    steering: dict | None = None  # the steering group when steering=sd2
    checkpoint: str | None = None  # the trained part of sd2 / distill / diversed (None: untrained)
    pool: str = "linear"  # diversed


@dataclass(frozen=True)
class TrainPlan:
    """The validated pieces of a training run (``task=train``)."""

    method: str  # sd2 | distill | diversed
    verifier: ModelSpec
    drafter: ModelSpec
    device: torch.device
    dtype: torch.dtype
    data: list[str]  # sd2 / distill: synthetic dataset dirs


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


def _hub_offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _check_source(spec: ModelSpec, key: str) -> None:
    """Checks that need no download: a path where one is needed, local dirs and the embedded GGUF exist."""
    if spec.kind in ("hub", "local") and not spec.path:
        raise ConfigError(f"{key}.path is required for kind={spec.kind!r} (a hub id or a local directory)")
    if spec.kind == "hub" and _hub_offline():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(spec.path, "config.json", revision=spec.revision), str):
            raise ConfigError(
                f"{key}.path: {spec.path!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE=1 "
                f"forbids downloading it; run `huggingface-cli download {spec.path}` where there is network "
                f"(or pass kind=local with a path to a saved copy)"
            )
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


def _check_trained_method(method: str, params: dict[str, Any], steering: str, cfg: DictConfig) -> str | None:
    """Values of sd2 / distill / diversed; returns the checkpoint path (None: untrained part)."""
    if method == "diversed":
        if params.get("pool") not in POOLS:
            raise ConfigError(f"method.pool: unknown pool {params.get('pool')!r}; allowed: {list(POOLS)}")
        _check_file(params.get("head_checkpoint"), "method.head_checkpoint")
        return params.get("head_checkpoint")
    if method == "distill":
        if steering != "none":
            raise ConfigError("method=distill decodes with a distilled drafter and no steering; use steering=none")
        if not params.get("drafter_checkpoint"):
            raise ConfigError(
                "method=distill needs method.drafter_checkpoint=PATH (the trained.pt or last.ckpt of "
                "task=train method=distill); for the pretrained drafter use method=sd"
            )
        _check_file(params.get("drafter_checkpoint"), "method.drafter_checkpoint")
        return params.get("drafter_checkpoint")
    if steering != "sd2":
        raise ConfigError(
            "method=sd2 decodes with an SD²-steered drafter: add steering=sd2 and "
            "steering.checkpoint=PATH (from task=train method=sd2 steering=sd2)"
        )
    return cfg.steering.checkpoint


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


def _check_runtime(cfg: DictConfig) -> tuple[torch.device, torch.dtype]:
    device = _checked("runtime.device", resolve_device, cfg.runtime.device)
    dtype = _checked("runtime.dtype", resolve_dtype, cfg.runtime.dtype, device)
    if cfg.runtime.num_threads is not None and cfg.runtime.num_threads < 1:
        raise ConfigError(f"runtime.num_threads must be >= 1 or null, got {cfg.runtime.num_threads}")
    return device, dtype


def _verifier_spec(cfg: DictConfig) -> ModelSpec:
    verifier = _model_spec(cfg.model.verifier, "model.verifier")
    if verifier.kind not in VERIFIER_KINDS:
        raise ConfigError(
            f"model.verifier.kind={verifier.kind!r} is only valid for a drafter; allowed: {list(VERIFIER_KINDS)}"
        )
    _check_source(verifier, "model.verifier")
    return verifier


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
    steering = _check_steering(cfg.steering)
    checkpoint = None
    if method in TRAINED_METHODS:
        checkpoint = _check_trained_method(method, method_cfg, steering, cfg)
        rule = VerificationRule() if method != "diversed" else None  # diversed: built with its head
    else:
        if method not in METHODS:
            allowed = sorted({*METHODS, *TRAINED_METHODS, *METHOD_ALIASES})
            raise ConfigError(f"method.name: unknown method {requested!r}; allowed: {allowed}")
        rule = _checked("method", build_rule, method, **method_cfg)
    schedule = _checked("schedule", DraftSchedule, **OmegaConf.to_container(cfg.schedule, resolve=True))
    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    batch_size = gen.pop("batch_size")
    if batch_size < 1:
        raise ConfigError(f"gen.batch_size must be >= 1, got {batch_size}")
    settings = _checked("gen", GenerationSettings, **gen)
    device, dtype = _check_runtime(cfg)
    _check_shards(cfg.eval.num_shards, cfg.eval.shard_id)

    verifier = _verifier_spec(cfg)
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
    steering_node = OmegaConf.to_container(cfg.steering, resolve=True) if steering != "none" else None
    if steering_node is not None and drafter is None:
        raise ConfigError("steering=sd2 steers a drafter, but method=auto has none; use method=sd2")
    return RunPlan(
        method, rule, schedule, settings, batch_size, verifier, drafter, device, dtype,
        steering=steering_node, checkpoint=checkpoint, pool=method_cfg.get("pool", "linear"),
    )


TRAIN_LOSSES = ("kl", "rkl", "tvd")
TRAIN_OFFSETS = ("random", "blocked")
REGULARIZERS = ("tv", "l2")


def _check_train_values(train: dict[str, Any]) -> None:
    positive = ("max_steps", "batch_size", "accumulate_grad_batches", "max_offset", "val_every_steps",
                "checkpoint_every_steps", "lora_rank", "lora_alpha", "rollouts_per_prompt")
    for key in positive:
        if train[key] < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {train[key]}")
    for key in ("warmup_steps", "val_batches", "val_prompts", "num_workers", "weight_decay", "grad_clip",
                "lr_end", "regularizer_weight", "rollout_temperature"):
        if train[key] < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {train[key]}")
    if train["lr_start"] <= 0:
        raise ConfigError(f"train.lr_start must be > 0, got {train['lr_start']}")
    if train["lr_end"] > train["lr_start"]:
        raise ConfigError(f"train.lr_end ({train['lr_end']}) must be <= train.lr_start ({train['lr_start']})")
    for key, allowed in (("loss", TRAIN_LOSSES), ("offset", TRAIN_OFFSETS), ("regularizer", REGULARIZERS)):
        if train[key] not in allowed:
            raise ConfigError(f"train.{key}: unknown {train[key]!r}; allowed: {list(allowed)}")
    if not 0.0 <= train["baseline_ema"] < 1.0:
        raise ConfigError(f"train.baseline_ema must be in [0, 1), got {train['baseline_ema']}")
    if not 0.0 <= train["target_weight"] <= 1.0:
        raise ConfigError(f"train.target_weight must be in [0, 1], got {train['target_weight']}")


def data_paths(value: Any) -> list[str]:
    """``train.data``: one path, a comma-separated string, or a list."""
    if value is None:
        return []
    items = value if isinstance(value, (list, tuple)) else str(value).split(",")
    return [str(Path(str(item).strip()).expanduser()) for item in items if str(item).strip()]


def validate_train(cfg: DictConfig) -> TrainPlan:
    """Validate ``task=train`` (method sd2 | distill | diversed) before any model loads."""
    requested = cfg.method.name
    method = METHOD_ALIASES.get(requested, requested)
    if method not in TRAINED_METHODS:
        raise ConfigError(
            f"task=train trains method=sd2, distill or diversed; method={requested!r} has nothing to train"
        )
    steering = _check_steering(cfg.steering)
    train = OmegaConf.to_container(cfg.train, resolve=True)
    _check_train_values(train)
    if method == "sd2" and steering != "sd2":
        raise ConfigError("task=train method=sd2 trains an SD² steering head: add steering=sd2")
    if method != "sd2" and steering != "none":
        raise ConfigError(f"task=train method={method} trains no steering; use steering=none")
    if method == "distill" and cfg.steering.finetune_drafter == "none":
        raise ConfigError(
            "task=train method=distill with steering.finetune_drafter=none would train nothing; use full or lora"
        )
    if method == "diversed" and cfg.method.pool not in POOLS:
        raise ConfigError(f"method.pool: unknown pool {cfg.method.pool!r}; allowed: {list(POOLS)}")
    data = data_paths(train["data"])
    if method in ("sd2", "distill"):
        if not data:
            raise ConfigError(
                f"task=train method={method} needs train.data=DIR (the output dir of task=synth; several "
                "shard dirs comma separated)"
            )
        for path in data:
            _check_file(path, "train.data")
    else:
        _check_dataset(cfg.dataset)
        _check_scoring(cfg.scoring)
    device, dtype = _check_runtime(cfg)
    verifier = _verifier_spec(cfg)
    drafter = _model_spec(cfg.model.drafter, "model.drafter")
    if drafter.kind == "none":
        raise ConfigError(f"task=train method={method} trains with a drafter; model.drafter.kind is 'none'")
    _check_source(drafter, "model.drafter")
    return TrainPlan(method, verifier, drafter, device, dtype, data)


def validate_synth(cfg: DictConfig) -> RunPlan:
    """Validate a ``task=synth`` config (``synth.*``, verifier, dataset, runtime); loads no model.

    The plan samples from the verifier alone (method ``auto``, no drafter); ``settings.max_new_tokens``
    is the most a row can get (``synth.target_len - 1``). Raises ConfigError naming the bad key.
    """
    from specbench.data.synthetic import SynthSettings

    synth = _checked("synth", SynthSettings.from_config, cfg.synth)
    settings = _checked(
        "synth",
        GenerationSettings,
        max_new_tokens=synth.target_len - 1,
        temperature=synth.temperature,
        top_k=synth.top_k,
        top_p=synth.top_p,
        seed=synth.seed,
    )
    device, dtype = _check_runtime(cfg)
    verifier = _verifier_spec(cfg)
    _check_dataset(cfg.dataset)
    return RunPlan("auto", None, DraftSchedule(), settings, synth.batch_size, verifier, None, device, dtype)
