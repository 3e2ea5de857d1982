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
