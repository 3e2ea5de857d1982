"""The ``model/verifier`` and ``model/drafter`` groups: model specs, their sources (without a download),
and whether a plugin drafter fits the method (its target, params, tree width, the rule's need for q)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from specbench import values
from specbench.config.checks import checked
from specbench.config.draft_vocab import check_draft_vocab
from specbench.errors import ConfigError
from specbench.method_names import METHODS
from specbench.models.embedded import CACHE_SUBDIR, cache_root, embedded_gguf_path
from specbench.models.spec import KINDS, ModelSpec

VERIFIER_KINDS = ("hub", "local", "embedded", "tiny_random")


def model_spec(node: DictConfig, key: str, tp_plan: str | None = None) -> ModelSpec:
    from specbench.models.sharding import Placement

    if node.get("target"):
        raise ConfigError(
            f"{key}.target is spelled {key}._target_ now (Hydra's convention, as for tasks, rules and "
            f"schedules): write `_target_: {node.target}` in the yaml, or {key}._target_={node.target}"
        )
    if OmegaConf.is_missing(node, "kind") and not node.get("_target_"):
        raise ConfigError(f"{key}.kind is required; allowed: {list(KINDS)}")
    fields = OmegaConf.to_container(node, resolve=True)
    if fields.get("_target_") and fields.get("kind") in (None, "???"):
        node.kind = fields["kind"] = "drafter"  # a _target_ without a kind: a drafter built from config
    if fields.get("kind") not in KINDS:
        raise ConfigError(f"{key}.kind: unknown kind {fields.get('kind')!r}; allowed: {list(KINDS)}")
    spec = checked(key, ModelSpec, **fields)
    checked(key, Placement.of, spec, tp_plan, key)  # device_map / max_memory / offload_folder / tp_plan
    return spec


def _hub_offline() -> bool:
    import os

    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def check_model_source(spec: ModelSpec, key: str) -> None:
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
        checked(key, embedded_gguf_path)
    if spec.kind == "early_exit" and (spec.num_layers is None or spec.num_layers < 1):
        raise ConfigError(
            f"{key}.num_layers must be an integer >= 1 for kind='early_exit', got {spec.num_layers}"
        )


def verifier_spec(cfg: DictConfig) -> ModelSpec:
    verifier = model_spec(cfg.model.verifier, "model.verifier", cfg.runtime.get("tp_plan"))
    if verifier.kind not in VERIFIER_KINDS:
        raise ConfigError(
            f"model.verifier.kind={verifier.kind!r} is only valid for a drafter; "
            f"allowed: {list(VERIFIER_KINDS)}"
        )
    check_model_source(verifier, "model.verifier")
    check_draft_vocab(verifier, "model.verifier", None)
    return verifier


# Methods that decode with a transformers-model drafter (the trained part is a model or steers one).
MODEL_DRAFTER_METHODS = ("sd2", "distill")


def check_plugin_drafter(drafter: ModelSpec, method: str, method_cfg: dict[str, Any]) -> None:
    """A ``kind: drafter`` drafter: its target and params, and whether the method's rule can verify it.
    Imports the target's module (and so torch)."""
    from specbench.pairs import check_drafter_spec, is_deterministic

    if method in MODEL_DRAFTER_METHODS:
        raise ConfigError(
            f"method={method} trains or steers a transformers-model drafter; model.drafter._target_="
            f"{drafter._target_!r} is not one (pick e.g. model/drafter=early-exit)"
        )
    if method == "eagle3" and not str(drafter._target_).startswith("specbench.drafters.eagle3"):
        raise ConfigError("method=eagle3 decodes with an EAGLE-3 head: add model/drafter=eagle3")
    if method == "dflash" and not str(drafter._target_).startswith(DFLASH_TARGET):
        raise ConfigError("method=dflash decodes with a DFlash drafter: add model/drafter=dflash")
    params = dict(drafter.params or {})
    if str(drafter._target_).startswith(DFLASH_TARGET):
        _check_dflash_path(params.get("path"))
    if str(drafter._target_).startswith("specbench.drafters.eagle3") and not params.get("path"):
        raise ConfigError(
            "model.drafter.params.path is null: pass the trained.pt of `task=train method=eagle3`, an "
            "EAGLE / SpecForge checkpoint directory or a hub id (the head to decode with; the embedded "
            "verifier's committed head: model/drafter=eagle3-smollm2)"
        )
    if str(drafter._target_).startswith("specbench.drafters.eagle3"):
        from specbench.drafters.eagle3_format import looks_like_file, resolve_head_path

        head = resolve_head_path(params["path"])
        if looks_like_file(head) and not Path(head).exists():
            raise ConfigError(
                f"model.drafter.params.path={params['path']!r}: no such file (a trained.pt of `task=train "
                "method=eagle3`, relative to the working directory or the project root)"
            )
    check_drafter_tree_width(
        params.get("tree_width", 1), method, method_cfg, "model.drafter.params.tree_width"
    )
    factory = checked("model.drafter", check_drafter_spec, drafter._target_, params)
    if method == "diversed" and is_deterministic(factory):
        raise ConfigError(
            "method=diversed pools the drafter's distribution q and reads its hidden states, but "
            f"model.drafter._target_={drafter._target_!r} proposes tokens without either; use a model "
            "drafter or an EAGLE-3 head (model/drafter=eagle3-smollm2)"
        )
    if is_deterministic(factory) and (method in METHODS or method_cfg.get("_target_")) and method != "auto":
        from specbench.decoding.methods import build_rule, build_target_rule

        rule = (
            checked("method", build_target_rule, method_cfg["_target_"], method_cfg.get("params"))
            if method_cfg.get("_target_")
            else checked("method", build_rule, method, **method_cfg)
        )
        if not rule.accepts_deterministic:
            raise ConfigError(
                f"method={method} needs the drafter's distribution q, but "
                f"model.drafter._target_={drafter._target_!r} proposes tokens without one; use method=sd, "
                "block, lossy, typical or fly, or a model drafter"
            )


DFLASH_TARGET = "specbench.drafters.dflash"


def _check_dflash_path(path: Any) -> None:
    if not path:
        raise ConfigError(
            "model.drafter.params.path is null: pass the trained.pt of `task=train method=dflash`, a DFlash "
            "directory in the z-lab layout or a hub id (e.g. z-lab/Qwen3-8B-DFlash-b16)"
        )
    from specbench.models.checkpoints import resolve_project_path

    given = Path(resolve_project_path(str(path)))
    if str(path).endswith((".pt", ".ckpt")) and not given.is_file():
        raise ConfigError(
            f"model.drafter.params.path={path!r}: no such file (a trained.pt of `task=train method=dflash`, "
            "relative to the working directory or the project root)"
        )


# Methods that verify with the exact sd rule (the trained ones steer or replace the drafter only).
EXACT_RULE_METHODS = ("sd", "sd2", "distill", "eagle3", "dflash")


def check_drafter_tree_width(width: Any, method: str, method_cfg: dict[str, Any], key: str) -> None:
    checked(key, values.check_tree_width, width, key)
    if width > 1 and (method not in (*EXACT_RULE_METHODS, "auto") or method_cfg.get("_target_")):
        raise ConfigError(
            f"{key}={width}: trees of drafts are verified by the exact sd rule only, not method={method}; "
            "use method=sd, or tree_width=1 for a chain"
        )
