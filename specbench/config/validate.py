"""Check a composed config before any model loads, without importing torch, and turn it into a run plan.

:func:`validate`, :func:`validate_train` and :func:`validate_synth` import neither torch nor transformers,
so a bad value is reported within a second or two. Their plans build the library objects (rule, schedule,
generation settings, device, dtype) on first use; :meth:`RunPlan.resolve` builds them all at once (it
imports torch) and turns what only torch can tell (e.g. no CUDA) into a ConfigError.

The checks live with the group they check: :mod:`~specbench.config.checks` (shared: runtime, dataset,
scoring, files), :mod:`~specbench.config.model_checks` (``model/*``), :mod:`~specbench.config.steering_checks`
(``steering`` and trained checkpoints), :mod:`~specbench.config.train_checks` (``train``,
:func:`validate_train`); the plans are in :mod:`~specbench.config.plans`.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from specbench import values
from specbench.config.checks import (
    check_dataset,
    check_file,
    check_runtime,
    check_scoring,
    check_shards,
    checked,
    method_of,
)
from specbench.config.draft_vocab import check_draft_vocab, trained_vocab_spec
from specbench.config.model_checks import (
    check_drafter_tree_width,
    check_model_source,
    check_plugin_drafter,
    model_spec,
    verifier_spec,
)
from specbench.config.plans import RunPlan
from specbench.config.schedule_checks import check_schedule_config
from specbench.config.steering_checks import (
    TRAINED_METHODS,
    adopt_checkpoint_steering,
    check_checkpoint,
    check_steering,
    check_trained_method,
)
from specbench.config.train_checks import validate_train  # noqa: F401  (the three entry points live here)
from specbench.errors import ConfigError
from specbench.method_names import METHODS, check_rule_params
from specbench.models.spec import ModelSpec

POOLS = values.POOLS


def validate(cfg: DictConfig) -> RunPlan:
    """Validate a composed config (method, schedule, generation, runtime, models, dataset), torch-free.

    Rewrites ``cfg.method`` into its canonical form first (an alias becomes ``name`` + ``alias``, unset
    parameters take the method's defaults: specbench/config/methods.py), so what is recorded is what runs.
    Loads no model and reads no weights (a checkpoint's metadata only); raises ConfigError naming the bad key.
    """
    method, alias = method_of(cfg)
    method_node = OmegaConf.to_container(cfg.method, resolve=True)
    method_cfg = {k: v for k, v in method_node.items() if k not in ("name", "alias")}
    steering = check_steering(cfg.steering)
    checkpoint = None
    if method_cfg.get("_target_"):
        from specbench.decoding.methods import build_target_rule  # imports torch, as a plugin drafter does

        checked("method", build_target_rule, method_cfg["_target_"], method_cfg.get("params"))
    elif method in TRAINED_METHODS:
        checkpoint = check_trained_method(method, method_cfg, steering, cfg)
    elif method in METHODS:
        checked("method", check_rule_params, method, method_cfg)
    schedule = OmegaConf.to_container(cfg.schedule, resolve=True)
    schedule["name"] = cfg.schedule.name = check_schedule_config(schedule)  # recorded: what runs
    gen = OmegaConf.to_container(cfg.gen, resolve=True)
    batch_size = gen.pop("batch_size")
    if batch_size < 1:
        raise ConfigError(f"gen.batch_size must be >= 1, got {batch_size}")
    checked("gen", values.check_generation, **gen)
    device, dtype = check_runtime(cfg)
    check_shards(cfg.eval.num_shards, cfg.eval.shard_id)

    verifier = verifier_spec(cfg)
    drafter: ModelSpec | None = None
    if method != "auto":
        drafter = model_spec(cfg.model.drafter, "model.drafter")
        if drafter.kind == "none":
            raise ConfigError(
                f"method {method!r} needs a drafter but model.drafter.kind is 'none': pick a drafter "
                "(e.g. model/drafter=early-exit) or use method=auto for autoregressive decoding"
            )
        check_model_source(drafter, "model.drafter")
        if method in ("distill", "sd2"):
            drafter = trained_vocab_spec(drafter, checkpoint, TRAINED_METHODS[method][0])
        check_draft_vocab(drafter, "model.drafter", verifier)
        if drafter.kind == "drafter":
            check_plugin_drafter(drafter, method, method_cfg)
        else:
            check_drafter_tree_width(drafter.tree_width, method, method_cfg, "model.drafter.tree_width")
        if drafter.kind != "drafter" and method == "eagle3":
            raise ConfigError("method=eagle3 decodes with an EAGLE-3 head: add model/drafter=eagle3")
        if drafter.kind != "drafter" and method == "dflash":
            raise ConfigError("method=dflash decodes with a DFlash drafter: add model/drafter=dflash")
    if schedule["name"] == "cost_aware":
        check_file(schedule.get("profile"), "schedule.profile")
    if checkpoint:
        metadata = check_checkpoint(checkpoint, TRAINED_METHODS[method][0], method, verifier, drafter)
        if method == "sd2":
            adopt_checkpoint_steering(cfg, metadata, checkpoint)
    check_dataset(cfg.dataset)
    check_scoring(cfg.scoring)
    steering_node = OmegaConf.to_container(cfg.steering, resolve=True) if steering != "none" else None
    if steering_node is not None and drafter is None:
        raise ConfigError("steering=sd2 steers a drafter, but method=auto has none; use method=sd2")
    return RunPlan(
        method, method_cfg, schedule, gen, batch_size, verifier, drafter, device, dtype,
        steering=steering_node, checkpoint=checkpoint, pool=method_cfg.get("pool") or "linear", alias=alias,
    )


def validate_synth(cfg: DictConfig) -> RunPlan:
    """Validate a ``task=synth`` config (``synth.*``, verifier, dataset, runtime); loads no model.

    The plan samples from the verifier alone (method ``auto``, no drafter); ``settings.max_new_tokens``
    is the most a row can get (``synth.target_len - 1``). Raises ConfigError naming the bad key.
    """
    from specbench.pipelines.synth_plan import SynthSettings

    synth = checked("synth", SynthSettings.from_config, cfg.synth)
    gen = {
        "max_new_tokens": synth.target_len - 1,
        "temperature": synth.temperature,
        "top_k": synth.top_k,
        "top_p": synth.top_p,
        "seed": synth.seed,
    }
    checked("synth", values.check_generation, **gen)
    device, dtype = check_runtime(cfg)
    verifier = verifier_spec(cfg)
    check_dataset(cfg.dataset)
    return RunPlan("auto", {}, {}, gen, synth.batch_size, verifier, None, device, dtype)
