"""DFlash checkpoints in the z-lab layout: ``config.json`` + ``model.safetensors`` (or a sharded
``model.safetensors.index.json``), weights named as in z-lab's ``DFlashDraftModel``::

    fc.weight                    (H, len(target_layer_ids)·H)
    hidden_norm.weight           (H,)
    layers.N.input_layernorm.weight, layers.N.post_attention_layernorm.weight
    layers.N.self_attn.{q,k,v,o}_proj.weight (+ .bias with attention_bias),
    layers.N.self_attn.{q,k}_norm.weight layers.N.mlp.{gate,up,down}_proj.weight
    norm.weight
    mask_embedding               (H,)  specbench only: a learned mask, when dflash_config.mask_token_id is
    null

The draft shares the verifier's embedding and LM head; ``embed_tokens`` / ``lm_head`` weights in a checkpoint
are ignored. :func:`check_fits_verifier` refuses a draft built for another verifier before any
decoding.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specbench.drafters.dflash.config import DFlashConfig
from specbench.drafters.dflash.model import DFlashDraftModel
from specbench.models.draft_vocab import DraftVocab
from specbench.models.pair import CheckpointMismatchError

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
SHARED = ("embed_tokens.weight", "lm_head.weight")  # the verifier's: ignored when a checkpoint ships them


class DFlashCheckpointError(CheckpointMismatchError):
    """A DFlash checkpoint that is unreadable or does not fit the verifier (names the field and the fix)."""


def read_state(directory: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json as a dict, all weights) of a z-lab layout directory."""
    from safetensors.torch import load_file

    directory = Path(directory)
    config_path = directory / CONFIG_FILE
    if not config_path.is_file():
        raise DFlashCheckpointError(
            f"{str(directory)!r} has no {CONFIG_FILE}: not a DFlash checkpoint directory"
        )
    raw = json.loads(config_path.read_text())
    if (directory / WEIGHTS_FILE).is_file():
        return raw, load_file(str(directory / WEIGHTS_FILE))
    if (directory / INDEX_FILE).is_file():
        weight_map = json.loads((directory / INDEX_FILE).read_text())["weight_map"]
        state: dict[str, torch.Tensor] = {}
        for shard in sorted(set(weight_map.values())):
            state.update(load_file(str(directory / shard)))
        missing = sorted(set(weight_map) - set(state))
        if missing:
            raise DFlashCheckpointError(f"{INDEX_FILE} lists {missing[:3]} but no shard holds them")
        return raw, state
    raise DFlashCheckpointError(f"{str(directory)!r} has neither {WEIGHTS_FILE} nor {INDEX_FILE}")


def verifier_depth(verifier: nn.Module) -> int:
    return int(verifier.config.num_hidden_layers)


def check_fits_verifier(
    config: DFlashConfig, verifier: nn.Module, source: str = "the DFlash checkpoint"
) -> None:
    """Raise :class:`DFlashCheckpointError` if the draft does not fit ``verifier`` (a causal LM): hidden size,
    tapped layers, vocabulary, mask token."""
    hidden = int(verifier.config.hidden_size)
    depth = verifier_depth(verifier)
    rows = int(verifier.get_input_embeddings().weight.shape[0])
    if config.hidden_size != hidden:
        raise DFlashCheckpointError(
            f"{source}: hidden_size {config.hidden_size} but the verifier's is {hidden}; use the DFlash "
            "checkpoint trained for this verifier (model/verifier and model.drafter.params.path must match)"
        )
    if max(config.target_layer_ids) >= depth:
        raise DFlashCheckpointError(
            f"{source}: dflash_config.target_layer_ids={list(config.target_layer_ids)} but the verifier has "
            f"{depth} layers (ids 0..{depth - 1}); use the checkpoint trained for this verifier"
        )
    if config.num_target_layers is not None and config.num_target_layers != depth:
        raise DFlashCheckpointError(
            f"{source}: num_target_layers={config.num_target_layers} but the verifier has {depth} layers; "
            "use the checkpoint trained for this verifier"
        )
    if config.vocab_size != rows:
        raise DFlashCheckpointError(
            f"{source}: vocab_size {config.vocab_size} but the verifier's embedding has {rows} rows; the "
            "draft "
            "reads its logits through the verifier's LM head, so it must come from the same model family"
        )
    if config.mask_token_id is not None and not 0 <= config.mask_token_id < rows:
        raise DFlashCheckpointError(
            f"{source}: dflash_config.mask_token_id={config.mask_token_id} is not a row of the verifier's "
            f"embedding (0..{rows - 1}); set it to null for a learned mask embedding"
        )


