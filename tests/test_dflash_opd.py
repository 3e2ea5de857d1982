"""On-policy distillation of DFlash drafters (specbench/training/dflash_opd.py; docs/training.md).

The rollout's rounds against a walk of decoding's own blocks (one decoding forward per round); a drafter
that wrote the data has every draft accepted; the loss scores exactly the judged slots; a short run raises
the rollout's acceptance; method=dflash_opd continues an SFT drafter through Lightning (shape checked) and
logs its rollout and compute.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from test_dflash_training import (
    VOCAB,
    WIDTH,
    batch_of,
    data,  # noqa: F401  (fixture)
    decoding_block,
    fit,
    random_draft,
    settings,
    synth_dir,  # noqa: F401  (fixture)
    tiny_verifier,
    train_cfg,
)

from specbench.drafters.dflash.checkpoint import DFlashCheckpointError
from specbench.models.draft_vocab import DraftVocab
from specbench.models.tiny import EOS_ID, PAD_ID
from specbench.training.dflash import block_hidden, block_loss, build_dflash_training, vocab_logits
from specbench.training.dflash_opd import DFlashOpdTraining, block_rollout
from specbench.training.objectives import build_training
from specbench.training.trainer import export_trained

FULL = DraftVocab.full(VOCAB)


@pytest.fixture(scope="module")
def verifier():
    return tiny_verifier()


def opd_module(verifier, draft, gamma=WIDTH - 1):
    train = SimpleNamespace(seed=0, lr_start=1e-3, weight_decay=0.0, **vars(settings(dflash_anchors=64)))
    return DFlashOpdTraining(verifier.model, draft, train, FULL, {}, gamma=gamma)


def decoded_rounds(verifier, draft, ids, prompt_len, gamma):
    """Greedy speculative decoding's accepted counts along ``ids`` (the target's continuation), one decoding
    block per round: draft k is accepted while it equals the next token of ``ids``."""
    lm_head = verifier.model.get_output_embeddings()
    accepted, anchor = [], prompt_len - 1
    while anchor + 1 < len(ids):
        with torch.no_grad():
            drafts = vocab_logits(lm_head, decoding_block(verifier, draft, ids, anchor), FULL).argmax(-1)
        left = min(gamma, len(ids) - anchor - 1)
        count = 0
        while count < left and int(drafts[count]) == ids[anchor + 1 + count]:
            count += 1
        accepted.append(count)
        anchor += count + 1
    return accepted


def test_the_rollout_runs_the_rounds_of_decodings_own_blocks(verifier, data):  # noqa: F811
    draft = random_draft(verifier, seed=2).eval()
    rows = [data["train"][i] for i in range(4)]
    batch = batch_of(rows, verifier, draft)
    rollout, slots = block_rollout(opd_module(verifier, draft), batch, 3)
    for b, row in enumerate(rows):
        starts = rollout.visited[b].nonzero().flatten().tolist()
        assert starts[0] == row["prompt_len"] - 1
        walked = [int(rollout.accepted[b, s]) for s in starts]
        assert walked == decoded_rounds(verifier, draft, row["input_ids"], row["prompt_len"], 3)
    assert slots == int(sum(len(r["input_ids"]) - r["prompt_len"] for r in rows)) * WIDTH


def test_a_drafter_that_wrote_the_data_has_every_draft_accepted(verifier):
    draft = random_draft(verifier, seed=4).eval()
    lm_head = verifier.model.get_output_embeddings()
    prompt_len, length = 6, 20
    ids = torch.randint(3, VOCAB - 3, (length,), generator=torch.Generator().manual_seed(0)).tolist()
    for anchor in range(prompt_len - 1, length - 1):  # the token after each anchor: the drafter's first slot
        with torch.no_grad():
            ids[anchor + 1] = int(
                vocab_logits(lm_head, decoding_block(verifier, draft, ids, anchor), FULL)[0].argmax()
            )
    row = {
        "input_ids": ids,
        "prompt_len": prompt_len,
        "loss_mask": [0] * prompt_len + [1] * (length - prompt_len),
    }
    rollout, _ = block_rollout(opd_module(verifier, draft, 1), batch_of([row], verifier, draft), 1)
    assert int(rollout.rejected.sum()) == 0 and rollout.tau == pytest.approx(2.0)


def test_the_loss_scores_exactly_the_judged_slots_with_equal_weights(verifier, data):  # noqa: F811
    draft = random_draft(verifier, seed=5)
    rows = [data["train"][i] for i in range(3)]
    batch = batch_of(rows, verifier, draft)
    anchors = torch.tensor([[r["prompt_len"] - 1, r["prompt_len"] + 3] for r in rows])
    keep = torch.ones_like(anchors, dtype=torch.bool)
    reach = torch.tensor([[1, 3], [4, 2], [2, 1]])
    embedding, lm_head = verifier.model.get_input_embeddings(), verifier.model.get_output_embeddings()
    with torch.no_grad():
        out = block_loss(draft, embedding, lm_head, batch, anchors, keep, WIDTH, None, FULL, reach=reach)
        hidden, _ = block_hidden(draft, embedding, batch, anchors, WIDTH)
    losses = []
    for b, row in enumerate(rows):
        for n in range(2):
            a = int(anchors[b, n])
            for k in range(1, int(reach[b, n]) + 1):
                logits = vocab_logits(lm_head, hidden[b, n, k - 1], FULL)
                losses.append(float(F.cross_entropy(logits[None], torch.tensor([row["input_ids"][a + k]]))))
    assert int(out["scored"].sum()) == len(losses) == int(reach.sum())
    assert float(out["loss"]) == pytest.approx(sum(losses) / len(losses), rel=1e-5)


def test_a_short_opd_run_raises_the_rollout_acceptance(verifier, data):  # noqa: F811
    torch.manual_seed(0)
    draft = random_draft(verifier, seed=1).train()
    module = opd_module(verifier, draft)
    batch = batch_of(list(data["train"]), verifier, draft)
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)
    first = module._opd_loss(batch, torch.Generator().manual_seed(0))
    for seed in range(40):
        out = module._opd_loss(batch, torch.Generator().manual_seed(seed))
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    assert all(p.grad is None for p in verifier.model.parameters())
    with torch.no_grad():
        last = module._opd_loss(batch, torch.Generator().manual_seed(0))
    assert float(last["loss"]) < 0.7 * float(first["loss"])
    assert last["rollout"].tau > first["rollout"].tau + 0.1


def test_dflash_opd_continues_an_sft_drafter_and_logs_its_rollout(verifier, synth_dir, tmp_path):  # noqa: F811
    sft, _, sft_metrics = fit(train_cfg(synth_dir, tmp_path, val_prompts=0), verifier, tmp_path / "sft", 2)
    assert {"train/verifier_tokens", "train/head_tokens", "train/head_grad_tokens"} <= set(sft_metrics.last)
    init = export_trained(sft, sft.metadata(), tmp_path / "sft.pt")
    cfg = train_cfg(synth_dir, tmp_path, val_prompts=0, init_head=str(init))
    cfg.method = {"objective": "opd", "opd_gamma": 3}
    module, _ = build_training("dflash", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)
    for name, param in sft.draft.state_dict().items():
        torch.testing.assert_close(module.draft.state_dict()[name], param)
    module, _, metrics = fit(cfg, verifier, tmp_path / "opd", 2)
    assert isinstance(module, DFlashOpdTraining) and module.metadata()["objective"] == "opd"
    assert {"train/rollout_tau", "train/rollout_accepted", "val/rollout_tau"} <= set(metrics.last)
    assert metrics.last["train/head_tokens"] > metrics.last["train/head_grad_tokens"] > 0  # the rollout's
    other = train_cfg(synth_dir, tmp_path, val_prompts=0, init_head=str(init), dflash_layers=1)
    with pytest.raises(DFlashCheckpointError, match="num_hidden_layers: 2 there, 1 here"):
        build_dflash_training(other, verifier, VOCAB, [EOS_ID], PAD_ID)
    cfg.method = {"objective": "opd", "opd_gamma": WIDTH}
    with pytest.raises(ValueError, match="opd_gamma"):
        build_training("dflash", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)
