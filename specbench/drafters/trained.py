"""Trainable drafters (distillation, SD²) and loading their checkpoints for decoding.

Training never changes the verifier (methods.md §3.2): a drafter that shares the verifier's modules
(early exit) trains a copy (``full``) or adapters on a copy (``lora``). A checkpoint holds only what
trained (drafter weights or adapters, steering head) and the metadata that ties it to one model pair.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from specbench.drafters.steering import SteeredDrafter, SteeringSpec
from specbench.models.checkpoints import read_checkpoint
from specbench.models.draft_vocab import DraftVocab, saved_draft_vocab
from specbench.models.loading import LoadedModel
from specbench.models.pair import CheckpointMismatchError, metadata_differences, tokenizer_hash

FINETUNE_MODES = ("full", "none", "lora")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DRAFTER_PREFIX = "drafter."
STEERING_PREFIX = "steering."


@dataclass(frozen=True)
class LoraSettings:
    rank: int = 16
    alpha: int = 32

    def to_dict(self) -> dict:
        return {"rank": self.rank, "alpha": self.alpha}


def shares_verifier_weights(drafter: PreTrainedModel, verifier: PreTrainedModel) -> bool:
    verifier_ids = {id(p) for p in verifier.parameters()}
    return any(id(p) in verifier_ids for p in drafter.parameters())


def trainable_drafter(
    drafter: PreTrainedModel,
    verifier: PreTrainedModel,
    finetune: str,
    lora: LoraSettings | None = None,
) -> PreTrainedModel:
    """The drafter module to train (or to load trained weights into) with ``requires_grad`` set.

    ``none``: the drafter as is, frozen. ``full``: every drafter weight trains. ``lora``: LoRA adapters
    (peft) on the attention and MLP projections train, the rest is frozen. A drafter sharing weights with
    the verifier is deep-copied first, so the verifier stays untouched.
    """
    if finetune not in FINETUNE_MODES:
        raise ValueError(f"steering.finetune_drafter must be one of {list(FINETUNE_MODES)}, got {finetune!r}")
    if finetune == "none":
        drafter.requires_grad_(False)
        return drafter
    model = copy.deepcopy(drafter) if shares_verifier_weights(drafter, verifier) else drafter
    if finetune == "full":
        model.requires_grad_(True)
        return model
    from peft import LoraConfig, inject_adapter_in_model

    lora = lora or LoraSettings()
    present = sorted({name.rsplit(".", 1)[-1] for name, _ in model.named_modules()} & set(LORA_TARGETS))
    config = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, target_modules=present, lora_dropout=0.0, bias="none"
    )
    model = inject_adapter_in_model(config, model)
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    return model


def weights_fingerprint(model: PreTrainedModel) -> str:
    """A short hash of a model's weights, the same in fp32 and bf16 (values are compared as bf16).

    Tells apart models that share a name (e.g. tiny random ones of another seed, a re-uploaded hub id).
    """
    digest = hashlib.sha256()
    for name, param in model.named_parameters():
        if "lora_" in name:
            continue
        values = param.detach().flatten()[:64].to("cpu", torch.bfloat16).float()
        digest.update(name.encode() + values.numpy().tobytes())
    return digest.hexdigest()[:16]


def pair_metadata(verifier: LoadedModel, drafter: LoadedModel, vocab_size: int) -> dict:
    """What ties a trained checkpoint to its model pair (call before training changes the drafter)."""
    return {
        "verifier": verifier.name,
        "drafter": drafter.name,
        "verifier_weights": weights_fingerprint(verifier.model),
        "drafter_weights": weights_fingerprint(drafter.model),
        "drafter_kind": drafter.spec.kind,
        "tokenizer_hash": tokenizer_hash(verifier.tokenizer),
        "verifier_hidden": int(verifier.model.config.hidden_size),
        "drafter_hidden": int(drafter.model.config.hidden_size),
        "vocab_size": int(vocab_size),
    }


def check_trained_for_pair(
    metadata: dict, verifier: LoadedModel, drafter: LoadedModel, path: str | Path, key: str
) -> None:
    """Raise CheckpointMismatchError unless the checkpoint was made for this verifier/drafter pair."""
    now = {
        "verifier": verifier.name,
        "drafter": drafter.name,
        "tokenizer_hash": tokenizer_hash(verifier.tokenizer),
        "verifier_hidden": int(verifier.model.config.hidden_size),
        "drafter_hidden": int(drafter.model.config.hidden_size),
        "verifier_weights": weights_fingerprint(verifier.model),
        "drafter_weights": weights_fingerprint(drafter.model),
    }
    shown = metadata_differences(metadata, now, now)
    if shown:
        raise CheckpointMismatchError(
            f"{key}={str(path)!r} was trained for another model pair ({shown}); pick the model/verifier and "
            f"model/drafter it was trained with (verifier {metadata.get('verifier')!r}, drafter "
            f"{metadata.get('drafter')!r}) or train one for this pair"
        )


@dataclass
class TrainedDrafter:
    drafter: LoadedModel  # the drafter to decode with (trained weights loaded)
    steering: SteeredDrafter | None
    metadata: dict


def load_trained_drafter(
    path: str | Path,
    verifier: LoadedModel,
    drafter: LoadedModel,
    method: str,
    key: str = "steering.checkpoint",
) -> TrainedDrafter:
    """Rebuild the drafter (and SD² steering) that ``task=train method=<method>`` saved at ``path``."""
    state, metadata = read_checkpoint(path)
    if metadata.get("method") != method:
        raise CheckpointMismatchError(
            f"{key}={str(path)!r} is a method={metadata.get('method')!r} checkpoint, not method={method!r}; "
            f"evaluate it with method={metadata.get('method')}"
        )
    check_trained_for_pair(metadata, verifier, drafter, path, key)
    lora = LoraSettings(**metadata["lora"]) if metadata.get("lora") else None
    model = trainable_drafter(drafter.model, verifier.model, metadata["finetune_drafter"], lora)
    steering = None
    if metadata.get("steering"):
        steering = SteeredDrafter(model, SteeringSpec.from_dict(metadata["steering"]))
    _load_state(state, model, steering, path)
    model.eval().requires_grad_(False)
    if steering is not None:
        steering.eval().requires_grad_(False)
    name = f"{drafter.name} ({method}: {Path(path).name})"
    vocab = trained_draft_vocab(metadata, verifier, drafter, path, key)
    loaded = LoadedModel(model, drafter.tokenizer, drafter.spec, name, vocab)
    return TrainedDrafter(loaded, steering, metadata)


def trained_draft_vocab(
    metadata: dict, verifier: LoadedModel, drafter: LoadedModel, path: str | Path, key: str
) -> DraftVocab | None:
    """The draft vocabulary to decode a trained drafter with: the one it was trained over (its checkpoint's
    ``draft_vocab_ids``), which ``model.drafter.draft_vocab`` may only repeat; else the configured one."""
    if "draft_vocab_ids" not in metadata:
        return drafter.draft_vocab
    from specbench.models.loading import pair_vocab_size

    where = f"{key}={str(path)!r}"
    saved = saved_draft_vocab(
        metadata, pair_vocab_size(verifier, drafter), tokenizer_hash(verifier.tokenizer), where
    )
    configured = drafter.draft_vocab
    if configured is not None and configured != saved:
        raise CheckpointMismatchError(
            f"model.drafter.draft_vocab gives a draft vocabulary of {configured.size} tokens (fingerprint "
            f"{configured.fingerprint()}), but {where} was trained over another one of {saved.size} "
            "(fingerprint "
            f"{saved.fingerprint()}); drop model.drafter.draft_vocab / draft_vocab_size (the checkpoint's is "
            "used)"
        )
    return saved


def _load_state(
    state: dict[str, torch.Tensor], model: PreTrainedModel, steering: Any, path: str | Path
) -> None:
    drafter_state = {
        k.removeprefix(DRAFTER_PREFIX): v for k, v in state.items() if k.startswith(DRAFTER_PREFIX)
    }
    steering_state = {
        k.removeprefix(STEERING_PREFIX): v for k, v in state.items() if k.startswith(STEERING_PREFIX)
    }
    unknown = [k for k in state if not k.startswith((DRAFTER_PREFIX, STEERING_PREFIX))]
    if unknown or (steering_state and steering is None):
        raise CheckpointMismatchError(
            f"checkpoint {str(path)!r} holds unexpected weights: {(unknown or list(steering_state))[:4]}"
        )
    if drafter_state:
        result = model.load_state_dict(drafter_state, strict=False)
        if result.unexpected_keys:
            raise CheckpointMismatchError(
                f"checkpoint {str(path)!r} does not fit the drafter: unexpected {result.unexpected_keys[:4]}"
            )
    if steering is not None:
        steering.load_state_dict(steering_state, strict=True)
