"""Seeding the suffix drafter's global tree from task=synth responses (specbench/drafters/suffix_seed.py,
docs/drafters-model-free.md): the cache holds exactly the loss-masked response tokens, a decode of a prompt
the verifier answered before drafts from the seeded tree and stays the verifier's own greedy output, and bad
files or directories fail with errors that name them. Tiny seeded random verifier (specbench.models.tiny)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers import compose_config

from specbench.data.prompts import Prompt
from specbench.data.synth_dataset import load_synthetic
from specbench.decoding import GenerationSettings, SpeculativeEngine
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.suffix import SuffixDrafter, write_cache
from specbench.drafters.suffix_seed import main, seed_cache
from specbench.models.loading import ModelSpec, load_verifier
from specbench.models.tiny import EOS_ID, PAD_ID
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.tasks.eval import EvalTask

NEW_TOKENS = 24
SAMPLER = DraftSampler(Warping(), torch.Generator().manual_seed(0), DraftSchedule())


@pytest.fixture(scope="module")
def verifier():
    spec = ModelSpec(kind="tiny_random", name="tiny-seed-verifier", num_layers=3, seed=3)
    return load_verifier(spec, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def synth_dir(verifier, tmp_path_factory):
    """Greedy responses of the tiny verifier to 8 prompts (2 of them in the validation split)."""
    words = ["amber", "basil", "cedar", "dune", "ember", "fjord", "grove", "heath"]
    prompts = [Prompt(i, f"{words[i]} {words[(5 * i + 2) % 8]} {i}") for i in range(8)]
    settings = SynthSettings(
        target_len=44 + NEW_TOKENS,
        max_prompt_len=44,
        temperature=0.0,
        batch_size=4,
        validation_fraction=0.25,
        max_new_tokens=NEW_TOKENS,
    )
    out = tmp_path_factory.mktemp("seed-synth")
    synthesize(verifier, prompts, settings, out, progress=False)
    return out


def engine(verifier, drafter):
    return SpeculativeEngine(
        verifier.model,
        drafter,
        None,
        DraftSchedule("constant", 8),
        GenerationSettings(max_new_tokens=NEW_TOKENS),
        eos_token_ids=(EOS_ID,),
        pad_token_id=PAD_ID,
    )


def test_the_cache_holds_the_response_tokens_of_every_split(synth_dir, tmp_path):
    data, _ = load_synthetic(str(synth_dir))
    rows = list(data["train"]) + list(data["validation"])
    path, count, tokens = seed_cache(str(synth_dir), tmp_path / "seed.json")
    expected = [r["input_ids"][r["prompt_len"] :] for r in rows]
    assert all(sum(r["loss_mask"][: r["prompt_len"]]) == 0 for r in rows)  # prompts are never counted
    assert SuffixDrafter(backend="python", cache_file=str(path)).cached_responses == expected
    assert (count, tokens) == (len(rows), sum(map(len, expected)))
    payload = json.loads(path.read_text())
    assert payload["source"]["tokenizer_hash"] and payload["source"]["splits"] == ["train", "validation"]
    _, train_only, _ = seed_cache(str(synth_dir), tmp_path / "train.json", splits=["train"])
    assert train_only == len(data["train"])


def test_a_seeded_drafter_drafts_an_answer_it_has_seen_and_stays_lossless(verifier, synth_dir, tmp_path):
    path, _, _ = seed_cache(str(synth_dir), tmp_path / "seed.json")
    row = load_synthetic(str(synth_dir))[0]["validation"][0]
    prompt, response = row["input_ids"][: row["prompt_len"]], row["input_ids"][row["prompt_len"] :]
    autoregressive = engine(verifier, None).generate([prompt])[0].output_ids
    assert autoregressive[: len(response)] == response  # greedy synth = the verifier's own greedy answer
    seeded = engine(verifier, SuffixDrafter(backend="python", cache_file=str(path))).generate([prompt])[0]
    empty = engine(verifier, SuffixDrafter(backend="python")).generate([prompt])[0]
    assert seeded.output_ids == empty.output_ids == autoregressive
    accepted = [sum(r.accepted for r in result.rounds) for result in (seeded, empty)]
    # The seeded tree holds the whole answer: its drafts are accepted (a chain may run past the token
    # budget), and the chains grow with the match (at most one draft per matched token), so all but a few
    # of the tokens are drafts.
    assert sum(r.drafted for r in seeded.rounds) - 2 <= accepted[0] >= len(autoregressive) - 6
    assert accepted[1] < accepted[0] / 2


def test_bad_input_fails_with_a_clear_error(synth_dir, tmp_path, capsys):
    assert main([str(tmp_path / "missing"), "--out", str(tmp_path / "x.json")]) == 2
    assert "missing" in capsys.readouterr().err
    assert main([str(synth_dir), "--out", str(tmp_path / "x.json"), "--splits", "test"]) == 2
    assert "unknown synth split" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_text('{"format": "specbench.suffix-cache", "responses": [[1, 2')
    with pytest.raises(ValueError, match="unreadable suffix cache"):
        SuffixDrafter(backend="python", cache_file=str(corrupt))
    corrupt.write_text('{"format": "specbench.suffix-cache", "responses": 3}')
    with pytest.raises(ValueError, match="'responses', a list"):
        SuffixDrafter(backend="python", cache_file=str(corrupt))


def test_saving_over_a_seed_keeps_it_whole_with_its_source(synth_dir, tmp_path):
    path, count, _ = seed_cache(str(synth_dir), tmp_path / "seed.json")
    source = json.loads(path.read_text())["source"]
    drafter = SuffixDrafter(backend="python", cache_file=str(path))
    drafter.save_cache()
    assert len(SuffixDrafter(backend="python", cache_file=str(path)).cached_responses) == count
    assert json.loads(path.read_text())["source"] == source
    assert not list(tmp_path.glob("*.partial"))


@pytest.mark.parametrize("update", [True, False])
def test_an_eval_run_writes_its_outputs_into_the_cache_only_when_asked(synth_dir, tmp_path, update):
    path, count, _ = seed_cache(str(synth_dir), tmp_path / "seed.json")
    before = path.read_bytes()
    overrides = [
        "model/verifier=tiny-random",
        "model/drafter=suffix",
        "gen.max_new_tokens=8",
        "dataset.limit=3",
    ]
    overrides += [
        f"model.drafter.params.{k}={v}" for k, v in [("cache_file", path), ("update_cache_file", update)]
    ]
    EvalTask(compose_config([*overrides, f"eval.output_dir={tmp_path / 'out'}", "tracking=none"])).run()
    after = SuffixDrafter(backend="python", cache_file=str(path)).cached_responses
    if update:
        assert len(after) == count + 3
    else:
        assert path.read_bytes() == before


def test_a_read_only_cache_must_exist_and_loads_from_the_project_root(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="does not exist; a read-only cache"):
        SuffixDrafter(backend="python", cache_file=str(tmp_path / "none.json"), update_cache_file=False)
    monkeypatch.chdir(tmp_path)  # the committed seed of model/drafter=suffix-smollm2, from elsewhere
    seeded = SuffixDrafter(
        backend="python",
        cache_file="checkpoints/suffix-seed-smollm2-135m/responses.json",
        update_cache_file=False,
    )
    payload = json.loads(Path(seeded.cache_file).read_text())
    assert seeded.seeded_responses == len(payload["responses"]) == 386
    assert payload["source"]["tokenizer_hash"] == "1e1f19caccf1afb4"  # the embedded SmolLM2's tokenizer
    assert payload["source"]["sampling"]["temperature"] == 0.0


@pytest.mark.parametrize("limit", [-1, 2])  # 2: the warm-up's request evicts a seeded one, which comes back
def test_a_warm_up_leaves_no_trace_in_the_global_tree(verifier, synth_dir, tmp_path, limit):
    from specbench.evaluation import warm_up

    data = load_synthetic(str(synth_dir))[0]
    rows = list(data["train"])[:2]
    seed = tmp_path / "seed.json"
    write_cache(seed, [r["input_ids"][r["prompt_len"] :] for r in rows], 24)
    drafter = SuffixDrafter(backend="python", cache_file=str(seed), max_cached_requests=limit)
    prompt = data["validation"][0]["input_ids"][: data["validation"][0]["prompt_len"]]
    warm_up(engine(verifier, drafter), prompt, max_new_tokens=NEW_TOKENS)
    fresh = SuffixDrafter(backend="python", cache_file=str(seed), max_cached_requests=limit)
    assert drafter.cached_responses == fresh.cached_responses
    # The tree itself is the seed's again: both draft the same from every context, and the warm-up's
    # answer is not drafted when its prompt is decoded.
    results = [engine(verifier, d).generate([prompt])[0] for d in (drafter, fresh)]
    assert [(r.drafted, r.accepted) for r in results[0].rounds] == [
        (r.drafted, r.accepted) for r in results[1].rounds
    ]
    for row in rows:
        context = row["input_ids"][: row["prompt_len"] + 6]
        proposals = []
        for d in (drafter, fresh):
            state = BatchState.create([context], 8, 1000, [EOS_ID], PAD_ID, "cpu")
            d.prefill(state, None)
            proposals.append(d.propose(state, torch.tensor([8]), SAMPLER).tokens.tolist())
        assert proposals[0] == proposals[1]


def test_timing_a_cost_profile_teaches_the_drafter_nothing(verifier, synth_dir, tmp_path):
    from specbench.evaluation import measure_profile

    path, _, _ = seed_cache(str(synth_dir), tmp_path / "seed.json")
    drafter = SuffixDrafter(backend="python", cache_file=str(path))
    before = drafter.cached_responses
    prompts = [r["input_ids"][: r["prompt_len"]] for r in load_synthetic(str(synth_dir))[0]["validation"]]
    profile = measure_profile(verifier, drafter, 320, 3, context_len=8, repeats=1, prompts=prompts)
    assert profile.meta["drafted_tokens_timed"] > 0  # it did decode with the drafter
    assert drafter.cached_responses == before


def test_a_warm_up_leaves_no_trace_in_a_fallback_drafters_lookup(verifier, synth_dir, tmp_path):
    from specbench.drafters.fallback import FallbackDrafter
    from specbench.drafters.ngram import NgramDrafter
    from specbench.evaluation import warm_up

    path, _, _ = seed_cache(str(synth_dir), tmp_path / "seed.json")
    lookup = SuffixDrafter(backend="python", cache_file=str(path))
    before = lookup.cached_responses
    drafter = FallbackDrafter(lookup, NgramDrafter(1, 3, 4), 320)
    prompt = [40, 41, 42, 43, 44]
    warm_up(engine(verifier, drafter), prompt, max_new_tokens=NEW_TOKENS)
    assert lookup.cached_responses == before
    engine(verifier, drafter).generate([prompt])  # a real request is remembered
    assert len(lookup.cached_responses) == len(before) + 1
