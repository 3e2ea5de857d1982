"""Load verifier and drafter models (hub id, local dir, embedded SmolLM2, tiny random, early exit).

A ``kind: drafter`` drafter (a Drafter class named by its ``target``) is built by
:func:`specbench.pairs.load_drafter`, above the drafters, which loads every other kind through
:func:`load_drafter` here."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.early_exit import early_exit_drafter
from specbench.models.embedded import EMBEDDED_NAME, embedded_model_dir
from specbench.models.pair import shared_vocab_size, verifier_vocab_size
from specbench.models.row_invariant import use_row_invariant_forwards
from specbench.models.sharding import (
    Placement,
    check_same_input_device,
    execution_device,
    input_device,
    is_tensor_parallel,
    ready,
)
from specbench.models.small_batch_lm_head import use_small_batch_lm_head
from specbench.models.spec import KINDS, ModelSpec  # noqa: F401  (re-exported: the torch-free home)
from specbench.models.tiny import byte_tokenizer, tiny_random_model

if TYPE_CHECKING:  # pragma: no cover
    from specbench.models.draft_vocab import DraftVocab


@dataclass
class LoadedModel:
    """A model in eval mode with frozen parameters, its tokenizer, and where it came from.

    ``draft_vocab``: a drafter's reduced draft vocabulary (``spec.draft_vocab_size`` / ``spec.draft_vocab``),
    None for the full vocabulary."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: ModelSpec
    name: str
    draft_vocab: DraftVocab | None = None


def _from_pretrained(
    spec: ModelSpec, path: str | Path, dtype: torch.dtype, revision: str | None, placement: Placement
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, revision=revision, trust_remote_code=spec.trust_remote_code,
        **placement.from_pretrained_kwargs(),
    )
    tokenizer = AutoTokenizer.from_pretrained(
        path, revision=revision, trust_remote_code=spec.trust_remote_code
    )
    return model, tokenizer


