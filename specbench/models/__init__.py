"""Models: loading verifiers and drafter models, tiny test models, the embedded SmolLM2 model, early-exit
drafters, hidden-state taps, sharding, reduced draft vocabularies and the checks that a pair shares one
vocabulary (``load_drafter`` loads drafter models; :func:`specbench.pairs.load_drafter` also builds a
``kind: drafter`` Drafter).

The names below are imported on first use (PEP 562), so importing a torch-free submodule such as
``specbench.models.spec`` or ``specbench.models.embedded`` does not import torch (config validation
runs before torch loads).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Timer": "devices",
    "resolve_device": "devices",
    "resolve_dtype": "devices",
    "synchronize": "devices",
    "timed": "devices",
    "early_exit_drafter": "early_exit",
    "EMBEDDED_NAME": "embedded",
    "cache_root": "embedded",
    "embedded_gguf_path": "embedded",
    "embedded_model_dir": "embedded",
    "KINDS": "spec",
    "ModelSpec": "spec",
    "LoadedModel": "loading",
    "pair_vocab_size": "loading",
    "load_drafter": "loading",
    "load_verifier": "loading",
    "PairMismatchError": "pair",
    "shared_vocab_size": "pair",
    "tokenizer_hash": "pair",
    "byte_tokenizer": "tiny",
    "tiny_random_model": "tiny",
}

__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
