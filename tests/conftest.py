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


@pytest.fixture(autouse=True, scope="session")
def _cost_profile_cache_for_tests(tmp_path_factory):
    """Cost profiles that tests measure (schedule=cost_aware, profile: null) are cached in a throwaway
    dir, never in the developer's ~/.cache, where a test's tiny-model profile would be read back by nobody."""
    previous = os.environ.get("SPECBENCH_COST_CACHE")
    os.environ["SPECBENCH_COST_CACHE"] = str(tmp_path_factory.mktemp("cost-profiles"))
    yield
    if previous is None:
        os.environ.pop("SPECBENCH_COST_CACHE", None)
    else:
        os.environ["SPECBENCH_COST_CACHE"] = previous


@pytest.fixture(autouse=True, scope="session")
def _mlflow_store_for_tests(tmp_path_factory):
    """MLflow runs made by tests (launch.py subprocesses too) go to a throwaway SQLite file, never to
    the project's mlruns/ or a server named by the developer's MLFLOW_TRACKING_URI."""
    previous = os.environ.get("MLFLOW_TRACKING_URI")
    os.environ["MLFLOW_TRACKING_URI"] = "sqlite:///" + str(tmp_path_factory.mktemp("mlflow") / "mlflow.db")
    yield
    if previous is None:
        os.environ.pop("MLFLOW_TRACKING_URI", None)
    else:
        os.environ["MLFLOW_TRACKING_URI"] = previous


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory):
    """An empty, migrated MLflow SQLite database (creating one takes ~5 s; copying it, milliseconds)."""
    from specbench.tracking import store

    path = tmp_path_factory.mktemp("mlflow-template") / "mlflow.db"
    store.client("sqlite:///" + str(path))
    return path


@pytest.fixture
def mlflow_uri(_mlflow_template, tmp_path, monkeypatch):
    """A fresh MLflow SQLite store for one test, also exported as MLFLOW_TRACKING_URI."""
    import shutil

    path = tmp_path / "mlruns" / "mlflow.db"
    path.parent.mkdir()
    shutil.copy(_mlflow_template, path)
    uri = "sqlite:///" + str(path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    return uri
