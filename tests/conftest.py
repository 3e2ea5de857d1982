"""Shared pytest fixtures. Tests never reach a model hub."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """The embedded SmolLM2-135M-Instruct verifier (cpu, float32), loaded once per session.

    Converts the GGUF file into ``$SPECBENCH_CACHE`` (default ``~/.cache/specbench``) on first use.
    """
    from specbench.models import ModelSpec, load_verifier

    return load_verifier(ModelSpec(kind="embedded"), device="cpu", dtype="float32")


@pytest.fixture(autouse=True, scope="session")
def _single_torch_thread():
    """One torch thread: tiny-model tests run faster, and a busy 2-core machine cannot stall them."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
