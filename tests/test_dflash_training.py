"""task=train method=dflash (specbench/training/dflash.py, docs/dflash.md): the training blocks are the blocks
decoding drafts (same context, same slots, same hidden states); the loss is the decayed weighted
cross-entropy; anchors are seeded response-predicting positions; a Lightning run checkpoints, resumes, loads
for lossless decoding and exports to the z-lab layout; bad settings are named."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from specbench.data.prompts import Prompt
from specbench.data.synth_dataset import load_synthetic
from specbench.decoding.engine import GenerationSettings, SpeculativeEngine
from specbench.decoding.schedules import DraftSchedule
from specbench.drafters.dflash.checkpoint import DFlashCheckpointError, load_dflash
from specbench.drafters.dflash.drafter import dflash_drafter
from specbench.drafters.dflash.export import export_trained as export_zlab
from specbench.drafters.dflash.export import main as export_main
from specbench.models.draft_vocab import DraftVocab
from specbench.models.loading import LoadedModel, load_verifier
from specbench.models.spec import ModelSpec
from specbench.models.tiny import EOS_ID, PAD_ID
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.training.batches import pad_batch, predict_positions, verifier_batch
from specbench.training.dflash import (
    block_hidden,
    block_loss,
    draft_config,
    sample_anchors,
)
from specbench.training.objectives import build_training
from specbench.training.trainer import build_trainer, export_trained, last_checkpoint

VOCAB, LAYERS, WIDTH = 259, 6, 5


def tiny_verifier(seed=0, name="tiny-dflash-verifier") -> LoadedModel:
    spec = ModelSpec(kind="tiny_random", name=name, arch="qwen3", num_layers=LAYERS, seed=seed)
    return load_verifier(spec, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def verifier() -> LoadedModel:
    return tiny_verifier()


@pytest.fixture(scope="module")
def synth_dir(verifier, tmp_path_factory):
    words = ["apple", "river", "stone", "cloud", "engine", "garden", "violin", "planet", "copper", "lantern"]
    prompts = [Prompt(i, f"{words[i % 10]} {words[(3 * i + 1) % 10]} {i}") for i in range(24)]
    settings = SynthSettings(
        target_len=48, max_prompt_len=40, temperature=0.0, batch_size=12, validation_fraction=0.2, seed=0
    )
    out = tmp_path_factory.mktemp("dflash-synth")
    synthesize(verifier, prompts, settings, out, progress=False)
    return out


@pytest.fixture(scope="module")
def data(synth_dir):
    return load_synthetic(str(synth_dir))[0]


def settings(**overrides):
    train = {
        "dflash_layers": 2, "dflash_taps": [0, 2, 4], "dflash_block_size": WIDTH,
        "dflash_mask_token_id": None, "dflash_anchors": 6, "dflash_loss_gamma": 4.0, "init_layer": "random",
    }  # fmt: skip
    train.update(overrides)
    return SimpleNamespace(**train)


def random_draft(verifier, seed=0, **overrides):
    from specbench.drafters.dflash.model import DFlashDraftModel

    torch.manual_seed(seed)
    draft = DFlashDraftModel(draft_config(verifier.model, settings(**overrides)))
    with torch.no_grad():
        for param in draft.parameters():  # norms and the mask away from 1 / 0
            param.add_(0.2 * torch.randn(param.shape))
    return draft


def batch_of(rows, verifier, draft):
    batch = pad_batch([dict(r) for r in rows], PAD_ID)
    taps = [i + 1 for i in draft.config.target_layer_ids]
    return {**batch, **verifier_batch(verifier.model, batch, taps, None)}


def decoding_block(verifier, draft, ids, anchor):
    """What decoding drafts after ``anchor + 1`` committed tokens of ``ids``: the context of positions
    < anchor from HF's hidden_states[id + 1] (z-lab's definition), block [ids[anchor], mask...]."""
    with torch.no_grad():
        states = verifier.model(torch.tensor([ids[:anchor]]), output_hidden_states=True).hidden_states
    features = torch.cat([states[i + 1] for i in draft.config.target_layer_ids], dim=-1)
    cache = draft.empty_cache(1)
    cache.append(
        draft.context_kv(features, torch.arange(anchor)[None]), torch.ones(1, anchor, dtype=torch.bool)
    )
    block = draft.block_ids(torch.tensor([ids[anchor]]), WIDTH)
    positions = anchor + torch.arange(WIDTH)[None]
    return draft(draft.embed_block(block, verifier.model.get_input_embeddings()), positions, cache)[0, 1:]


def test_training_blocks_are_the_blocks_decoding_drafts(verifier, data):
    """Many blocks of rows of different lengths in one masked forward give, block by block, the hidden states
    of the decoding path (context < anchor, RoPE positions, learned mask), taps as HF numbers them."""
    draft = random_draft(verifier).eval()
    rows = [data["train"][i] for i in range(4)]
    batch = batch_of(rows, verifier, draft)
    predict = predict_positions(batch["attention_mask"], batch["loss_mask"])
    anchors, keep = sample_anchors(predict, 5, torch.Generator().manual_seed(1))
    with torch.no_grad():
        hidden, slots = block_hidden(draft, verifier.model.get_input_embeddings(), batch, anchors, WIDTH)
    checked = 0
    for b, row in enumerate(rows):
        for n in range(anchors.shape[1]):
            if keep[b, n]:
                a = int(anchors[b, n])
                assert slots[b, n, 0] == a
                torch.testing.assert_close(hidden[b, n], decoding_block(verifier, draft, row["input_ids"], a))
                checked += 1
    assert checked >= 12


def test_anchors_are_distinct_seeded_response_predicting_positions():
    predict = torch.zeros(3, 20, dtype=torch.bool)
    predict[0, 4:15] = True
    predict[1, 10:12] = True  # fewer than asked: both, the rest not kept
    anchors, keep = sample_anchors(predict, 6, torch.Generator().manual_seed(0))
    assert anchors.shape == (3, 6) and keep.sum(dim=1).tolist() == [6, 2, 0]
    for b in range(3):
        chosen = anchors[b][keep[b]].tolist()
        assert len(set(chosen)) == len(chosen) and all(predict[b, a] for a in chosen)
    again, _ = sample_anchors(predict, 6, torch.Generator().manual_seed(0))
    assert torch.equal(anchors, again)
    counts = torch.zeros(20)
    for seed in range(300):  # uniform over the row's positions
        a, k = sample_anchors(predict[:1], 3, torch.Generator().manual_seed(seed))
        counts[a[0][k[0]]] += 1
    assert counts[:4].sum() == 0 and counts[15:].sum() == 0
    assert counts[4:15].min() > 0.6 * 300 * 3 / 11


@pytest.mark.parametrize("reduced", [False, True])
def test_loss_is_the_decayed_weighted_cross_entropy_of_scored_slots(verifier, data, reduced):
    """Over the full vocabulary, and over a draft vocabulary (its LM-head rows; a label outside it is a miss
    and out of the loss)."""
    draft = random_draft(verifier, seed=3).eval()
    rows = [data["train"][i] for i in range(3)]
    batch = batch_of(rows, verifier, draft)
    predict = predict_positions(batch["attention_mask"], batch["loss_mask"])
    anchors, keep = sample_anchors(predict, 8, torch.Generator().manual_seed(2))
    head = verifier.model.get_output_embeddings()
    gamma = 4.0
    vocab = DraftVocab(list(range(32, 100)) + [EOS_ID], VOCAB) if reduced else DraftVocab.full(VOCAB)
    with torch.no_grad():
        out = block_loss(
            draft, verifier.model.get_input_embeddings(), head, batch, anchors, keep, WIDTH, gamma, vocab
        )
        expected = _expected_loss(verifier, draft, rows, anchors, keep, head, gamma, vocab)
    total, weight, leading, correct, scored, outside = expected
    assert float(out["loss"]) == pytest.approx(total / weight, rel=1e-4)
    assert (outside > 0) == reduced  # the reduced vocabulary leaves labels outside: the miss path runs
    assert out["correct"].tolist() == correct.tolist() and out["scored"].tolist() == scored.tolist()
    assert int(out["leading"]) == leading and int(out["blocks"]) == int(keep.sum())


def _expected_loss(verifier, draft, rows, anchors, keep, head, gamma, vocab):
    """The loss and counts, block by block and slot by slot on the decoding path."""
    ids_of = vocab.draft_ids.tolist()
    outside = 0
    total = weight = leading = 0.0
    correct, scored = torch.zeros(WIDTH - 1), torch.zeros(WIDTH - 1)
    for b, row in enumerate(rows):
        ids, mask = row["input_ids"], row["loss_mask"]
        for n in range(anchors.shape[1]):
            if not keep[b, n]:
                continue
            a = int(anchors[b, n])
            logits = head(decoding_block(verifier, draft, ids, a))[:, ids_of]
            run = True
            for k in range(1, WIDTH):
                if a + k >= len(ids) or not mask[a + k]:
                    run = False
                    continue
                w = math.exp(-(k - 1) / gamma)
                weight += w
                outside += ids[a + k] not in ids_of
                if ids[a + k] in ids_of:
                    target = torch.tensor([ids_of.index(ids[a + k])])
                    total += w * float(F.cross_entropy(logits[k - 1 : k], target))
                right = ids_of[int(logits[k - 1].argmax())] == ids[a + k]
                correct[k - 1] += right
                scored[k - 1] += 1
                run = run and right
                leading += run
    return total, weight, leading, correct, scored, outside


def test_draft_config_follows_the_verifier_and_names_bad_settings(verifier):
    config = draft_config(verifier.model, settings(dflash_taps=None, dflash_layers=3))
    assert config.target_layer_ids == (1, 2, 3)  # z-lab's spread over 1 .. L - 3
    assert config.hidden_size == verifier.model.config.hidden_size and config.num_target_layers == LAYERS
    with pytest.raises(ValueError, match=r"train.dflash_taps=\[0, 5\].*0..4"):
        draft_config(verifier.model, settings(dflash_taps=[0, 5]))
    with pytest.raises(ValueError, match="train.dflash_block_size must be >= 2"):
        draft_config(verifier.model, settings(dflash_block_size=1))
    with pytest.raises(ValueError, match="dflash_mask_token_id=999 is not a row"):
        draft_config(verifier.model, settings(dflash_mask_token_id=999))


def test_training_lowers_the_loss_and_raises_the_agreement(verifier, data):
    draft = random_draft(verifier, seed=1).train()
    batch = batch_of(list(data["train"]), verifier, draft)
    predict = predict_positions(batch["attention_mask"], batch["loss_mask"])
    embedding, head = verifier.model.get_input_embeddings(), verifier.model.get_output_embeddings()
    optimizer = torch.optim.AdamW(draft.parameters(), lr=3e-3)

    def step(seed):
        anchors, keep = sample_anchors(predict, 8, torch.Generator().manual_seed(seed))
        return block_loss(draft, embedding, head, batch, anchors, keep, WIDTH, 4.0, DraftVocab.full(VOCAB))

    first = step(0)
    for seed in range(60):
        out = step(seed)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        last = step(0)
    assert float(last["loss"]) < 0.5 * float(first["loss"])
    assert last["leading"] > 2 * first["leading"]


def train_cfg(synth_dir, tmp_path, **overrides):
    train = {
        "data": str(synth_dir), "max_steps": 2, "batch_size": 4, "accumulate_grad_batches": 1,
        "lr_start": 3e-3, "lr_end": 3e-4, "warmup_steps": 1, "weight_decay": 0.0, "grad_clip": 1.0,
        "val_every_steps": 2, "val_batches": 1, "val_prompts": 1, "checkpoint_every_steps": 2, "seed": 0,
        "devices": 1, "strategy": "auto", "precision": None, "num_workers": 0,
        "feature_cache": str(tmp_path / "features"), "feature_batch_size": 8, **vars(settings()),
    }  # fmt: skip
    train.update(overrides)
    return SimpleNamespace(train=SimpleNamespace(**train))


def fit(cfg, verifier, out_dir, max_steps):
    from specbench.tracking import NULL_TRACKER

    cfg.train.max_steps = max_steps
    module, datamodule = build_training("dflash", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)  # task=train's path
    trainer, metrics = build_trainer(cfg.train, out_dir, NULL_TRACKER, torch.device("cpu"))
    resume = last_checkpoint(out_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume) if resume else None)
    return module, trainer, metrics


def greedy_reference(verifier, prompt, max_new):
    out = verifier.model.generate(
        torch.tensor([prompt]),
        max_new_tokens=max_new,
        do_sample=False,
        eos_token_id=EOS_ID,
        pad_token_id=PAD_ID,
    )
    return out[0, len(prompt) :].tolist()


def test_lightning_fit_resumes_loads_for_lossless_decoding_and_exports(verifier, synth_dir, tmp_path):
    cfg = train_cfg(synth_dir, tmp_path, init_layer="verifier_last")
    _, trainer, metrics = fit(cfg, verifier, tmp_path / "run", 2)
    assert trainer.global_step == 2 and (tmp_path / "features" / "features.json").is_file()
    expected = {"train/loss", "train/acc", "val/loss", "val/tau_estimate", "val/tau"}
    assert expected | {f"val/acc_pos{k}" for k in range(1, WIDTH)} <= set(metrics.last)
    saved = torch.load(last_checkpoint(tmp_path / "run"), map_location="cpu", weights_only=True)
    assert saved["state_dict"] and all(k.startswith("draft.") for k in saved["state_dict"])
    assert not any("embed_tokens" in k or "lm_head" in k for k in saved["state_dict"])  # shared, not saved
    meta = saved["specbench"]
    assert meta["method"] == "dflash" and meta["dflash_config"]["dflash_config"]["target_layer_ids"] == [
        0,
        2,
        4,
    ]
    resumed, trainer2, _ = fit(cfg, verifier, tmp_path / "run", 4)
    assert trainer2.global_step == 4
    path = export_trained(resumed, resumed.metadata(), tmp_path / "trained.pt")
    drafter = dflash_drafter(str(path), verifier, VOCAB)
    for name, param in resumed.draft.named_parameters():
        torch.testing.assert_close(dict(drafter.model.named_parameters())[name], param)
    prompt = [33, 34, 35, 36, 37]
    engine = SpeculativeEngine(
        verifier.model, drafter, schedule=DraftSchedule("constant", WIDTH - 1),
        settings=GenerationSettings(max_new_tokens=12), vocab_size=VOCAB, eos_token_ids=[EOS_ID],
        pad_token_id=PAD_ID,
    )  # fmt: skip
    assert engine.generate([prompt])[0].output_ids == greedy_reference(verifier, prompt, 12)
    with pytest.raises(DFlashCheckpointError, match="verifier_weights"):
        dflash_drafter(str(path), tiny_verifier(seed=9), VOCAB)
    # export to the z-lab layout: the same network, loadable as a z-lab directory, in bf16
    out = export_zlab(path, tmp_path / "zlab", torch.bfloat16)
    loaded = load_dflash(out, verifier.model)
    for name, param in resumed.draft.named_parameters():
        torch.testing.assert_close(dict(loaded.named_parameters())[name], param.to(torch.bfloat16).float())
    assert export_main([str(tmp_path / "features" / "features.json"), str(tmp_path / "x")]) == 2
    # --compact: a bf16 trained.pt that loads (verifier checks kept) as the rounded network
    assert export_main([str(path), str(tmp_path / "small.pt"), "--compact"]) == 0
    small = dflash_drafter(str(tmp_path / "small.pt"), verifier, VOCAB)
    for name, param in resumed.draft.named_parameters():
        torch.testing.assert_close(
            dict(small.model.named_parameters())[name], param.to(torch.bfloat16).float()
        )


def test_a_draft_vocabulary_is_trained_saved_and_drafted_over_losslessly(verifier, synth_dir, tmp_path):
    cfg = train_cfg(synth_dir, tmp_path, dflash_draft_vocab_size=40, feature_cache=None, val_prompts=1)
    module, _, metrics = fit(cfg, verifier, tmp_path / "run", 2)
    assert "val/tau" in metrics.last
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    drafter = dflash_drafter(str(path), verifier, VOCAB)
    assert drafter.draft_vocab.size == 40 and drafter.describe()["draft_vocab_size"] == 40
    prompts = [[33, 34, 35, 36, 37], [70, 71, 72]]
    engine = SpeculativeEngine(
        verifier.model, drafter, schedule=DraftSchedule("constant", WIDTH - 1),
        settings=GenerationSettings(max_new_tokens=12), vocab_size=VOCAB, eos_token_ids=[EOS_ID],
        pad_token_id=PAD_ID,
    )  # fmt: skip
    seen = []
    original = drafter.draft_logits

    def recording(state, width=None):
        logits, hidden = original(state, width)
        seen.append(logits)
        return logits, hidden

    drafter.draft_logits = recording
    results = engine.generate(prompts)
    assert [r.output_ids for r in results] == [greedy_reference(verifier, p, 12) for p in prompts]
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[drafter.draft_vocab.draft_ids] = False
    assert seen and all(
        torch.isinf(x[..., outside]).all() and torch.isfinite(x[..., ~outside]).all() for x in seen
    )
    assert export_main([str(path), str(tmp_path / "zlab")]) == 2  # the z-lab layout has no draft vocabulary
    assert export_main([str(path), str(tmp_path / "small.pt"), "--compact"]) == 0


def test_a_checkpoint_of_another_method_is_refused_by_the_loader_and_the_export(verifier, tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"state_dict": {}, "specbench": {"method": "eagle3"}}, path)
    with pytest.raises(DFlashCheckpointError, match="method='eagle3' checkpoint, not a DFlash drafter"):
        dflash_drafter(str(path), verifier, VOCAB)
    assert export_main([str(path), str(tmp_path / "out")]) == 2
    assert not (tmp_path / "out").exists()
    with pytest.raises(FileNotFoundError, match="no such file or directory"):
        dflash_drafter(str(tmp_path / "missing" / "trained.pt"), verifier, VOCAB)
