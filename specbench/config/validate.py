"""Check a composed config before any model loads, without importing torch, and turn it into a run plan.

:func:`validate`, :func:`validate_train` and :func:`validate_synth` import neither torch nor transformers,
so a bad value is reported within a second or two. Their plans build the library objects (rule, schedule,
generation settings, device, dtype) on first use; :meth:`RunPlan.resolve` builds them all at once (it
imports torch) and turns what only torch can tell (e.g. no CUDA) into a ConfigError.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from omegaconf import DictConfig, OmegaConf, open_dict

from specbench import values
from specbench.config.draft_vocab import check_draft_vocab, trained_vocab_spec
from specbench.config.methods import UnknownMethodError, normalize_method
from specbench.data.dataset_config import dataset_settings
from specbench.data.dataset_sources import DatasetUnavailableError, check_source
from specbench.errors import ConfigError, DatasetNotFoundError
from specbench.method_names import METHODS
from specbench.models.checkpoints import read_checkpoint_metadata
from specbench.models.embedded import CACHE_SUBDIR, cache_root, embedded_gguf_path
from specbench.models.spec import KINDS, ModelSpec, model_name
from specbench.scoring.sandbox import ISOLATIONS

if TYPE_CHECKING:
    import torch

    from specbench.decoding.engine import GenerationSettings
    from specbench.decoding.rules import VerificationRule
    from specbench.decoding.schedules import DraftSchedule

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
POOLS = values.POOLS


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
        if self.method in ("sd2", "distill", "eagle3"):
            from specbench.decoding.rules import VerificationRule

            return VerificationRule()
        if self.method == "diversed":
            return None
        if self.rule_params.get("target"):
            from specbench.decoding.methods import build_target_rule

            return _checked("method", build_target_rule, self.rule_params["target"], self.rule_params["params"])
        from specbench.decoding.methods import build_rule

        return _checked("method", build_rule, self.method, **self.rule_params)

    @cached_property
    def schedule(self) -> DraftSchedule:
        from specbench.decoding.schedules import DraftSchedule

        params = {k: v for k, v in self.schedule_params.items() if k != "profile"}
        return _checked("schedule", DraftSchedule, **params)

    @cached_property
    def settings(self) -> GenerationSettings:
        from specbench.decoding.engine import GenerationSettings

        return _checked("gen", GenerationSettings, **self.gen_params)

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

    return _checked("runtime.device", resolve_device, name)


def _dtype(name: str, device: torch.device) -> torch.dtype:
    from specbench.models.devices import resolve_dtype

    return _checked("runtime.dtype", resolve_dtype, name, device)


def _checked(key: str, build: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call ``build``; re-raise its ValueError/TypeError as a ConfigError whose message names ``key``."""
    try:
        return build(*args, **kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as err:
        message = " ".join(str(err).split())
        raise ConfigError(message if key in message else f"{key}: {message}") from err


def _model_spec(node: DictConfig, key: str, tp_plan: str | None = None) -> ModelSpec:
    from specbench.models.sharding import Placement

    if OmegaConf.is_missing(node, "kind"):
        raise ConfigError(f"{key}.kind is required; allowed: {list(KINDS)}")
    fields = OmegaConf.to_container(node, resolve=True)
    if fields.get("kind") not in KINDS:
        raise ConfigError(f"{key}.kind: unknown kind {fields.get('kind')!r}; allowed: {list(KINDS)}")
    spec = _checked(key, ModelSpec, **fields)
    _checked(key, Placement.of, spec, tp_plan, key)  # device_map / max_memory / offload_folder / tp_plan
    return spec


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
        _checked("method.pool", values.check_pool, params.get("pool"))
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


def check_checkpoint(path: str, key: str, method: str, verifier: ModelSpec, drafter: ModelSpec) -> dict:
    """The metadata of a trained checkpoint, read without torch, checked against the method and the pair.

    A checkpoint of another method, or made for a verifier / drafter of another name, is a ConfigError
    before any model loads (the loader later also compares tokenizers, hidden sizes and weights).
    """
    try:
        metadata = read_checkpoint_metadata(path)
    except FileNotFoundError as err:
        raise ConfigError(f"{key}: {err}") from err
    except ValueError as err:
        raise ConfigError(f"{key}: {err}") from err
    trained = metadata.get("method")
    if trained != method:
        raise ConfigError(
            f"{key}={path!r} is a method={trained!r} checkpoint, not method={method!r}; evaluate it with "
            f"method={trained} or pass a checkpoint of `{TRAINED_METHODS[method][1]}`"
        )
    verifier_name = model_name(verifier)
    now = {"verifier": verifier_name, "drafter": model_name(drafter, verifier_name)}
    if any(k in metadata and metadata[k] != v for k, v in now.items()):
        raise ConfigError(
            f"{key}={path!r} was trained for verifier {metadata.get('verifier')!r} + drafter "
            f"{metadata.get('drafter')!r}, not for model.verifier {now['verifier']!r} + model.drafter "
            f"{now['drafter']!r}; pick the model/verifier and model/drafter it was trained with, or train "
            f"one for this pair (`{TRAINED_METHODS[method][1]}`)"
        )
    return metadata


# Steering values a trained SD² checkpoint fixes (its weights were trained for them).
CHECKPOINT_STEERING_KEYS = ("v_layers", "guide_method", "d_layers", "rank", "finetune_drafter")


def _command_line_keys() -> set[str]:
    """The config keys set by this run's command-line overrides (empty outside a Hydra run)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return set()
    keys = set()
    for override in HydraConfig.get().overrides.task:
        key = override.split("=", 1)[0].lstrip("+~")
        keys.add(key)
    return keys


def adopt_checkpoint_steering(cfg: DictConfig, metadata: dict, checkpoint: str) -> dict[str, Any]:
    """Make ``cfg.steering`` say what the SD² ``checkpoint`` decodes with, so that what is recorded (the
    config MLflow logs, the run dir's ``.hydra/config.yaml``) is what runs.

    A value set on the command line that differs from the checkpoint's is a ConfigError (the weights were
    trained for the checkpoint's); a value the user did not set is replaced by the checkpoint's.
    Returns the replaced values (key -> checkpoint value).
    """
    fixed = dict(metadata.get("steering") or {})
    if "finetune_drafter" in metadata:
        fixed["finetune_drafter"] = metadata["finetune_drafter"]
    explicit = _command_line_keys()
    adopted: dict[str, Any] = {}
    for key in CHECKPOINT_STEERING_KEYS:
        if key not in fixed:
            continue
        wanted, trained = OmegaConf.to_container(cfg.steering, resolve=True).get(key), fixed[key]
        if key == "d_layers" and wanted == "all" and f"steering.{key}" in explicit:
            continue  # "all" resolves against the drafter's depth, which only the loaded model knows
        if wanted == trained:
            continue
        if f"steering.{key}" in explicit:
            raise ConfigError(
                f"steering.{key}={wanted!r} conflicts with steering.checkpoint={checkpoint!r}, which was trained "
                f"with steering.{key}={trained!r}; drop the override (the checkpoint's value is used) or train a "
                "checkpoint with it"
            )
        adopted[key] = trained
    if adopted:
        with open_dict(cfg.steering):
            for key, value in adopted.items():
                cfg.steering[key] = value
        _rewrite_hydra_record(cfg)
    return adopted


def _rewrite_hydra_record(cfg: DictConfig) -> None:
    """Rewrite the run dir's ``.hydra/config.yaml`` (written by Hydra before the task ran) with ``cfg``."""
    from hydra.core.hydra_config import HydraConfig

    if HydraConfig.initialized():
        record = Path(HydraConfig.get().runtime.output_dir) / HydraConfig.get().output_subdir / "config.yaml"
        if record.parent.is_dir():
            OmegaConf.save(cfg, record)


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


def _check_runtime(cfg: DictConfig) -> tuple[str, str]:
    """``runtime.*`` values; the device's availability is checked when the plan resolves (torch)."""
    _checked("runtime.device", values.check_device, cfg.runtime.device)
    _checked("runtime.dtype", values.check_dtype, cfg.runtime.dtype)
    if cfg.runtime.num_threads is not None and cfg.runtime.num_threads < 1:
        raise ConfigError(f"runtime.num_threads must be >= 1 or null, got {cfg.runtime.num_threads}")
    return str(cfg.runtime.device), str(cfg.runtime.dtype)


def _verifier_spec(cfg: DictConfig) -> ModelSpec:
    verifier = _model_spec(cfg.model.verifier, "model.verifier", cfg.runtime.get("tp_plan"))
    if verifier.kind not in VERIFIER_KINDS:
        raise ConfigError(
            f"model.verifier.kind={verifier.kind!r} is only valid for a drafter; allowed: {list(VERIFIER_KINDS)}"
        )
    _check_source(verifier, "model.verifier")
    check_draft_vocab(verifier, "model.verifier", None)
    return verifier


def _check_shards(num_shards: int, shard_id: int) -> None:
    if num_shards < 1:
        raise ConfigError(f"eval.num_shards must be >= 1, got {num_shards}")
    if not 0 <= shard_id < num_shards:
        raise ConfigError(f"eval.shard_id must be in [0, eval.num_shards={num_shards}), got {shard_id}")


# Methods that decode with a transformers-model drafter (the trained part is a model or steers one).
MODEL_DRAFTER_METHODS = ("sd2", "distill")


def _check_plugin_drafter(drafter: ModelSpec, method: str, method_cfg: dict[str, Any]) -> None:
    """A ``kind: drafter`` drafter: its target and params, and whether the method's rule can verify it.
    Imports the target's module (and so torch)."""
    from specbench.drafters.build import check_drafter_spec, is_deterministic

    if method in MODEL_DRAFTER_METHODS:
        raise ConfigError(
            f"method={method} trains or steers a transformers-model drafter; model.drafter.target="
            f"{drafter.target!r} is not one (pick e.g. model/drafter=early-exit)"
        )
    if method == "eagle3" and not str(drafter.target).startswith("specbench.drafters.eagle3"):
        raise ConfigError("method=eagle3 decodes with an EAGLE-3 head: add model/drafter=eagle3")
    params = dict(drafter.params or {})
    if str(drafter.target).startswith("specbench.drafters.eagle3") and not params.get("path"):
        raise ConfigError(
            "model.drafter.params.path is null: pass the trained.pt of `task=train method=eagle3`, an EAGLE / "
            "SpecForge checkpoint directory or a hub id (the head to decode with)"
        )
    if str(drafter.target).startswith("specbench.drafters.eagle3"):
        from specbench.drafters.eagle3_format import looks_like_file, resolve_head_path

        head = resolve_head_path(params["path"])
        if looks_like_file(head) and not Path(head).exists():
            raise ConfigError(
                f"model.drafter.params.path={params['path']!r}: no such file (a trained.pt of `task=train "
                "method=eagle3`, relative to the working directory or the project root)"
            )
    _check_tree_width(params.get("tree_width", 1), method, method_cfg, "model.drafter.params.tree_width")
    factory = _checked("model.drafter", check_drafter_spec, drafter.target, params)
    if method == "diversed" and is_deterministic(factory):
        raise ConfigError(
            f"method=diversed pools the drafter's distribution q and reads its hidden states, but "
            f"model.drafter.target={drafter.target!r} proposes tokens without either; use a model drafter or an "
            "EAGLE-3 head (model/drafter=eagle3-smollm2)"
        )
    if is_deterministic(factory) and (method in METHODS or method_cfg.get("target")) and method != "auto":
        from specbench.decoding.methods import build_rule, build_target_rule

        rule = (
            _checked("method", build_target_rule, method_cfg["target"], method_cfg.get("params"))
            if method_cfg.get("target")
            else _checked("method", build_rule, method, **method_cfg)
        )
        if not rule.accepts_deterministic:
            raise ConfigError(
                f"method={method} needs the drafter's distribution q, but model.drafter.target={drafter.target!r} "
                "proposes tokens without one; use method=sd, block, lossy, typical or fly, or a model drafter"
            )


# Methods that verify with the exact sd rule (the trained ones steer or replace the drafter only).
EXACT_RULE_METHODS = ("sd", "sd2", "distill", "eagle3")


def _check_tree_width(width: Any, method: str, method_cfg: dict[str, Any], key: str) -> None:
    _checked(key, values.check_tree_width, width, key)
    if width > 1 and (method not in (*EXACT_RULE_METHODS, "auto") or method_cfg.get("target")):
        raise ConfigError(
            f"{key}={width}: trees of drafts are verified by the exact sd rule only, not method={method}; use "
            "method=sd, or tree_width=1 for a chain"
        )


def _method(cfg: DictConfig) -> tuple[str, str | None]:
    try:
        return normalize_method(cfg)
    except UnknownMethodError as err:
        raise ConfigError(str(err)) from err


def validate(cfg: DictConfig) -> RunPlan:
    """Validate a composed config (method, schedule, generation, runtime, models, dataset), torch-free.

    Rewrites ``cfg.method`` into its canonical form first (an alias becomes ``name`` + ``alias``, unset
    parameters take the method's defaults: specbench/config/methods.py), so what is recorded is what runs.
    Loads no model and reads no weights (a checkpoint's metadata only); raises ConfigError naming the bad key.
    """
    method, alias = _method(cfg)
    method_node = OmegaConf.to_container(cfg.method, resolve=True)
    method_cfg = {k: v for k, v in method_node.items() if k not in ("name", "alias")}
    steering = _check_steering(cfg.steering)
    checkpoint = None
    if method_cfg.get("target"):
        from specbench.decoding.methods import build_target_rule  # imports torch, as a plugin drafter does

        _checked("method", build_target_rule, method_cfg["target"], method_cfg.get("params"))
    elif method in TRAINED_METHODS:
        checkpoint = _check_trained_method(method, method_cfg, steering, cfg)
    elif method in METHODS:
        _checked("method", values.check_rule_params, method, method_cfg)
    schedule = OmegaConf.to_container(cfg.schedule, resolve=True)
    _checked("schedule", values.check_schedule, **schedule)
    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    batch_size = gen.pop("batch_size")
    if batch_size < 1:
        raise ConfigError(f"gen.batch_size must be >= 1, got {batch_size}")
    _checked("gen", values.check_generation, **gen)
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
        if method in ("distill", "sd2"):
            drafter = trained_vocab_spec(drafter, checkpoint, TRAINED_METHODS[method][0])
        check_draft_vocab(drafter, "model.drafter", verifier)
        if drafter.kind == "drafter":
            _check_plugin_drafter(drafter, method, method_cfg)
        else:
            _check_tree_width(drafter.tree_width, method, method_cfg, "model.drafter.tree_width")
        if drafter.kind != "drafter" and method == "eagle3":
            raise ConfigError("method=eagle3 decodes with an EAGLE-3 head: add model/drafter=eagle3")
    if schedule["name"] == "cost_aware":
        _check_file(schedule.get("profile"), "schedule.profile")
    if checkpoint:
        metadata = check_checkpoint(checkpoint, TRAINED_METHODS[method][0], method, verifier, drafter)
        if method == "sd2":
            adopt_checkpoint_steering(cfg, metadata, checkpoint)
    _check_dataset(cfg.dataset)
    _check_scoring(cfg.scoring)
    steering_node = OmegaConf.to_container(cfg.steering, resolve=True) if steering != "none" else None
    if steering_node is not None and drafter is None:
        raise ConfigError("steering=sd2 steers a drafter, but method=auto has none; use method=sd2")
    return RunPlan(
        method, method_cfg, schedule, gen, batch_size, verifier, drafter, device, dtype,
        steering=steering_node, checkpoint=checkpoint, pool=method_cfg.get("pool") or "linear", alias=alias,
    )




def _check_train_values(train: dict[str, Any]) -> None:
    positive = ("max_steps", "batch_size", "accumulate_grad_batches", "max_offset", "val_every_steps",
                "checkpoint_every_steps", "lora_rank", "lora_alpha", "rollouts_per_prompt")
    for key in positive:
        if train[key] < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {train[key]}")
    for key in ("warmup_steps", "val_batches", "val_prompts", "num_workers", "weight_decay", "grad_clip",
                "lr_end", "regularizer_weight", "reward_weight", "rollout_temperature"):
        if train[key] < 0:
            raise ConfigError(f"train.{key} must be >= 0, got {train[key]}")
    if train["lr_start"] <= 0:
        raise ConfigError(f"train.lr_start must be > 0, got {train['lr_start']}")
    if train["lr_end"] > train["lr_start"]:
        raise ConfigError(f"train.lr_end ({train['lr_end']}) must be <= train.lr_start ({train['lr_start']})")
    for key, allowed in (("loss", values.TRAIN_LOSSES), ("offset", values.TRAIN_OFFSETS),
                         ("regularizer", values.DIVERSED_REGULARIZERS), ("reward", values.DIVERSED_REWARDS)):
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
    method, alias = _method(cfg)
    if method not in (*TRAINED_METHODS, "eagle3"):
        raise ConfigError(
            f"task=train trains method=sd2, distill, diversed or eagle3; method={requested!r} has nothing to train"
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
    if method == "diversed":
        _checked("method.pool", values.check_pool, cfg.method.pool)
    data = data_paths(train["data"])
    if method == "eagle3":
        _check_eagle3_training(cfg, train)
    if method in ("sd2", "distill", "eagle3"):
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
        metric = dataset_settings(cfg.dataset).metric or "none"
        if metric == "none" and cfg.train.reward == "task":
            raise ConfigError(
                f"dataset.metric: DIVERSED training needs a per-sample reward, but dataset={cfg.dataset.name} "
                "has metric 'none'; use a dataset with references (cnndm, xsum, wmt, gsm8k, humaneval, mbpp, "
                "spec_bench translation/math_reasoning), set dataset.metric, or train on the verifier's "
                "likelihood (train.reward=verifier_logp)"
            )
    device, dtype = _check_runtime(cfg)
    verifier = _verifier_spec(cfg)
    drafter = _model_spec(cfg.model.drafter, "model.drafter")
    if drafter.kind == "none":
        raise ConfigError(f"task=train method={method} trains with a drafter; model.drafter.kind is 'none'")
    _check_source(drafter, "model.drafter")
    if method in ("sd2", "distill"):
        check_draft_vocab(drafter, "model.drafter", verifier)  # trains over it (docs/draft-vocab.md)
        _check_feature_keys(train)
        if train["feature_top_k"] is not None and train["loss"] == "rkl":
            raise ConfigError(values.TOP_K_RKL)
    elif drafter.draft_vocab_size is not None or drafter.draft_vocab is not None:
        raise ConfigError(
            "model.drafter.draft_vocab_size / draft_vocab reduce a model drafter's vocabulary (task=train "
            f"method=distill|sd2 trains over it); method={method} does not (EAGLE-3: train.draft_vocab_size): "
            "drop them here"
        )
    if method == "diversed" and drafter.kind == "drafter":
        _check_plugin_drafter(drafter, method, OmegaConf.to_container(cfg.method, resolve=True))
    elif method != "eagle3" and drafter.kind == "drafter":
        raise ConfigError(
            f"task=train method={method} trains a transformers-model drafter; model.drafter.target="
            f"{drafter.target!r} is not one (pick e.g. model/drafter=early-exit)"
        )
    return TrainPlan(method, verifier, drafter, device, dtype, data, alias=alias)


def _check_eagle3_training(cfg: DictConfig, train: dict[str, Any]) -> None:
    drafter = cfg.model.drafter
    if drafter.kind != "drafter" or not str(drafter.get("target")).startswith("specbench.drafters.eagle3"):
        raise ConfigError("task=train method=eagle3 trains an EAGLE-3 head: add model/drafter=eagle3")
    if (drafter.get("params") or {}).get("path"):
        raise ConfigError(
            "task=train method=eagle3 trains a new head; model.drafter.params.path must be null (it names a "
            "trained head to decode with)"
        )
    if cfg.steering.name != "none":
        raise ConfigError("task=train method=eagle3 trains no steering; use steering=none")
    if train["ttt_steps"] < 1:
        raise ConfigError(f"train.ttt_steps must be >= 1, got {train['ttt_steps']}")
    if not 0.0 < train["ttt_chain_fraction"] <= 1.0:
        raise ConfigError(f"train.ttt_chain_fraction must be in (0, 1], got {train['ttt_chain_fraction']}")
    if not 0.0 < train["loss_decay"] <= 1.0:
        raise ConfigError(f"train.loss_decay must be in (0, 1], got {train['loss_decay']}")
    if train["draft_vocab_size"] is not None and train["draft_vocab_size"] < 1:
        raise ConfigError(f"train.draft_vocab_size must be >= 1 or null, got {train['draft_vocab_size']}")
    _check_feature_keys(train)
    if train["init_layer"] not in values.EAGLE3_INIT_LAYERS:
        raise ConfigError(
            f"train.init_layer must be one of {list(values.EAGLE3_INIT_LAYERS)}, got {train['init_layer']!r}"
        )
    if train["init_head"] is not None:
        if train["init_layer"] != "random":
            raise ConfigError(
                "train.init_head and train.init_layer both set the head's starting weights; drop one"
            )
        if not Path(str(train["init_head"])).expanduser().is_file():
            raise ConfigError(
                f"train.init_head: {train['init_head']!r} is not a file; pass the trained.pt or last.ckpt "
                "of an earlier task=train method=eagle3 run"
            )


def _check_feature_keys(train: dict[str, Any]) -> None:
    """train.feature_top_k / feature_batch_size (the verifier-feature cache and its targets)."""
    if train["feature_top_k"] is not None and train["feature_top_k"] < 1:
        raise ConfigError(f"train.feature_top_k must be >= 1 or null, got {train['feature_top_k']}")
    if train["feature_batch_size"] < 1:
        raise ConfigError(f"train.feature_batch_size must be >= 1, got {train['feature_batch_size']}")


def validate_synth(cfg: DictConfig) -> RunPlan:
    """Validate a ``task=synth`` config (``synth.*``, verifier, dataset, runtime); loads no model.

    The plan samples from the verifier alone (method ``auto``, no drafter); ``settings.max_new_tokens``
    is the most a row can get (``synth.target_len - 1``). Raises ConfigError naming the bad key.
    """
    from specbench.pipelines.synthesize import SynthSettings

    synth = _checked("synth", SynthSettings.from_config, cfg.synth)
    gen = {
        "max_new_tokens": synth.target_len - 1,
        "temperature": synth.temperature,
        "top_k": synth.top_k,
        "top_p": synth.top_p,
        "seed": synth.seed,
    }
    _checked("synth", values.check_generation, **gen)
    device, dtype = _check_runtime(cfg)
    verifier = _verifier_spec(cfg)
    _check_dataset(cfg.dataset)
    return RunPlan("auto", {}, {}, gen, synth.batch_size, verifier, None, device, dtype)
