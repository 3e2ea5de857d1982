"""train.data_tokens: nested token budgets of one corpus, validation whole, one draft vocabulary (so one
feature cache) for every budget; train.drop_heldout_overlap: rows whose prompt overlaps a held-out question
are left out."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from helpers import compose_config
from test_eagle3 import VOCAB, tiny_verifier, train_cfg

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.config import ConfigError
from specbench.config.validate import validate_train
from specbench.data.prompt_corpus import excluded_texts
from specbench.data.prompts import Prompt
from specbench.data.synth_dataset import load_synthetic
from specbench.models.tiny import EOS_ID, PAD_ID
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.training.data_budget import training_rows
from specbench.training.objectives import build_training

HELD_OUT = excluded_texts()[0]  # the first turn of a Spec-Bench question outside the train part


@pytest.fixture(scope="module")
def verifier():
    return tiny_verifier()


@pytest.fixture(scope="module")
def synth_dir(verifier, tmp_path_factory):
    words = ["apple", "river", "stone", "cloud", "engine", "garden", "violin", "planet", "copper", "lantern"]
    prompts = [Prompt(i, f"{words[i % 10]} {words[(3 * i + 1) % 10]} {i}") for i in range(24)]
    words_held_out = " ".join(HELD_OUT.split()[:10])  # 10 consecutive words of a held-out question
    prompts += [Prompt(24 + i, f"{lead} {words_held_out}") for i, lead in enumerate(["Help:", "Now", "Q:"])]
    settings = SynthSettings(
        target_len=150, max_prompt_len=130, temperature=1.0, batch_size=10, validation_fraction=0.2, seed=0
    )
    out = tmp_path_factory.mktemp("budget-synth")
    synthesize(verifier, prompts, settings, out, progress=False)
    return out


def budget(**train):
    return SimpleNamespace(**{"data_tokens": None, "data_seed": 0, "drop_heldout_overlap": False, **train})


def test_budgets_nest_and_reach_their_token_count(verifier, synth_dir):
    data, _ = load_synthetic(str(synth_dir))
    split = data["train"]
    generated = [sum(mask) for mask in split["loss_mask"]]
    assert training_rows(split, verifier.tokenizer, budget()).rows is None  # no budget: every row
    chosen, total_tokens = {}, sum(generated)
    budgets = (total_tokens // 8, total_tokens // 3, 2 * total_tokens // 3)
    for tokens in budgets:
        picked = training_rows(split, verifier.tokenizer, budget(data_tokens=tokens))
        total = sum(generated[i] for i in picked.rows)
        assert total >= tokens and picked.info["train_generated_tokens"] == total
        assert picked.info == {**picked.info, "data_tokens": tokens, "train_rows_used": len(picked.rows)}
        chosen[tokens] = set(picked.rows)
    small, middle, large = (chosen[tokens] for tokens in budgets)
    assert small < middle < large < set(range(len(split)))
    other_order = training_rows(split, verifier.tokenizer, budget(data_tokens=budgets[1], data_seed=1))
    assert set(other_order.rows) != middle  # data_seed orders the rows
    everything = training_rows(split, verifier.tokenizer, budget(data_tokens=10**9))
    assert everything.rows == list(range(len(split)))  # a budget past the corpus takes all of it


def test_rows_overlapping_heldout_questions_are_dropped(verifier, synth_dir):
    data, _ = load_synthetic(str(synth_dir))
    split = data["train"]
    ids = list(split["source_index"])
    overlapping = [i for i, source in enumerate(ids) if source >= 24]
    assert overlapping, "the test needs an overlapping prompt in the training split"
    kept = training_rows(split, verifier.tokenizer, budget(drop_heldout_overlap=True))
    assert kept.info["heldout_overlap_rows_dropped"] == len(overlapping)
    assert sorted(kept.rows) == [i for i in range(len(ids)) if i not in overlapping]
    both = budget(data_tokens=10**9, drop_heldout_overlap=True)
    with_budget = training_rows(split, verifier.tokenizer, both)
    assert with_budget.rows == kept.rows


def test_eagle3_training_reads_only_the_budget_and_the_whole_validation_split(verifier, synth_dir, tmp_path):
    cfg = train_cfg(synth_dir, tmp_path, data_tokens=100, data_seed=0, drop_heldout_overlap=False,
                    feature_cache=None, val_prompts=0, draft_vocab_size=None)  # fmt: skip
    module, datamodule = build_training("eagle3", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)
    data, _ = load_synthetic(str(synth_dir))
    picked = training_rows(data["train"], verifier.tokenizer, cfg.train)
    assert len(datamodule.rows("train")) == len(picked.rows) < len(data["train"])
    assert len(datamodule.rows("validation")) == len(data["validation"])
    assert module.metadata()["train_rows_used"] == len(picked.rows)
    assert module.metadata()["data_tokens"] == 100
    first = datamodule.rows("train")[0]
    assert first["input_ids"] == data["train"][picked.rows[0]]["input_ids"]


def test_every_budget_reads_one_feature_cache(verifier, synth_dir, tmp_path):
    """The small budget's run passes only its rows through the verifier; the whole corpus' run then computes
    the rest into the same cache."""
    modules, covered = [], []
    for tokens in (60, None):  # a budget, then the whole corpus, on the same cache
        cfg = train_cfg(synth_dir, tmp_path, data_tokens=tokens, data_seed=0, drop_heldout_overlap=False,
                        val_prompts=0, draft_vocab_size=40)  # fmt: skip
        module, datamodule = build_training("eagle3", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)
        datamodule.prepare_data()
        datamodule.setup("fit")  # builds the budget's rows the first time, adds the others the second
        row = datamodule.rows("train")[0]
        assert "target_values" in row  # read from the cache
        modules.append(module)
        covered.append(np.load(Path(cfg.train.feature_cache) / "train-covered.npy"))
    budget_cfg = train_cfg(synth_dir, tmp_path, data_tokens=60, data_seed=0, drop_heldout_overlap=False)
    picked = training_rows(load_synthetic(str(synth_dir))[0]["train"], verifier.tokenizer, budget_cfg.train)
    assert np.flatnonzero(covered[0]).tolist() == picked.rows and covered[1].all()
    assert modules[0].metadata()["train_rows_used"] < len(load_synthetic(str(synth_dir))[0]["train"])
    assert torch.equal(modules[0].head.vocab.draft_ids, modules[1].head.vocab.draft_ids)


def test_a_budget_for_a_method_that_does_not_read_it_is_a_config_error():
    cfg = compose_config(["task=train", "model/verifier=tiny-random", "model/drafter=tiny-random",
                          "method=distill", "steering=none", "train.data=.",
                          "train.data_tokens=1000"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"train\.data_tokens chooses rows for method=eagle3 or dflash"):
        validate_train(cfg)
    bad = compose_config(["task=train", "method=eagle3", "model/drafter=eagle3", "train.data=.",
                          "train.data_tokens=0"])  # fmt: skip
    with pytest.raises(ConfigError, match=r"train\.data_tokens must be >= 1"):
        validate_train(bad)
