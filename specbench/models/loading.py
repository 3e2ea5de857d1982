"""Load verifier and drafter models (hub id, local dir, embedded SmolLM2, tiny random, early exit)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from specbench.models.devices import resolve_device, resolve_dtype
from specbench.models.early_exit import early_exit_drafter
from specbench.models.embedded import EMBEDDED_NAME, embedded_model_dir
from specbench.models.tiny import byte_tokenizer, tiny_random_model

KINDS = ("hub", "local", "embedded", "tiny_random", "early_exit", "none")


@dataclass
class ModelSpec:
    """What model to load; mirrors the ``model/verifier`` and ``model/drafter`` config groups."""

    kind: str
    name: str = ""
    path: str | None = None
    revision: str | None = None
    arch: str = "llama"
    num_layers: int | None = None
    hidden_size: int = 64
    vocab_size: int = 320
    seed: int = 0
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Unknown model kind {self.kind!r}: expected one of {KINDS}.")


@dataclass
class LoadedModel:
    """A model in eval mode with frozen parameters, its tokenizer, and where it came from."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    spec: ModelSpec
    name: str


def _from_pretrained(
    spec: ModelSpec, path: str | Path, dtype: torch.dtype, revision: str | None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    model = AutoModelForCausalLM.from_pretrained(
        path, dtype=dtype, revision=revision, trust_remote_code=spec.trust_remote_code
    )
    tokenizer = AutoTokenizer.from_pretrained(
        path, revision=revision, trust_remote_code=spec.trust_remote_code
    )
    return model, tokenizer


def _build(spec: ModelSpec, role: str, dtype: torch.dtype) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Build the model and tokenizer of a hub / local / embedded / tiny_random spec."""
    if spec.kind in ("hub", "local"):
        if not spec.path:
            raise ValueError(
                f"model/{role}: kind={spec.kind!r} needs `path` (a hub id or a local directory)."
            )
        if spec.kind == "local":
            if not Path(spec.path).expanduser().exists():
                raise FileNotFoundError(f"model/{role}: local model path {spec.path!r} does not exist.")
            return _from_pretrained(spec, Path(spec.path).expanduser(), dtype, None)
        return _from_pretrained(spec, spec.path, dtype, spec.revision)
    if spec.kind == "embedded":
        return _from_pretrained(spec, embedded_model_dir(), dtype, None)
    if spec.kind == "tiny_random":
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
    return model


def load_verifier(
    spec: ModelSpec, device: str | torch.device = "auto", dtype: str | torch.dtype = "auto"
) -> LoadedModel:
    """Load the verifier described by ``spec`` onto ``device`` in ``dtype`` (eval mode, no grads)."""
    if spec.kind in ("early_exit", "none"):
        raise ValueError(f"model/verifier: kind={spec.kind!r} is only valid for a drafter.")
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    model, tokenizer = _build(spec, "verifier", dtype)
    return LoadedModel(_finish(model, device, dtype), tokenizer, spec, _default_name(spec))


def load_drafter(
    spec: ModelSpec,
    verifier: LoadedModel,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
) -> LoadedModel | None:
    """Load the drafter described by ``spec``; None for kind "none".

    An early-exit drafter shares the verifier's weights, so it lives on the verifier's device and dtype
    (a different explicit request is an error) and uses the verifier's tokenizer.
    """
    if spec.kind == "none":
        return None
    device = resolve_device(device)
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
    model, tokenizer = _build(spec, "drafter", dtype)
    return LoadedModel(_finish(model, device, dtype), tokenizer, spec, _default_name(spec))
