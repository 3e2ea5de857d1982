"""The ``train`` group: :func:`validate_train` checks a ``task=train`` config (sd2, distill, diversed,
eagle3, dflash) before any model loads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specbench import values
from specbench.config.checks import (
    check_dataset,
    check_file,
    check_runtime,
    check_scoring,
    checked,
    method_of,
)
from specbench.config.draft_vocab import check_draft_vocab
from specbench.config.model_checks import check_model_source, check_plugin_drafter, model_spec, verifier_spec
from specbench.config.plans import TrainPlan
from specbench.config.steering_checks import TRAINED_METHODS, check_steering
from specbench.data.dataset_config import dataset_settings
from specbench.errors import ConfigError


def _check_train_values(train: dict[str, Any], method: str) -> None:
    budgeted = [k for k in ("data_tokens", "drop_heldout_overlap") if train[k] not in (None, False)]
    if budgeted and method not in ("eagle3", "dflash"):
        raise ConfigError(f"train.{budgeted[0]} chooses rows for method=eagle3 or dflash, not {method}")
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
                         ("regularizer", values.DIVERSED_REGULARIZERS), ("reward", values.TRAIN_REWARDS)):
        if train[key] not in allowed:
            raise ConfigError(f"train.{key}: unknown {train[key]!r}; allowed: {list(allowed)}")
    if train["select_by"] is not None and not str(train["select_by"]).startswith("val/"):
        raise ConfigError(
            f"train.select_by must name a validation metric (val/..., e.g. val/tau_estimate), got "
            f"{train['select_by']!r}"
        )
    if train["data_tokens"] is not None and train["data_tokens"] < 1:
        raise ConfigError(f"train.data_tokens must be >= 1 or null (every row), got {train['data_tokens']}")
    if train["select_mode"] not in ("max", "min"):
        raise ConfigError(f"train.select_mode must be max or min, got {train['select_mode']!r}")
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
    """Validate ``task=train`` (method sd2 | distill | diversed | eagle3 | dflash) before any model loads."""
    requested = cfg.method.name
    method, alias = method_of(cfg)
    if method not in (*TRAINED_METHODS, "eagle3", "dflash"):
        raise ConfigError(
            f"task=train trains method=sd2, distill, diversed, eagle3 or dflash; method={requested!r} has "
            "nothing to train"
        )
    steering = check_steering(cfg.steering)
    train = OmegaConf.to_container(cfg.train, resolve=True)
    _check_train_values(train, method)
    if method == "sd2" and steering != "sd2":
        raise ConfigError("task=train method=sd2 trains an SD² steering head: add steering=sd2")
    if method != "sd2" and steering != "none":
        raise ConfigError(f"task=train method={method} trains no steering; use steering=none")
    if method == "distill" and cfg.steering.finetune_drafter == "none":
        raise ConfigError(
            "task=train method=distill with steering.finetune_drafter=none would train nothing; "
            "use full or lora"
        )
    if method == "diversed":
        checked("method.pool", values.check_pool, cfg.method.pool)
    data = data_paths(train["data"])
    if method == "eagle3":
        _check_eagle3_training(cfg, train)
    if method == "dflash":
        _check_dflash_training(cfg, train)
    if method in ("eagle3", "dflash") and cfg.method.get("objective") == "opd" and not train["init_head"]:
        raise ConfigError(
            f"method={method}_opd distils on-policy from an SFT-trained {method} drafter: set "
            f"train.init_head=<the trained.pt of a task=train method={method} run>"
        )
    if method in ("sd2", "distill", "eagle3", "dflash"):
        if not data:
            raise ConfigError(
                f"task=train method={method} needs train.data=DIR (the output dir of task=synth; several "
                "shard dirs comma separated)"
            )
        for path in data:
            check_file(path, "train.data")
    else:
        check_dataset(cfg.dataset)
        check_scoring(cfg.scoring)
        metric = dataset_settings(cfg.dataset).metric or "none"
        cfg.train.reward = resolved_reward(cfg)  # auto: recorded as what runs (config.yaml, MLflow params)
        if metric == "none" and cfg.train.reward == "task":
            raise ConfigError(
                "dataset.metric: DIVERSED training needs a per-sample reward, but "
                f"dataset={cfg.dataset.name} has metric 'none'; use a dataset with references (cnndm, xsum, "
                "wmt, gsm8k, humaneval, mbpp, spec_bench translation/math_reasoning), set dataset.metric, or "
                "train on the verifier's "
                "likelihood (train.reward=verifier_logp)"
            )
    device, dtype = check_runtime(cfg)
    verifier = verifier_spec(cfg)
    drafter = model_spec(cfg.model.drafter, "model.drafter")
    if drafter.kind == "none":
        raise ConfigError(f"task=train method={method} trains with a drafter; model.drafter.kind is 'none'")
    check_model_source(drafter, "model.drafter")
    if method in ("sd2", "distill"):
        check_draft_vocab(drafter, "model.drafter", verifier)  # trains over it (docs/draft-vocab.md)
        _check_feature_keys(train)
        if train["feature_top_k"] is not None and train["loss"] == "rkl":
            raise ConfigError(values.TOP_K_RKL)
    elif drafter.draft_vocab_size is not None or drafter.draft_vocab is not None:
        raise ConfigError(
            "model.drafter.draft_vocab_size / draft_vocab reduce a model drafter's vocabulary (task=train "
            f"method=distill|sd2 trains over it); method={method} does not (EAGLE-3: "
            "train.draft_vocab_size): drop them here"
        )
    if method == "diversed" and drafter.kind == "drafter":
        check_plugin_drafter(drafter, method, OmegaConf.to_container(cfg.method, resolve=True))
    elif method not in ("eagle3", "dflash") and drafter.kind == "drafter":
        raise ConfigError(
            f"task=train method={method} trains a transformers-model drafter; model.drafter._target_="
            f"{drafter._target_!r} is not one (pick e.g. model/drafter=early-exit)"
        )
    return TrainPlan(method, verifier, drafter, device, dtype, data, alias=alias)


def _check_eagle3_training(cfg: DictConfig, train: dict[str, Any]) -> None:
    drafter = cfg.model.drafter
    if drafter.kind != "drafter" or not str(drafter.get("_target_")).startswith("specbench.drafters.eagle3"):
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
    _check_start(train, "eagle3")


def _check_dflash_training(cfg: DictConfig, train: dict[str, Any]) -> None:
    drafter = cfg.model.drafter
    if drafter.kind != "drafter" or not str(drafter.get("_target_")).startswith("specbench.drafters.dflash"):
        raise ConfigError("task=train method=dflash trains a DFlash drafter: add model/drafter=dflash")
    if (drafter.get("params") or {}).get("path"):
        raise ConfigError(
            "task=train method=dflash trains a new drafter; model.drafter.params.path must be null (it names "
            "a trained drafter to decode with)"
        )
    if cfg.steering.name != "none":
        raise ConfigError("task=train method=dflash trains no steering; use steering=none")
    for key in ("dflash_layers", "dflash_anchors"):
        if train[key] < 1:
            raise ConfigError(f"train.{key} must be >= 1, got {train[key]}")
    if train["dflash_block_size"] < 2:
        raise ConfigError(
            "train.dflash_block_size must be >= 2 (the last token and a mask slot), "
            f"got {train['dflash_block_size']}"
        )
    gamma = train["dflash_loss_gamma"]
    if gamma is not None and not gamma > 0:
        raise ConfigError(f"train.dflash_loss_gamma must be > 0 or null (no decay), got {gamma}")
    if train["dflash_taps"] is not None and (not train["dflash_taps"] or min(train["dflash_taps"]) < 0):
        raise ConfigError(
            f"train.dflash_taps must be non-negative verifier layer ids or null, got {train['dflash_taps']}"
        )
    _check_start(train, "dflash")
    if train["dflash_draft_vocab_size"] is not None and train["dflash_draft_vocab_size"] < 1:
        raise ConfigError(
            f"train.dflash_draft_vocab_size must be >= 1 or null, got {train['dflash_draft_vocab_size']}"
        )
    _check_feature_keys(train)


def _check_start(train: dict[str, Any], method: str) -> None:
    """train.init_layer / init_head: where an EAGLE-3 head or a DFlash drafter starts."""
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
                f"of an earlier task=train method={method} run"
            )


def _check_feature_keys(train: dict[str, Any]) -> None:
    """train.feature_top_k / feature_batch_size (the verifier-feature cache and its targets)."""
    if train["feature_top_k"] is not None and train["feature_top_k"] < 1:
        raise ConfigError(f"train.feature_top_k must be >= 1 or null, got {train['feature_top_k']}")
    if train["feature_batch_size"] < 1:
        raise ConfigError(f"train.feature_batch_size must be >= 1, got {train['feature_batch_size']}")


def resolved_reward(cfg: Any) -> str:
    """``train.reward``, with ``auto`` resolved as validation does: the dataset's metric where it has one,
    else ``per_token_gate`` (a config built without :func:`~specbench.config.train_checks.validate_train`)."""
    reward = str(cfg.train.reward)
    if reward != "auto":
        return reward
    return "per_token_gate" if (dataset_settings(cfg.dataset).metric or "none") == "none" else "task"
