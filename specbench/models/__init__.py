"""Model loading, tiny test models, the embedded SmolLM2 model, early-exit drafters and pair checks."""

from specbench.models.devices import Timer, resolve_device, resolve_dtype, synchronize, timed
from specbench.models.early_exit import early_exit_drafter
from specbench.models.embedded import (
    EMBEDDED_NAME,
    cache_root,
    embedded_gguf_path,
    embedded_model_dir,
)
from specbench.models.loading import KINDS, LoadedModel, ModelSpec, load_drafter, load_verifier
from specbench.models.pair import PairMismatchError, shared_vocab_size, tokenizer_hash
from specbench.models.tiny import byte_tokenizer, tiny_random_model

__all__ = [
    "EMBEDDED_NAME",
    "KINDS",
    "LoadedModel",
    "ModelSpec",
    "PairMismatchError",
    "Timer",
    "byte_tokenizer",
    "cache_root",
    "early_exit_drafter",
    "embedded_gguf_path",
    "embedded_model_dir",
    "load_drafter",
    "load_verifier",
    "resolve_device",
    "resolve_dtype",
    "shared_vocab_size",
    "synchronize",
    "timed",
    "tiny_random_model",
    "tokenizer_hash",
]
