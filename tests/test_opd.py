"""On-policy distillation (specbench/training/opd.py, eagle3_opd.py; docs/training.md#on-policy-distillation).

The rollout walk against a hand-worked example and against the decoding engine (the rounds it visits are the
rounds greedy speculative decoding runs, restarting after every rejection); the loss against a brute-force
KL at the judged drafts; a head that is the target accepts everything at zero loss; gradients reach only
the head; a short run lowers the loss and raises the rollout's acceptance; method=eagle3_opd composes,
refuses a run without an SFT head, and logs its rollout and the compute measure SFT logs too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import compose_config
from test_eagle3 import (  # noqa: F401  (fixtures: synth_dir, data, trained_head)
    VOCAB,
    batch_of,
    data,
    engine_for,
    fit,
    perturbed_head,
    synth_dir,
    tiny_verifier,
    train_cfg,
    trained_head,
)

from specbench.config.methods import normalize_method
from specbench.config.train_checks import validate_train
from specbench.data.synth_dataset import load_synthetic
from specbench.drafters.eagle3.head import Eagle3Head
from specbench.errors import ConfigError
from specbench.models.draft_vocab import DraftVocab
from specbench.models.tiny import EOS_ID, PAD_ID
from specbench.training.eagle3 import build_eagle3_training, ttt_loss
from specbench.training.eagle3_opd import chain_rollout, opd_loss, unrolled_drafts
from specbench.training.objectives import build_training
from specbench.training.opd import leading_accepts, walk_rounds
from specbench.training.trainer import export_trained


@pytest.fixture(scope="module")
def verifier():
    return tiny_verifier()


@pytest.fixture(scope="module")
def rows(synth_dir):  # noqa: F811
    return load_synthetic(str(synth_dir))[0]["train"]


@pytest.fixture(scope="module")
def sft_head(trained_head):  # noqa: F811
    """test_eagle3's SFT head (80 TTT steps, 64-token vocabulary): it accepts some drafts, misses others."""
    return trained_head


# --- the walk --------------------------------------------------------------------------------------------


