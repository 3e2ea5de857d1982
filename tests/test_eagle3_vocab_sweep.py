"""benchmarks/eagle3_vocab.py --work: one head per draft vocabulary size, trained with the embedded head's recipe."""

from __future__ import annotations

import importlib.util
import re
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location(
        "eagle3_vocab_script", ROOT / "benchmarks" / "eagle3_vocab.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


sweep = _module()
PER_RUN = {"train.data", "train.draft_vocab_size", "train.max_steps", "train.feature_cache", "train.output_dir",
           "runtime.num_threads"}  # fmt: skip


def documented_training_overrides() -> list[str]:
    """The overrides of the embedded head's training command in docs/eagle3.md."""
    text = (ROOT / "docs" / "eagle3.md").read_text()
    section = text.split("## The embedded head", 1)[-1]
    command = re.search(r"python launch\.py task=train method=eagle3 .*?(?=\n#|\n```)", section, re.DOTALL)
    assert command, "docs/eagle3.md lost the embedded head's training command"
    return shlex.split(command.group(0).replace("\\\n", " "))[2:]


def test_the_sweep_trains_with_the_documented_recipe_but_its_own_size_steps_and_paths():
    documented = documented_training_overrides()
    key = lambda override: override.split("=", 1)[0]
    assert sorted(o for o in documented if key(o) not in PER_RUN) == sorted(sweep.TRAIN_RECIPE)
    assert {key(o) for o in documented if key(o) in PER_RUN} == PER_RUN


def test_a_size_whose_head_exists_is_not_trained_again(tmp_path, monkeypatch):
    head = tmp_path / "k4096" / "trained.pt"
    head.parent.mkdir()
    head.write_bytes(b"x")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("retrained an existing head"))
    assert sweep.train_head("data", tmp_path, 4096, 300, 1) == head


def test_the_full_vocabulary_trains_with_a_null_size_and_a_failure_names_its_log(tmp_path, monkeypatch):
    calls = []

    def failing(args, **kwargs):
        calls.append(args)
        return subprocess.CompletedProcess(args, 3)

    monkeypatch.setattr(subprocess, "run", failing)
    with pytest.raises(SystemExit, match=r"training kfull failed \(exit 3\); see .*kfull\.log"):
        sweep.train_head("/d", tmp_path, None, 200, 2)
    (args,) = calls
    assert "train.draft_vocab_size=null" in args and "train.max_steps=200" in args
    assert (
        f"train.output_dir={tmp_path / 'kfull'}" in args
        and f"train.feature_cache={tmp_path / 'features_kfull'}" in args
    )
