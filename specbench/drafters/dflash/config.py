"""The DFlash config: a z-lab ``config.json`` parsed and validated (docs/dflash.md).

z-lab writes a Qwen3 config plus ``dflash_config`` = {block_size, mask_token_id, target_layer_ids}
(older checkpoints: ``block_size`` at the top level, taps derived from ``num_target_layers``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# dflash_config keys of DFlash variants this module does not implement (DFlash2's convolutions, candidate
# selector and logit transforms): a checkpoint that sets them is refused rather than run wrongly.
UNSUPPORTED_KEYS = (
    "conv_group_size", "conv_kernel_size", "selector_rank", "selector_top_k", "output_multiplier",
    "final_logit_softcapping", "input_embedding_scale",
)  # fmt: skip
# SpecForge / DSpark variant switches: only these values are the plain DFlash implemented here.
PLAIN_VALUES = {
    "attention_mode": (None, "gqa", "mha"), "attention_modes": (None,), "projector_type": (None,),
    "pure_draft_prefix_len": (None, 0), "shift_label": (None, False), "markov_rank": (None, 0),
    "enable_confidence_head": (None, False),
}  # fmt: skip
REQUIRED = (
    "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "vocab_size",
)  # fmt: skip


class DFlashConfigError(ValueError):
    """A DFlash config.json this implementation cannot run (the message names the field and the fix)."""


def default_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> tuple[int, ...]:
    """z-lab's default taps when a config gives none: ``num_draft_layers`` layers evenly spaced over
    ``1 .. L − 3`` (the middle layer for one draft layer)."""
    if num_draft_layers == 1:
        return (num_target_layers // 2,)
    start, end = 1, num_target_layers - 3
    return tuple(round(start + i * (end - start) / (num_draft_layers - 1)) for i in range(num_draft_layers))


def rope_parameters(raw: dict[str, Any]) -> dict[str, Any]:
    """The rope parameters in transformers-5 form (``rope_type``, ``rope_theta``, scaling fields)."""
    params = dict(raw.get("rope_parameters") or {})
    scaling = raw.get("rope_scaling")
    if not params and scaling:
        params = dict(scaling)
    params.setdefault("rope_theta", float(raw.get("rope_theta", 10000.0)))
    params["rope_type"] = params.pop("type", params.get("rope_type", "default"))
    return params


@dataclass(frozen=True)
class DFlashConfig:
    """What a DFlash draft network is; :meth:`from_dict` reads a z-lab ``config.json``."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int  # the verifier's embedding rows (z-lab copies the target's vocab_size)
    target_layer_ids: tuple[int, ...]  # z-lab ids: HF hidden_states[id + 1], the output of verifier layer id
    block_size: int
    mask_token_id: int | None  # None: a learned mask embedding (specbench extension)
    num_target_layers: int | None = None
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    max_position_embeddings: int = 32768
    rope: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default", "rope_theta": 10000.0})
    extra: dict[str, Any] = field(default_factory=dict)  # other config.json fields, kept for export

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DFlashConfig:
        draft = dict(raw.get("dflash_config") or {})

        def value(name, default=None):
            return draft.get(name, raw.get(name, default))

        missing = [k for k in REQUIRED if k not in raw]
        if missing:
            raise DFlashConfigError(
                f"DFlash config.json lacks {missing}; it must give the draft layers' shape"
            )
        unsupported = [k for k in UNSUPPORTED_KEYS if value(k) is not None]
        unsupported += [f"{k}={value(k)!r}" for k, plain in PLAIN_VALUES.items() if value(k) not in plain]
        if unsupported:
            raise DFlashConfigError(
                f"DFlash config sets {unsupported}: a DFlash2 / variant checkpoint, which specbench does not "
                "implement; use a plain DFlash checkpoint (architectures: DFlashDraftModel)"
            )
        if raw.get("hidden_act", "silu") != "silu":
            raise DFlashConfigError(f"hidden_act={raw['hidden_act']!r}: only 'silu' (SwiGLU) is implemented")
        layers = int(raw["num_hidden_layers"])
        types = raw.get("layer_types") or ["full_attention"] * layers
        if any(t != "full_attention" for t in types) or raw.get("use_sliding_window"):
            raise DFlashConfigError(
                f"layer_types={types}: sliding-window draft layers are not implemented; only full_attention"
            )
        if value("is_causal") or value("causal"):
            raise DFlashConfigError(
                "is_causal=true: only the non-causal (in-block bidirectional) DFlash is implemented"
            )
        num_target = value("num_target_layers")
        ids = value("target_layer_ids")
        if ids is None:
            if num_target is None:
                raise DFlashConfigError(
                    "DFlash config gives neither dflash_config.target_layer_ids nor num_target_layers"
                )
            ids = default_target_layer_ids(int(num_target), layers)
        ids = tuple(int(i) for i in ids)
        if not ids or min(ids) < 0:
            raise DFlashConfigError(
                f"dflash_config.target_layer_ids={list(ids)}: give non-negative verifier layer ids"
            )
        if num_target is not None and max(ids) >= int(num_target):
            raise DFlashConfigError(
                f"dflash_config.target_layer_ids={list(ids)} reach past num_target_layers={num_target}"
            )
        block_size = int(value("block_size", 16))
        if block_size < 2:
            raise DFlashConfigError(
                f"block_size={block_size}: a block needs the last token and >= 1 mask slot"
            )
        mask = value("mask_token_id")
        heads = int(raw["num_attention_heads"])
        known = set(REQUIRED) | {
            "head_dim", "rms_norm_eps", "attention_bias", "max_position_embeddings", "rope_theta",
            "rope_scaling", "rope_parameters", "dflash_config", "block_size", "num_target_layers",
            "target_layer_ids", "mask_token_id", "layer_types", "hidden_act", "use_sliding_window",
            "sliding_window", "is_causal", "torch_dtype", "dtype", "architectures", "model_type",
            "attention_dropout", "tie_word_embeddings",
        }  # fmt: skip
        return cls(
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=int(raw["num_key_value_heads"]),
            head_dim=int(raw.get("head_dim") or int(raw["hidden_size"]) // heads),
            vocab_size=int(raw["vocab_size"]),
            target_layer_ids=ids,
            block_size=block_size,
            mask_token_id=None if mask is None else int(mask),
            num_target_layers=None if num_target is None else int(num_target),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            attention_bias=bool(raw.get("attention_bias", False)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
            rope=rope_parameters(raw),
            extra={k: v for k, v in raw.items() if k not in known},
        )

    def to_dict(self) -> dict[str, Any]:
        """The z-lab config.json fields (``dflash_config`` holds block_size, mask_token_id and the taps)."""
        out = {
            "architectures": ["DFlashDraftModel"],
            "model_type": "qwen3",
            "hidden_act": "silu",
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "sliding_window": None,
            "tie_word_embeddings": False,
            **self.extra,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "attention_bias": self.attention_bias,
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.rope["rope_theta"],
            "rope_scaling": None if self.rope.get("rope_type", "default") == "default" else dict(self.rope),
            "layer_types": ["full_attention"] * self.num_hidden_layers,
            "block_size": self.block_size,
            "dflash_config": {
                "block_size": self.block_size,
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        }
        if self.num_target_layers is not None:
            out["num_target_layers"] = self.num_target_layers
        return out