def test_leading_accepts_stop_at_the_first_mismatch():
    matches = torch.tensor([[1, 1, 0, 1], [0, 1, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)
    assert leading_accepts(matches).tolist() == [2, 0, 4]


def test_walk_commits_the_accepted_drafts_and_the_targets_token_then_replays_from_there():
    # start s: accepted count a(s); a round commits a + 1 tokens, the next starts at s + a + 1
    accepts = torch.tensor([[1, 9, 3, 0, 0, 2, 0, 0, 0, 0]])
    room = torch.tensor([[10, 9, 8, 7, 6, 5, 4, 3, 2, 1]])
    out = walk_rounds(accepts, torch.tensor([0]), room, gamma=3)
    assert out.visited[0].nonzero().flatten().tolist() == [0, 2, 6, 7, 8, 9]
    assert out.accepted[0].tolist() == [1, 0, 3, 0, 0, 0, 0, 0, 0, 0]  # a(1) = 9 is never visited
    assert out.reach[0].tolist() == [2, 0, 3, 0, 0, 0, 1, 1, 1, 1]  # min(a + 1, γ, room)
    assert out.rejected[0].nonzero().flatten().tolist() == [0, 6, 7, 8, 9]  # start 2 accepted all γ
    assert int(out.rounds[0]) == 6 and int(out.committed[0]) == 10 and out.tau == pytest.approx(10 / 6)
    empty = walk_rounds(accepts, torch.tensor([-1]), room, gamma=3)
    assert not empty.visited.any() and empty.tau == 0.0


def test_the_rollout_visits_the_rounds_greedy_decoding_runs(verifier, rows, sft_head):
    """Round by round, the accepted counts of the rollout are the engine's when it decodes the prompt with
    the same head and γ: the walk restarts exactly where verification rejected."""
    gamma = 3
    batch = batch_of(rows, verifier, sft_head.taps, sft_head.vocab)
    with torch.no_grad():
        _, heads, inside, drafts = unrolled_drafts(sft_head, batch, gamma)
    rollout = chain_rollout(batch, heads, inside, drafts, gamma)
    engine = engine_for(verifier, sft_head, gamma=gamma, max_new=64)
    compared, rejected = 0, 0
    for b, row in enumerate(rows):
        response = row["input_ids"][row["prompt_len"] :]
        result = engine.generate([row["input_ids"][: row["prompt_len"]]])[0]
        if result.output_ids[: len(response)] != response:
            continue  # the synth row and the engine's greedy text differ (a float tie): not comparable
        starts = rollout.visited[b].nonzero().flatten().tolist()
        walked = [int(rollout.accepted[b, s]) for s in starts]
        decoded = [r.accepted for r in result.rounds]
        assert walked[:-1] == decoded[: len(walked) - 1]  # the last round is cut by the row's end
        assert starts[0] == row["prompt_len"] - 2  # round 1 drafts the first response token
        rejected += int(rollout.rejected[b].sum())
        compared += 1
    assert compared >= 10 and rejected > 0
    assert 1.0 < rollout.tau < gamma + 1


# --- the loss --------------------------------------------------------------------------------------------


def brute_force_loss(head, batch, gamma):
    """Σ over visited round starts t, judged depths i < reach(t) of KL(p_{t+1+i} ‖ q_{t,i}) / their number."""
    outputs, heads, inside, drafts = unrolled_drafts(head, batch, gamma)
    rollout = chain_rollout(batch, heads, inside, drafts, gamma)
    total, count = 0.0, 0
    for b in range(heads.shape[0]):
        for w in range(heads.shape[1]):
            t = int(heads[b, w])
            if not (inside[b, w] and rollout.visited[b, t]):
                continue
            for i in range(int(rollout.reach[b, t])):
                count += 1
                if not batch["in_vocab"][b, t + 1 + i]:
                    continue
                log_q = F.log_softmax(head.logits(outputs[i][b, w]).float(), dim=-1)
                log_p = F.log_softmax(batch["target_values"][b, t + 1 + i].float(), dim=-1)
                total += float((log_p.exp() * (log_p - log_q)).sum())
    return total / count, count


def test_the_loss_is_the_kl_against_the_target_at_the_drafts_the_rollout_judged(verifier, rows, sft_head):
    batch = batch_of(rows, verifier, sft_head.taps, sft_head.vocab)
    with torch.no_grad():
        out = opd_loss(sft_head, batch, 3)
        expected, judged = brute_force_loss(sft_head, batch, 3)
        sft = ttt_loss(sft_head, batch, 3)["loss"]
    assert float(out["loss"]) == pytest.approx(expected, rel=1e-5)
    assert judged == int(sum(out["positions"])) and judged < int(
        sum(ttt_loss(sft_head, batch, 3)["positions"])
    )
    assert float(out["loss"]) != pytest.approx(float(sft), rel=1e-2)  # not the SFT objective renamed


def self_target_batch(head, length=24, prompt=4, seed=0):
    """A row the head itself wrote: token t + 2 is the head's step-0 argmax at index t, and the target's
    logits at position t + 1 are the head's own: a drafter identical to the target."""
    generator = torch.Generator().manual_seed(seed)
    hidden = head.config.hidden_size
    features = torch.randn(1, length, len(head.taps) * hidden, generator=generator)
    ids = torch.randint(3, VOCAB, (1, length), generator=generator)
    attention = torch.ones(1, length, dtype=torch.long)
    with torch.no_grad():
        for t in range(prompt - 2, length - 2):
            outputs, _, _ = head.unroll(ids[:, 1:], features[:, :-1], attention[:, 1:].bool(), 1)
            ids[0, t + 2] = int(head.logits(outputs[0][0, t]).argmax())
        outputs, _, _ = head.unroll(ids[:, 1:], features[:, :-1], attention[:, 1:].bool(), 1)
        values = torch.zeros(1, length, VOCAB)
        values[0, 1:] = head.logits(outputs[0][0]).float()
    predict = torch.zeros(1, length, dtype=torch.bool)
    predict[0, prompt - 1 : length - 1] = True
    return {
        "input_ids": ids, "attention_mask": attention, "features": features, "predict": predict,
        "in_vocab": torch.ones(1, length, dtype=torch.bool), "target_values": values,
        "loss_mask": torch.cat([torch.zeros(1, prompt), torch.ones(1, length - prompt)], dim=1).long(),
    }  # fmt: skip


def test_a_head_identical_to_the_target_has_every_draft_accepted_at_zero_loss(verifier):
    head = perturbed_head(verifier, DraftVocab.full(VOCAB), seed=3)
    batch = self_target_batch(head)
    with torch.no_grad():
        out = opd_loss(head, batch, 1)
    rollout = out["rollout"]
    assert int(rollout.rejected.sum()) == 0 and rollout.tau == pytest.approx(2.0)  # γ + 1 every round
    assert abs(float(out["loss"])) < 1e-5
    batch["target_values"][0, 5] += torch.randn(VOCAB)  # the target disagrees once: the loss sees it
    assert float(opd_loss(head, batch, 1)["loss"]) > 1e-4


def test_gradients_reach_only_the_head(verifier, rows, sft_head):
    head = Eagle3Head.for_verifier(verifier.model, sft_head.vocab)
    head.load_state_dict(sft_head.state_dict())
    head.train()
    batch = batch_of(rows, verifier, head.taps, head.vocab)
    opd_loss(head, batch, 3)["loss"].backward()
    assert all(p.grad is None for p in verifier.model.parameters())  # its embedding included
    trained = [name for name, p in head.named_parameters() if p.requires_grad and p.grad is not None]
    assert trained and any("fc" in n for n in trained) and any("lm_head" in n for n in trained)


def test_a_short_opd_run_lowers_the_loss_and_raises_the_rollout_acceptance(verifier, rows, sft_head):
    torch.manual_seed(0)
    head = Eagle3Head.for_verifier(verifier.model, sft_head.vocab)
    head.load_state_dict(sft_head.state_dict())
    head.train()
    batch = batch_of(rows, verifier, head.taps, head.vocab)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    first = opd_loss(head, batch, 3)
    for _ in range(40):  # 25 steps gave 0.702x on an AVX2-only CPU: too close to the bound
        out = opd_loss(head, batch, 3)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    last = opd_loss(head, batch, 3)
    assert float(last["loss"]) < 0.7 * float(first["loss"])
    assert last["rollout"].tau > first["rollout"].tau + 0.1
    assert int(last["rollout"].rejected.sum()) < int(first["rollout"].rejected.sum())


# --- the method --------------------------------------------------------------------------------------------


def test_eagle3_opd_is_one_method_away_and_needs_an_sft_head(tmp_path):
    cfg = compose_config(["task=train", "method=eagle3_opd", f"train.data={tmp_path}", "runtime.device=cpu"])
    assert cfg.method.objective == "opd" and "eagle3" in cfg.model.drafter._target_
    with pytest.raises(ConfigError, match="distils on-policy from an SFT-trained eagle3 drafter.*init_head"):
        validate_train(cfg)
    plain = compose_config(["task=train", "method=eagle3", f"train.data={tmp_path}", "runtime.device=cpu"])
    assert plain.method.objective == "sft"
    by_name = compose_config(["task=train", "method.name=eagle3_opd", "model/drafter=eagle3"])
    assert normalize_method(by_name) == ("eagle3", "eagle3_opd") and by_name.method.objective == "opd"


def test_a_lightning_opd_run_from_an_sft_head_logs_its_rollout_and_compute(verifier, synth_dir, tmp_path):  # noqa: F811
    sft_cfg = train_cfg(synth_dir, tmp_path, val_prompts=0)
    sft, _, sft_metrics = fit(sft_cfg, verifier, tmp_path / "sft", 2)
    assert {"train/verifier_tokens", "train/head_tokens", "train/wall_seconds"} <= set(sft_metrics.last)
    init = export_trained(sft, sft.metadata(), tmp_path / "sft.pt")
    cfg = train_cfg(synth_dir, tmp_path, init_head=str(init), val_prompts=0)
    cfg.method = {"objective": "opd", "opd_gamma": 2}
    module, _, metrics = fit(cfg, verifier, tmp_path / "opd", 2)
    assert module.steps == 2 and module.metadata()["objective"] == "opd"
    assert module.metadata()["init_head"] == str(init) and module.metadata()["method"] == "eagle3"
    logged = set(metrics.last)
    assert {"train/rollout_tau", "train/rollout_rejected", "val/rollout_tau", "val/opd_loss"} <= logged
    assert metrics.last["train/verifier_tokens"] > 0 and metrics.last["train/head_tokens"] > 0
    first = metrics.last["train/verifier_tokens"]
    _, _, resumed = fit(cfg, verifier, tmp_path / "opd", 4)  # resumed: the counters go on
    assert resumed.last["train/verifier_tokens"] > first
    with pytest.raises(ValueError, match="method.objective=opd trains a opd module, not Eagle3Training"):
        build_eagle3_training(cfg, verifier, VOCAB, [EOS_ID], PAD_ID)  # SFT's module for an OPD config
    cfg.method = {"objective": "opd"}
    cfg.train.init_head = None
    with pytest.raises(ValueError, match="train.init_head"):
        build_training("eagle3", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)
