"""The ``steering`` group and the trained part of sd2 / distill / diversed: the checkpoint's metadata checked
against the method and the pair, and the steering values an SD² checkpoint fixes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from specbench import values
from specbench.config.checks import check_file, checked
from specbench.errors import ConfigError
from specbench.models.checkpoints import read_checkpoint_metadata
from specbench.models.spec import ModelSpec, model_name

# Methods that decode with a trained part: (checkpoint key, what trains it).
TRAINED_METHODS = {
    "sd2": ("steering.checkpoint", "task=train method=sd2 steering=sd2"),
    "distill": ("method.drafter_checkpoint", "task=train method=distill"),
    "diversed": ("method.head_checkpoint", "task=train method=diversed"),
}


STEERING = ("none", "sd2")


GUIDE_METHODS = ("merged", "simple")


FINETUNE_DRAFTER = ("full", "none", "lora")


def check_trained_method(method: str, params: dict[str, Any], steering: str, cfg: DictConfig) -> str | None:
    """Values of sd2 / distill / diversed; returns the checkpoint path (None: untrained part)."""
    if method == "diversed":
        checked("method.pool", values.check_pool, params.get("pool"))
        check_file(params.get("head_checkpoint"), "method.head_checkpoint")
        return params.get("head_checkpoint")
    if method == "distill":
        if steering != "none":
            raise ConfigError(
                "method=distill decodes with a distilled drafter and no steering; use steering=none"
            )
        if not params.get("drafter_checkpoint"):
            raise ConfigError(
                "method=distill needs method.drafter_checkpoint=PATH (the trained.pt or last.ckpt of "
                "task=train method=distill); for the pretrained drafter use method=sd"
            )
        check_file(params.get("drafter_checkpoint"), "method.drafter_checkpoint")
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
                f"steering.{key}={wanted!r} conflicts with steering.checkpoint={checkpoint!r}, which was "
                f"trained with steering.{key}={trained!r}; drop the override (the checkpoint's value is "
                "used) or train a checkpoint with it"
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


def check_steering(node: DictConfig) -> str:
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
    check_file(steering["checkpoint"], "steering.checkpoint")
    return name
