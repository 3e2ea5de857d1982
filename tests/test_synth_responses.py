"""task=synth with several sampled responses per prompt and a cap on generated tokens."""

from __future__ import annotations

import dataclasses

import pytest

from specbench.data.dataset_config import dataset_settings
from specbench.data.datasets import load_dataset_prompts
from specbench.data.synth_dataset import load_synthetic
from specbench.data.synth_rows import SynthDataError, read_rows, rows_path
from specbench.models import ModelSpec, load_verifier
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize

SETTINGS = SynthSettings(target_len=88, max_prompt_len=80, batch_size=4, validation_fraction=0.2, seed=7,
                         responses_per_prompt=3, max_new_tokens=12)
DEMO = dataset_settings({"name": "demo"})


class Crash(RuntimeError):
    pass


@pytest.fixture(scope="module")
def verifier():
    return load_verifier(
        ModelSpec(kind="tiny_random", name="tiny-random-llama", num_layers=2), "cpu", "float32"
    )


@pytest.fixture(scope="module")
def prompts():
    return load_dataset_prompts(DEMO)


def run(verifier, prompts, out, settings=SETTINGS, **kwargs):
    return synthesize(verifier, prompts, settings, out, dataset=DEMO, progress=False, **kwargs)


def test_each_prompt_gets_several_different_capped_responses(verifier, prompts, tmp_path):
    result = run(verifier, prompts, tmp_path)
    rows = read_rows(rows_path(tmp_path))
    by_prompt: dict[int, list[dict]] = {}
    for row in rows:
        by_prompt.setdefault(row["source_index"], []).append(row)
    assert all(sorted(r["response_index"] for r in group) == [0, 1, 2] for group in by_prompt.values())
    for group in by_prompt.values():
        responses = {tuple(r["input_ids"][r["prompt_len"]:]) for r in group}
        assert len(responses) == 3  # T = 1: three different samples of one prompt
        assert all(len(r["input_ids"]) - r["prompt_len"] <= 12 for r in group)
    data, meta = load_synthetic(tmp_path)
    assert meta["rows"] == len(rows) == 3 * len(by_prompt) == result.metadata["rows"]
    # All responses of one prompt sit in the same split.
    for split in ("train", "validation"):
        ids = set(data[split]["source_id"])
        other = set(data["validation" if split == "train" else "train"]["source_id"])
        assert not ids & other


def test_one_response_per_prompt_is_reproducible_and_indexed_zero(verifier, prompts, tmp_path):
    one = dataclasses.replace(SETTINGS, responses_per_prompt=1)
    run(verifier, prompts, tmp_path / "a", one)
    run(verifier, prompts, tmp_path / "b", dataclasses.replace(one, responses_per_prompt=1))
    assert read_rows(rows_path(tmp_path / "a")) == read_rows(rows_path(tmp_path / "b"))
    assert {r["response_index"] for r in read_rows(rows_path(tmp_path / "a"))} == {0}


def test_resume_with_several_responses_gives_the_uninterrupted_rows(verifier, prompts, tmp_path):
    run(verifier, prompts, tmp_path / "full")
    expected = read_rows(rows_path(tmp_path / "full"))

    def crash(indices, rows):
        raise Crash

    with pytest.raises(Crash):
        run(verifier, prompts, tmp_path / "cut", on_batch=crash)
    run(verifier, prompts, tmp_path / "cut")
    key = lambda r: (r["source_index"], r["response_index"])
    assert sorted(read_rows(rows_path(tmp_path / "cut")), key=key) == sorted(expected, key=key)


def test_runs_with_other_seeds_merge_and_the_same_run_twice_is_refused(verifier, prompts, tmp_path):
    run(verifier, prompts, tmp_path / "s7")
    run(verifier, prompts, tmp_path / "s8", dataclasses.replace(SETTINGS, seed=8))
    _, meta = load_synthetic([tmp_path / "s7", tmp_path / "s8"])
    assert meta["rows"] == 2 * read_rows(rows_path(tmp_path / "s7")).__len__()
    run(verifier, prompts, tmp_path / "again")
    with pytest.raises(SynthDataError, match="given twice"):
        load_synthetic([tmp_path / "s7", tmp_path / "again"])


@pytest.mark.parametrize("field,value", [("responses_per_prompt", 0), ("max_new_tokens", 0)])
def test_bad_values_name_the_key(field, value):
    with pytest.raises(ValueError, match=f"synth.{field}"):
        dataclasses.replace(SETTINGS, **{field: value})