def load_dflash(directory: str | Path, verifier: nn.Module | None = None) -> DFlashDraftModel:
    """The draft network of a z-lab layout directory, checked against ``verifier`` when given, on the
    verifier's device and dtype (float32 otherwise)."""
    raw, state = read_state(directory)
    config = DFlashConfig.from_dict(raw)
    if verifier is not None:
        check_fits_verifier(config, verifier, f"DFlash checkpoint {str(directory)!r}")
    return _with_weights(DFlashDraftModel(config), state, f"DFlash checkpoint {str(directory)!r}", verifier)


def _with_weights(
    model: DFlashDraftModel, state: dict[str, torch.Tensor], source: str, verifier: nn.Module | None
) -> DFlashDraftModel:
    """``model`` with exactly the weights ``state`` names (the shared embedding / LM head ignored), on the
    verifier's device and dtype when given; a missing, extra or misshapen weight is an error."""
    state = {k: v for k, v in state.items() if k not in SHARED}
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise DFlashCheckpointError(
            f"{source} does not match its config: missing {missing[:4]}, unexpected {unexpected[:4]}"
        )
    wrong = [k for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        k = wrong[0]
        raise DFlashCheckpointError(
            f"{source}: {k} has shape {tuple(state[k].shape)}, its config implies {tuple(expected[k].shape)}"
        )
    model.load_state_dict({k: v.float() for k, v in state.items()})
    if verifier is not None:
        param = next(verifier.parameters())
        model = model.to(device=param.device, dtype=param.dtype)
    return model.eval().requires_grad_(False)


TRAINED_PREFIX = "draft."  # the draft network's weights in a task=train method=dflash checkpoint


def read_trained(path: str | Path) -> tuple[DFlashConfig, dict[str, torch.Tensor], dict]:
    """(config, draft weights, metadata) of a ``task=train method=dflash`` ``trained.pt`` / ``last.ckpt``."""
    from specbench.models.checkpoints import read_checkpoint

    state, metadata = read_checkpoint(path)
    if metadata.get("method") != "dflash" or "dflash_config" not in metadata:
        raise DFlashCheckpointError(
            f"{str(path)!r} is a method={metadata.get('method')!r} checkpoint, not a DFlash drafter (the "
            "trained.pt "
            "of task=train method=dflash); a z-lab layout directory loads as it is"
        )
    weights = {k.removeprefix(TRAINED_PREFIX): v for k, v in state.items() if k.startswith(TRAINED_PREFIX)}
    return DFlashConfig.from_dict(metadata["dflash_config"]), weights, metadata


def load_trained_dflash(
    path: str | Path, verifier: Any, vocab_size: int
) -> tuple[DFlashDraftModel, DraftVocab | None]:
    """The draft network ``task=train method=dflash`` saved and its draft vocabulary (None: the full one),
    checked against ``verifier`` (a LoadedModel: the same name, weights and tokenizer it was trained on, as
    for EAGLE-3 heads)."""
    from specbench.drafters.eagle3.checkpoint import IDENTITY_KEYS, verifier_identity
    from specbench.models.pair import metadata_differences

    config, weights, metadata = read_trained(path)
    shown = metadata_differences(metadata, verifier_identity(verifier, vocab_size), IDENTITY_KEYS)
    if shown:
        raise DFlashCheckpointError(
            f"{str(path)!r} was trained for another verifier ({shown}); use the model/verifier it was "
            "trained "
            "with, or train one for this verifier (task=train method=dflash)"
        )
    check_fits_verifier(config, verifier.model, f"DFlash drafter {str(path)!r}")
    model = _with_weights(DFlashDraftModel(config), weights, f"DFlash drafter {str(path)!r}", verifier.model)
    vocab = DraftVocab(metadata["draft_vocab_ids"], vocab_size) if metadata.get("draft_vocab_ids") else None
    return model, vocab


def export_dflash(model: DFlashDraftModel, directory: str | Path, dtype: torch.dtype | None = None) -> Path:
    """Write ``model`` in the z-lab layout (config.json + model.safetensors) under ``directory``."""
    from safetensors.torch import save_file

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    dtype = dtype or model.dtype
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (directory / CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
    weights = {k: v.detach().to("cpu", dtype).contiguous() for k, v in model.state_dict().items()}
    save_file(weights, str(directory / WEIGHTS_FILE), metadata={"format": "pt"})
    return directory
