"""The training-prompt manifest (dataset=corpus) and the package prompt sources it draws on: no prompt the
harness holds out or the demo shows, exactly or by a shared 8-gram; no duplicates; frozen; named errors."""

import dataclasses
import gzip
import json

import pytest
from helpers import compose_config

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


def test_missing_package_names_the_pip_command_before_any_model_loads(monkeypatch):
    from specbench.tasks.synth import SynthTask

    missing = dataclasses.replace(
        package_prompts.PACKAGE_SOURCES["chatterbot"], module="chatterbot_corpus_not_here"
    )
    monkeypatch.setitem(package_prompts.PACKAGE_SOURCES, "chatterbot", missing)
    with pytest.raises(DatasetUnavailableError, match=r"pip install chatterbot-corpus==1\.3\.3"):
        load_dataset_prompts({"name": "chatterbot"})
    cfg = compose_config(
        [
            "task=synth",
            "dataset=chatterbot",
            "model/verifier=tiny-random",
            "model/drafter=none",
            "tracking=none",
        ]
    )
    with pytest.raises(Exception, match=r"pip install chatterbot-corpus==1\.3\.3"):
        SynthTask(cfg).check()  # the task's checks: before any model loads


def test_missing_manifest_names_the_rebuild_command(monkeypatch, tmp_path):
    monkeypatch.setattr(corpus_manifest, "MANIFEST", tmp_path / "none.jsonl.gz")
    with pytest.raises(DatasetUnavailableError, match=r"python -m specbench\.data\.prompt_corpus"):
        load_dataset_prompts({"name": "corpus"})
