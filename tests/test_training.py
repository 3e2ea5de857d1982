"""Drafter distillation / SD² training (methods.md §4): losses, time alignment, a step that learns,
schedule, checkpoints that hold only what trained, loading for decoding and mismatch errors."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset, DatasetDict

from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine
from specbench.drafters.sd2 import SD2Drafter
from specbench.drafters.steering import SteeredDrafter, resolve_spec, verifier_features
from specbench.drafters.trained import (
    CheckpointMismatchError,
    LoraSettings,
    load_trained_drafter,
    pair_metadata,
    trainable_drafter,
)
from specbench.models.early_exit import early_exit_drafter
from specbench.models.loading import LoadedModel, ModelSpec
from specbench.models.taps import record_states
from specbench.models.tiny import EOS_ID, PAD_ID, byte_tokenizer, tiny_random_model
from specbench.training.batches import pad_batch
from specbench.training.drafter import DrafterTraining, divergence, predict_mask, steering_sources
from specbench.training.synth_data import SyntheticDataModule
from specbench.training.trainer import build_trainer, export_trained, last_checkpoint, warmup_cosine_lr

V_LAYERS = [1, 2, 4]


def train_cfg(**overrides):
    values = {
        "max_steps": 4,
        "batch_size": 4,
        "accumulate_grad_batches": 1,
        "lr_start": 1e-2,
        "lr_end": 1e-3,
        "warmup_steps": 1,
        "weight_decay": 0.0,
        "grad_clip": 1.0,
        "loss": "kl",
        "offset": "random",
        "max_offset": 3,
        "val_every_steps": 2,
        "val_batches": 1,
        "val_prompts": 2,
        "checkpoint_every_steps": 2,
        "seed": 0,
        "devices": 1,
        "strategy": "auto",
        "precision": None,
        "num_workers": 0,
        "lora_rank": 4,
        "lora_alpha": 8,
    }
    values.update(overrides)
    return SimpleNamespace(**values)


def rows(count=12, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(count):
        prompt_len = 2 + i % 4
        total = prompt_len + 6 + i % 3
        ids = torch.randint(3, 300, (total,), generator=g).tolist()
        out.append(
            {
                "input_ids": ids,
                "loss_mask": [0] * prompt_len + [1] * (total - prompt_len),
                "prompt_len": prompt_len,
            }
        )
    return out


def synthetic_dataset():
    return DatasetDict(
        {"train": Dataset.from_list(rows(12)), "validation": Dataset.from_list(rows(4, seed=1))}
    )


def loaded(model, name):
    return LoadedModel(model, byte_tokenizer(), ModelSpec(kind="tiny_random", name=name), name)


def models(seed_v=0, seed_d=1):
    verifier = tiny_random_model("llama", seed=seed_v, num_layers=4)
    drafter = tiny_random_model("llama", seed=seed_d, num_layers=2)
    return loaded(verifier, "tiny-verifier"), loaded(drafter, "tiny-drafter")


def module_for(method="sd2", finetune="full", cfg=None, verifier=None, drafter=None):
    cfg = cfg or train_cfg()
    if verifier is None:
        verifier, drafter = models()
    model = trainable_drafter(
        drafter.model, verifier.model, finetune, LoraSettings(4, 8) if finetune == "lora" else None
    )
    steering = None
    if method == "sd2":
        steering = SteeredDrafter(model, resolve_spec(verifier.model, model, V_LAYERS))
    meta = {
        "method": method, **pair_metadata(verifier, drafter, 320), "finetune_drafter": finetune,
        "lora": LoraSettings(4, 8).to_dict() if finetune == "lora" else None,
        "steering": steering.spec.to_dict() if steering else None,
    }
    data = synthetic_dataset()
    val_prompts = [r["input_ids"][: r["prompt_len"]] for r in data["validation"]][:2]
    module = DrafterTraining(verifier.model, model, steering, cfg, 320, meta, val_prompts, [EOS_ID], PAD_ID)
    return module, verifier, drafter


def test_divergences_match_their_closed_forms():
    p_logits, q_logits = torch.randn(5, 7), torch.randn(5, 7)
    p, q = p_logits.softmax(-1), q_logits.softmax(-1)
    torch.testing.assert_close(divergence(p_logits, q_logits, "kl"), (p * (p.log() - q.log())).sum(-1))
    torch.testing.assert_close(divergence(p_logits, q_logits, "rkl"), (q * (q.log() - p.log())).sum(-1))
    torch.testing.assert_close(divergence(p_logits, q_logits, "tvd"), 0.5 * (p - q).abs().sum(-1))
    assert torch.allclose(divergence(p_logits, p_logits, "kl"), torch.zeros(5), atol=1e-6)


def test_loss_positions_are_the_ones_that_predict_generated_tokens():
    loss_mask = torch.tensor([[0, 0, 0, 1, 1, 1, 0], [0, 1, 1, 1, 1, 1, 1]])
    want = torch.tensor([[0, 0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(predict_mask(loss_mask), want)


def test_random_offset_steers_position_t_with_the_feature_at_t_minus_offset():
    src = steering_sources("random", 2, torch.tensor([3]), 7, max_offset=4)
    assert src.tolist() == [[-1, -1, 0, 1, 2, 3, 4]]


@pytest.mark.parametrize("phase", [0, 1, 2])
def test_blocked_offsets_mirror_decoding_rounds(phase):
    """Rounds of k positions from the first response-predicting position; each position is steered by the
    position just before its round, so distances run 1..k within a round, as when decoding."""
    k, prompt_len, length = 3, 4, 14
    src = steering_sources("blocked", 0, torch.tensor([prompt_len]), length, max_offset=k, phase=phase)[
        0
    ].tolist()
    first = prompt_len - 1
    assert src[:first] == [-1] * first
    distances = [t - s for t, s in enumerate(src) if t >= first]
    assert all(1 <= d <= k for d in distances)
    assert distances[0] == 1
    # Distances restart at 1 at every round start; the first round is shortened by the phase.
    starts = [i for i, d in enumerate(distances) if d == 1]
    assert starts[:3] == [0, k - phase, 2 * k - phase] if phase else starts[:3] == [0, k, 2 * k]


def test_training_steering_matches_the_decoding_alignment():
    """With offset 1, the drafter's training-time steering at the round's first drafted position uses the
    same verifier feature the engine uses: the state of the token before it."""
    verifier, drafter = models()
    spec = resolve_spec(verifier.model, drafter.model, V_LAYERS)
    ids = torch.tensor([[5, 9, 33, 71, 12, 8]])
    with record_states(verifier.model, spec.v_layers) as states:
        verifier.model(input_ids=ids)
    feats = verifier_features(states.taps, spec.v_layers)
    src = steering_sources("random", 1, torch.tensor([3]), 6, max_offset=3)
    assert src[0, 2] == 1  # the last prompt position (predicting the first response token) reads position 1
    gathered = torch.gather(feats, 1, src.clamp(min=0).unsqueeze(-1).expand(-1, -1, feats.shape[-1]))
    torch.testing.assert_close(gathered[0, 2], feats[0, 1])


def test_warmup_then_cosine_is_sequential():
    lrs = [warmup_cosine_lr(s, 10, 110, 1e-3, 1e-5) for s in range(111)]
    assert lrs[0] == pytest.approx(1e-4) and lrs[9] == pytest.approx(1e-3)
    assert lrs[10] == pytest.approx(1e-3)
    assert lrs[60] == pytest.approx(1e-5 + 0.5 * (1e-3 - 1e-5))
    assert lrs[110] == pytest.approx(1e-5)
    assert all(a >= b for a, b in itertools.pairwise(lrs[10:]))  # non-increasing after warm-up


@pytest.mark.parametrize(
    "method,finetune",
    [("sd2", "full"), ("sd2", "none"), ("sd2", "lora"), ("distill", "full"), ("distill", "lora")],
)
def test_optimisation_steps_lower_the_loss(method, finetune):
    module, *_ = module_for(method, finetune)
    batch = pad_batch(rows(8), PAD_ID)
    optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-2)
    before = module.losses(batch, offset=1)["loss"].item()
    for _ in range(5):
        optimizer.zero_grad()
        module.losses(batch, offset=1)["loss"].backward()
        optimizer.step()
    after = module.losses(batch, offset=1)["loss"].item()
    assert after < before
    trainable = {n for n, p in module.named_parameters() if p.requires_grad}
    if finetune == "none":
        assert trainable and all(n.startswith("steering.") for n in trainable)
    if finetune == "lora":
        assert all("lora_" in n or n.startswith("steering.") for n in trainable)


def test_training_never_changes_an_early_exit_verifier():
    verifier = loaded(tiny_random_model("llama", seed=2, num_layers=4), "v")
    drafter = loaded(early_exit_drafter(verifier.model, 2), "v[:2]")
    before = {k: v.clone() for k, v in verifier.model.state_dict().items()}
    for finetune in ("full", "lora"):
        module, *_ = module_for("sd2", finetune, verifier=verifier, drafter=drafter)
        optimizer = torch.optim.AdamW([p for p in module.parameters() if p.requires_grad], lr=1e-1)
        loss = module.losses(pad_batch(rows(4), PAD_ID), offset=1)["loss"]
        loss.backward()
        optimizer.step()
        module.steering.remove()
    after = verifier.model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


def fit(tmp_path, module, max_steps, tracker=None):
    from specbench.tracking import NULL_TRACKER

    module.train_cfg.max_steps = max_steps
    trainer, metrics = build_trainer(module.train_cfg, tmp_path, tracker or NULL_TRACKER, torch.device("cpu"))
    data = SyntheticDataModule(synthetic_dataset(), module.train_cfg.batch_size, PAD_ID, seed=0)
    resume = last_checkpoint(tmp_path)
    trainer.fit(module, datamodule=data, ckpt_path=str(resume) if resume else None)
    return trainer, metrics


def test_lightning_fit_checkpoints_only_trained_weights_and_resumes(tmp_path):
    module, verifier, drafter = module_for("sd2", "none")
    trainer, metrics = fit(tmp_path, module, 2)
    assert trainer.global_step == 2
    assert {"train/loss", "val/loss", "val/tvd", "val/tau"} <= set(metrics.last)
    assert metrics.last["val/tau"] >= 1.0
    ckpt = last_checkpoint(tmp_path)
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["state_dict"] and all(k.startswith("steering.head.") for k in saved["state_dict"])
    assert saved["specbench"]["verifier"] == "tiny-verifier"
    # A requeued job: a new module from the same start resumes at step 2 and goes on to step 4.
    resumed, *_ = module_for("sd2", "none", verifier=verifier, drafter=drafter)
    trainer2, _ = fit(tmp_path, resumed, 4)
    assert trainer2.global_step == 4


def test_trained_sd2_checkpoint_loads_for_decoding_and_stays_lossless(tmp_path):
    module, _verifier, _drafter = module_for("sd2", "full")
    with torch.no_grad():
        torch.nn.init.normal_(module.steering.head.project.weight, std=0.3)
        for p in module.drafter.parameters():
            p.add_(0.01)
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    fresh_verifier, fresh_drafter = models()
    trained = load_trained_drafter(path, fresh_verifier, fresh_drafter, "sd2")
    for name, param in module.drafter.state_dict().items():
        torch.testing.assert_close(trained.drafter.model.state_dict()[name], param)
    torch.testing.assert_close(trained.steering.head.project.weight, module.steering.head.project.weight)
    engine = SpeculativeEngine(
        fresh_verifier.model, SD2Drafter(trained.steering), schedule=DraftSchedule("constant", 3),
        settings=GenerationSettings(max_new_tokens=16), eos_token_ids=[EOS_ID], pad_token_id=PAD_ID,
    )
    prompt = [5, 9, 33, 71]
    want = fresh_verifier.model.generate(
        torch.tensor([prompt]), max_new_tokens=16, do_sample=False, eos_token_id=EOS_ID, pad_token_id=PAD_ID
    )[0, 4:].tolist()
    assert engine.generate([prompt])[0].output_ids == want


def test_checkpoint_of_another_pair_or_method_is_refused(tmp_path):
    module, *_ = module_for("sd2", "none")
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    verifier, drafter = models()
    other_verifier = loaded(tiny_random_model("llama", seed=0, num_layers=4), "another-verifier")
    with pytest.raises(CheckpointMismatchError, match="another model pair.*another-verifier"):
        load_trained_drafter(path, other_verifier, drafter, "sd2")
    same_name = loaded(tiny_random_model("llama", seed=7, num_layers=2), "tiny-drafter")
    with pytest.raises(CheckpointMismatchError, match="drafter_weights"):
        load_trained_drafter(path, verifier, same_name, "sd2")
    with pytest.raises(CheckpointMismatchError, match="method='sd2'.*not method='distill'"):
        load_trained_drafter(path, verifier, drafter, "distill")
    (tmp_path / "junk.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="cannot be read"):
        load_trained_drafter(tmp_path / "junk.pt", verifier, drafter, "sd2")


def test_lr_schedule_reaches_the_optimiser():
    module, *_ = module_for(
        "distill", "full", cfg=train_cfg(max_steps=10, warmup_steps=2, lr_start=1e-2, lr_end=1e-4)
    )
    config = module.configure_optimizers()
    optimizer, scheduler = config["optimizer"], config["lr_scheduler"]["scheduler"]
    seen = []
    for _ in range(10):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen[0] == pytest.approx(5e-3) and seen[1] == pytest.approx(1e-2)
    assert seen[-1] == pytest.approx(1e-4 + 0.5 * (1e-2 - 1e-4) * (1 + math.cos(math.pi * 7 / 8)))