def _build(
    spec: ModelSpec, role: str, dtype: torch.dtype, placement: Placement
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build the model and tokenizer of a hub / local / embedded / tiny_random spec."""
    if spec.kind in ("hub", "local"):
        if not spec.path:
            raise ValueError(
                f"model/{role}: kind={spec.kind!r} needs `path` (a hub id or a local directory)."
            )
        if spec.kind == "local":
            if not Path(spec.path).expanduser().exists():
                raise FileNotFoundError(f"model/{role}: local model path {spec.path!r} does not exist.")
            return _from_pretrained(spec, Path(spec.path).expanduser(), dtype, None, placement)
        return _from_pretrained(spec, spec.path, dtype, spec.revision, placement)
    if spec.kind == "embedded":
        return _from_pretrained(spec, embedded_model_dir(), dtype, None, placement)
    if spec.kind == "tiny_random":
        if placement.sharded:
            raise ValueError(
                f"model/{role}: device_map / tp_plan load a checkpoint; kind='tiny_random' has none (save it "
                "with "
                "save_pretrained and use kind=local)"
            )
        model = tiny_random_model(
            spec.arch,
            seed=spec.seed,
            num_layers=spec.num_layers or 2,
            hidden_size=spec.hidden_size,
            vocab_size=spec.vocab_size,
        )
        return model, byte_tokenizer()
    raise ValueError(f"model/{role}: kind={spec.kind!r} cannot be built on its own.")


def _default_name(spec: ModelSpec) -> str:
    if spec.name:
        return spec.name
    if spec.kind == "embedded":
        return EMBEDDED_NAME
    return spec.path or spec.kind


def _same_device(a: torch.device, b: torch.device) -> bool:
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _finish(model: PreTrainedModel, device: torch.device, dtype: torch.dtype) -> PreTrainedModel:
    model.to(device=device, dtype=dtype)
    model.eval()
    model.requires_grad_(False)
    use_row_invariant_forwards(model)  # bf16 / fp16 CPU; few float32 CPU rows: small_linear (per call)
    use_small_batch_lm_head(model)  # a no-op off the CPU or outside float32 (checked per call)
    return model


def load_verifier(
    spec: ModelSpec,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    placement: Placement | None = None,
) -> LoadedModel:
    """Load the verifier described by ``spec`` onto ``device`` in ``dtype`` (eval mode, no grads).

    ``placement``: a device_map / tensor-parallel placement (:mod:`specbench.models.sharding`); default: what
    ``spec`` asks for, i.e. one device."""
    if spec.kind in ("early_exit", "none"):
        raise ValueError(f"model/verifier: kind={spec.kind!r} is only valid for a drafter.")
    placement = placement or Placement.of(spec)
    device = execution_device(device, placement)
    dtype = resolve_dtype(dtype, device)
    model, tokenizer = _build(spec, "verifier", dtype, placement)
    model = ready(model, "verifier") if placement.sharded else _finish(model, device, dtype)
    return LoadedModel(model, tokenizer, spec, _default_name(spec))


def drafter_vocab(spec: ModelSpec, verifier: LoadedModel, key: str = "model.drafter") -> DraftVocab:
    """The reduced draft vocabulary ``spec`` asks for, over the verifier's vocabulary (its tokenizer within
    its LM head); a source made for another tokenizer, or a bad size, is a ConfigError naming the key."""
    from specbench.errors import ConfigError
    from specbench.models.draft_vocab import load_draft_vocab
    from specbench.models.pair import tokenizer_hash

    if not spec.draft_vocab:
        raise ConfigError(f"{key}.draft_vocab_size={spec.draft_vocab_size} needs {key}.draft_vocab=PATH")
    vocab_size = verifier_vocab_size(verifier.model, verifier.tokenizer)
    try:
        vocab, info = load_draft_vocab(
            spec.draft_vocab, spec.draft_vocab_size, vocab_size, tokenizer_hash(verifier.tokenizer), key
        )
    except ConfigError:
        raise
    except (ValueError, FileNotFoundError) as err:
        message = " ".join(str(err).split())
        raise ConfigError(message if message.startswith(key) else f"{key}.draft_vocab: {message}") from err
    coverage = info.get("draft_vocab_coverage")
    covered = f", {100 * coverage:.1f} % of its response tokens" if isinstance(coverage, float) else ""
    print(
        f"draft vocabulary: {vocab.size} of {vocab_size} tokens from {spec.draft_vocab}{covered}",
        file=sys.stderr,
    )
    return vocab


def load_drafter(
    spec: ModelSpec,
    verifier: LoadedModel,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "float32",
    placement: Placement | None = None,
) -> LoadedModel | None:
    """Load the drafter model described by ``spec`` (hub / local / embedded / tiny random / early exit);
    None for kind "none". A ``kind: drafter`` spec names a Drafter class, which
    :func:`specbench.pairs.load_drafter` builds (it loads every kind).

    An early-exit drafter shares the verifier's weights, so it lives on the verifier's device and dtype
    (a different explicit request is an error) and uses the verifier's tokenizer. ``placement``: the
    drafter's own device_map (default: what ``spec`` asks for); a drafter next to a sharded verifier takes
    its inputs on the verifier's first device. A model drafter with ``spec.draft_vocab_size`` /
    ``spec.draft_vocab`` gets its reduced draft vocabulary (``LoadedModel.draft_vocab``,
    :func:`drafter_vocab`).
    """
    if spec.kind == "none":
        return None
    if spec.kind == "drafter":
        raise ValueError(
            f"model/drafter: kind='drafter' names a Drafter class ({spec._target_!r}); build it with "
            "specbench.pairs.load_drafter"
        )
    wants_vocab = spec.draft_vocab_size is not None or spec.draft_vocab is not None
    vocab = drafter_vocab(spec, verifier) if wants_vocab else None  # before the drafter's weights load
    loaded = _load_model_drafter(spec, verifier, device, dtype, placement)
    loaded.draft_vocab = vocab
    return loaded


def _load_model_drafter(
    spec: ModelSpec,
    verifier: LoadedModel,
    device: str | torch.device,
    dtype: str | torch.dtype,
    placement: Placement | None,
) -> LoadedModel:
    placement = placement or Placement.of(spec, key="model.drafter")
    device = resolve_device(device)
    if _is_placed(verifier.model):  # the engine runs where the verifier takes its inputs
        device = input_device(verifier.model)
    dtype = resolve_dtype(dtype, device)
    if spec.kind == "early_exit":
        if spec.num_layers is None:
            raise ValueError("model/drafter: kind='early_exit' needs `num_layers` (K, the exit layer).")
        v_device, v_dtype = verifier.model.device, verifier.model.dtype
        if not _same_device(device, v_device) or dtype != v_dtype:
            raise ValueError(
                f"model/drafter: an early-exit drafter shares the verifier's weights, which are on "
                f"{v_device} in {v_dtype}; got device={device}, dtype={dtype}."
            )
        model = early_exit_drafter(verifier.model, spec.num_layers)
        name = spec.name or f"{verifier.name}[:{spec.num_layers}] (early exit)"
        return LoadedModel(model.eval(), verifier.tokenizer, spec, name)
    model, tokenizer = _build(spec, "drafter", dtype, placement)
    if placement.sharded:
        model = ready(model, "drafter")
        check_same_input_device(verifier.model, model)
    else:
        model = _finish(model, device, dtype)
    return LoadedModel(model, tokenizer, spec, _default_name(spec))


def _is_placed(model: PreTrainedModel) -> bool:
    """Whether accelerate or tensor parallel placed ``model`` (its first device is then the engine's)."""
    return bool(getattr(model, "hf_device_map", None)) or is_tensor_parallel(model)


def pair_vocab_size(verifier: LoadedModel, drafter: object) -> int:
    """The vocabulary p and q are compared over: the verifier's tokenizer (within its LM head), checked
    against a loaded drafter model's (:func:`shared_vocab_size` raises PairMismatchError); ``drafter`` may
    also be a Drafter object or None."""
    if isinstance(drafter, LoadedModel):
        return shared_vocab_size(verifier.model, drafter.model, verifier.tokenizer, drafter.tokenizer)
    return verifier_vocab_size(verifier.model, verifier.tokenizer)
