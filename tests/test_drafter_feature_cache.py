"""Distill / SD² training from the verifier-feature cache and over a reduced draft vocabulary
(docs/training.md, docs/draft-vocab.md; specbench/training/drafter.py, features.py).

A batch's loss and gradient from the cache equal the live ones (bf16 tolerance) for distillation and SD²
(both offset modes); one cache serves a distill run and an SD² run (the verifier's forwards are counted);
a cache of another verifier or other data is refused; over a draft vocabulary the loss is the divergence
of the restricted, renormalised verifier distribution and the drafter's softmax over its draft rows (a
reference computed by hand); a Lightning fit with both exports a checkpoint that records the vocabulary
and decodes losslessly with it. Tiny seeded random models (``specbench.models.tiny``).
"""

from __future__ import annotations

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import launch

from specbench.config import ConfigError
from specbench.config.draft_vocab import trained_vocab_spec
from specbench.data.prompts import Prompt
from specbench.data.synth_dataset import load_synthetic
from specbench.decoding import DraftSchedule, GenerationSettings, VerificationRule
from specbench.drafters.trained import CheckpointMismatchError, load_trained_drafter
from specbench.evaluation import build_engines
from specbench.models.draft_vocab import DraftVocab
from specbench.models.loading import LoadedModel, ModelSpec, load_verifier
from specbench.models.tiny import EOS_ID, PAD_ID, byte_tokenizer, tiny_random_model
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.tracking import NULL_TRACKER
from specbench.training.drafter import build_drafter_training, steering_sources
from specbench.training.features import FeatureCacheMismatch
from specbench.training.trainer import build_trainer, export_trained

VOCAB = 259  # the byte tokenizer (the tiny LM heads have 320 rows)
V_LAYERS = [1, 2, 4]
LIVE_KEYS = ("input_ids", "attention_mask", "loss_mask", "prompt_len")


def tiny_verifier(seed=0) -> LoadedModel:
    spec = ModelSpec(kind="tiny_random", name="tiny-cache-verifier", num_layers=4, seed=seed)
    return load_verifier(spec, device="cpu", dtype="float32")


def tiny_drafter(vocab: DraftVocab | None = None) -> LoadedModel:
    spec = ModelSpec(kind="tiny_random", name="tiny-cache-drafter", num_layers=2, seed=1)
    return LoadedModel(
        tiny_random_model("llama", seed=1, num_layers=2), byte_tokenizer(), spec, spec.name, vocab
    )


@pytest.fixture(scope="module")
def verifier() -> LoadedModel:
    return tiny_verifier()


def sample(verifier, out, count=16):
    """task=synth rows of the tiny verifier at T = 1 (every row differs)."""
    words = ["apple", "river", "stone", "cloud", "engine", "garden", "violin", "planet"]
    prompts = [Prompt(i, f"{words[i % 8]} {words[(3 * i + 1) % 8]} {i}") for i in range(count)]
    settings = SynthSettings(
        target_len=64, max_prompt_len=44, temperature=1.0, batch_size=8, validation_fraction=0.25
    )
    synthesize(verifier, prompts, settings, out, progress=False)
    return out


@pytest.fixture(scope="module")
def synth_dir(verifier, tmp_path_factory):
    return sample(verifier, tmp_path_factory.mktemp("cache-synth"))


@pytest.fixture(scope="module")
def vocab(synth_dir) -> DraftVocab:
    rows = load_synthetic(str(synth_dir))[0]["train"]
    return DraftVocab.from_rows(zip(rows["input_ids"], rows["loss_mask"]), 48, VOCAB)


def config(synth_dir, cache=None, **overrides):
    train = {
        "data": str(synth_dir), "max_steps": 2, "batch_size": 4, "accumulate_grad_batches": 1,
        "lr_start": 1e-2, "lr_end": 1e-3, "warmup_steps": 1, "weight_decay": 0.0, "grad_clip": 1.0,
        "loss": "kl", "offset": "random", "max_offset": 3, "val_every_steps": 2, "val_batches": 1,
        "val_prompts": 0, "checkpoint_every_steps": 2, "seed": 0, "devices": 1, "strategy": "auto",
        "precision": None, "num_workers": 0, "lora_rank": 4, "lora_alpha": 8,
        "feature_cache": str(cache) if cache else None, "feature_top_k": None, "feature_batch_size": 4,
    }  # fmt: skip
    train.update(overrides)
    steering = {
        "finetune_drafter": "full",
        "v_layers": V_LAYERS,
        "guide_method": "merged",
        "d_layers": "all",
        "rank": None,
    }
    return SimpleNamespace(train=SimpleNamespace(**train), steering=SimpleNamespace(**steering))


def build(cfg, method, verifier, vocab=None):
    module, data = build_drafter_training(cfg, method, verifier, tiny_drafter(vocab), VOCAB, [EOS_ID], PAD_ID)
    if module.steering is not None:  # W_s = 0 at step 0 would make the steering invisible in the loss
        weight = module.steering.head.project.weight
        with torch.no_grad():
            weight.copy_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
    return module, data


def first_batch(data, split="train"):
    data.prepare_data()
    data.setup("fit")
    loader = data.train_dataloader() if split == "train" else data.val_dataloader()
    return next(iter(loader))


@contextlib.contextmanager
def count_forwards(loaded: LoadedModel):
    """Within the block, ``calls[0]`` counts the forwards of the verifier's body."""
    calls = [0]
    handle = loaded.model.base_model.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        yield calls
    finally:
        handle.remove()


def loss_and_grad(module, batch, offset, phase=0):
    module.zero_grad()
    out = module.losses(batch, offset, phase)
    out["loss"].backward()
    grads = torch.cat(
        [p.grad.flatten() for p in module.parameters() if p.requires_grad and p.grad is not None]
    )
    return out["loss"].detach(), grads


def assert_grads_close(a, b):
    assert F.cosine_similarity(a, b, dim=0) > 0.999
    assert (a - b).norm() / b.norm() < 3e-2


# --- the cache gives the live loss and gradient ------------------------------------------------------------


@pytest.mark.parametrize(
    "method,offset,vocab_size,top_k",
    [("distill", "random", None, None), ("sd2", "random", None, None), ("sd2", "blocked", None, None),
     ("sd2", "blocked", 48, 8), ("distill", "random", 48, None)],
)  # fmt: skip
def test_cached_loss_and_gradient_equal_the_live_ones(
    verifier, synth_dir, vocab, tmp_path, method, offset, vocab_size, top_k
):
    cfg = config(synth_dir, tmp_path / "features", offset=offset, feature_top_k=top_k)
    module, data = build(cfg, method, verifier, vocab if vocab_size else None)
    with count_forwards(verifier) as forwards:
        cached = first_batch(data)
        built = forwards[0]
        assert built > 0 and "target_values" in cached and ("features" in cached) == (method == "sd2")
        live = {k: cached[k] for k in LIVE_KEYS}
        for step_offset, phase in ((3, 2), (1, 0)):
            loss_cached, grad_cached = loss_and_grad(module, cached, step_offset, phase)
            assert forwards[0] == built  # the cached batch runs no verifier
            loss_live, grad_live = loss_and_grad(module, live, step_offset, phase)
            assert forwards[0] == built + 1
            built = forwards[0]
            torch.testing.assert_close(loss_cached, loss_live, rtol=1e-2, atol=1e-4)
            assert_grads_close(grad_cached, grad_live)
    if method == "sd2":  # the test sees the steering source: features one position off give another loss
        shifted = {**cached, "features": cached["features"].roll(1, dims=1)}
        loss_shifted = module.losses(shifted, 1)["loss"].detach()  # offset 1, phase 0: the last pair's
        assert abs(float(loss_shifted - loss_live)) > 10 * abs(float(loss_cached - loss_live)) + 1e-4


def test_cached_taps_are_the_live_ones_at_the_steering_sources(verifier, synth_dir, tmp_path):
    """The gathered SD² source features (``steering_sources`` over the cached taps) are the verifier's own
    taps at those positions, for both offset modes."""
    from specbench.training.batches import verifier_targets

    cached = first_batch(build(config(synth_dir, tmp_path / "features"), "sd2", verifier)[1])
    live = verifier_targets(verifier.model, cached, V_LAYERS, None)["features"]
    for mode, offset, phase in (("random", 2, 0), ("blocked", 0, 1)):
        sources = steering_sources(mode, offset, cached["prompt_len"], cached["input_ids"].shape[1], 3, phase)
        index = sources.clamp(min=0).unsqueeze(-1).expand(-1, -1, live.shape[-1])
        steered = cached["predict"] & (sources >= 0)
        got = torch.gather(cached["features"].float(), 1, index)[steered]
        torch.testing.assert_close(got, torch.gather(live, 1, index)[steered], rtol=1e-2, atol=1e-2)


# --- one cache, two runs; refusals -------------------------------------------------------------------------


def fit(cfg, method, verifier, out_dir, vocab=None):
    module, data = build(cfg, method, verifier, vocab)
    trainer, metrics = build_trainer(cfg.train, out_dir, NULL_TRACKER, torch.device("cpu"))
    trainer.fit(module, datamodule=data)
    return module, trainer, metrics


@pytest.mark.parametrize("first,second", [("distill", "sd2"), ("sd2", "distill")])
def test_one_cache_serves_a_distill_and_an_sd2_run_with_one_verifier_pass(
    verifier, synth_dir, tmp_path, first, second
):
    cache = tmp_path / "features"
    rows = load_synthetic(str(synth_dir))[0]
    with count_forwards(verifier) as forwards:
        _, trainer, _ = fit(config(synth_dir, cache), first, verifier, tmp_path / first)
        assert trainer.global_step == 2
        assert forwards[0] == sum(
            -(-len(rows[s]) // 4) for s in ("train", "validation")
        )  # the build's batches
        meta = json.loads((cache / "features.json").read_text())
        assert meta["identity"]["taps"] == V_LAYERS  # a distill run stores SD²'s taps as well
        stamp, built = (cache / "features.json").stat().st_mtime_ns, forwards[0]
        module, trainer, metrics = fit(config(synth_dir, cache), second, verifier, tmp_path / second)
        assert trainer.global_step == 2 and {"train/loss", "val/loss"} <= set(metrics.last)
        assert forwards[0] == built  # no second verifier pass: training and validation loss from the cache
    assert (cache / "features.json").stat().st_mtime_ns == stamp
    assert module.metadata()["feature_cache"] == str(cache)


def test_the_cache_of_another_verifier_other_data_or_targets_is_refused(verifier, synth_dir, vocab, tmp_path):
    cache = tmp_path / "features"
    first_batch(build(config(synth_dir, cache), "distill", verifier)[1])
    with pytest.raises(FeatureCacheMismatch, match="verifier weights"):
        build(config(synth_dir, cache), "sd2", tiny_verifier(seed=5))  # same name, other weights
    fewer = sample(verifier, tmp_path / "fewer", count=12)  # the same verifier, other rows
    with pytest.raises(FeatureCacheMismatch, match="other data"):
        build(config(fewer, cache), "sd2", verifier)
    with pytest.raises(FeatureCacheMismatch, match="other targets"):
        build(config(synth_dir, cache), "sd2", verifier, vocab)  # the draft vocabulary is part of the targets
    with pytest.raises(FeatureCacheMismatch, match="other targets"):
        build(config(synth_dir, cache, feature_top_k=8), "distill", verifier)


# --- the loss over a draft vocabulary ---------------------------------------------------------------------


def reference_divergence(verifier, drafter_model, batch, vocab, kind, top_k=None):
    """By hand: the models' full logits, restricted to the draft ids; p renormalised over them (its top-k)."""
    ids, attention = batch["input_ids"], batch["attention_mask"]
    predict = torch.zeros_like(attention, dtype=torch.bool)
    predict[:, :-1] = batch["loss_mask"][:, 1:].bool()
    with torch.no_grad():
        p_logits = verifier.model(input_ids=ids, attention_mask=attention).logits[predict][:, vocab.draft_ids]
    q_logits = drafter_model(input_ids=ids, attention_mask=attention).logits[predict][:, vocab.draft_ids]
    log_q = F.log_softmax(q_logits, dim=-1)
    if top_k:
        values, index = p_logits.topk(top_k, dim=-1)
        p = torch.zeros_like(p_logits).scatter_(-1, index, F.softmax(values, dim=-1))
    else:
        p = F.softmax(p_logits, dim=-1)
    if kind == "kl":
        return (p * (p.clamp(min=1e-30).log() - log_q) * (p > 0)).sum(-1).mean()
    if kind == "rkl":
        return (log_q.exp() * (log_q - p.log())).sum(-1).mean()
    return 0.5 * (p - log_q.exp()).abs().sum(-1).mean()


@pytest.mark.parametrize("kind,top_k", [("kl", None), ("rkl", None), ("tvd", None), ("kl", 8), ("tvd", 8)])
def test_the_draft_vocabulary_loss_is_the_restricted_renormalised_divergence(
    verifier, synth_dir, vocab, kind, top_k
):
    module, data = build(config(synth_dir, loss=kind, feature_top_k=top_k), "distill", verifier, vocab)
    batch = first_batch(data)
    head = module.drafter.get_output_embeddings()
    calls = [0]
    handle = head.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    loss = module.losses(batch, 1)["loss"]
    handle.remove()
    assert calls[0] == 0  # the full LM head never runs: only its draft rows
    want = reference_divergence(verifier, module.drafter, batch, vocab, kind, top_k)
    torch.testing.assert_close(loss, want, rtol=1e-4, atol=1e-5)
    full = build(config(synth_dir, loss=kind), "distill", verifier)[0].losses(batch, 1)["loss"].detach()
    assert abs(float(full - want.detach())) > 1e-3  # the restriction changes the loss: the test can tell
    module.zero_grad()
    loss.backward()
    rows = head.weight.grad.abs().sum(-1) > 0
    assert torch.equal(rows[:VOCAB], vocab.t2d)  # only the draft rows of the LM head learn


def test_rkl_with_top_k_targets_is_refused(verifier, synth_dir):
    with pytest.raises(ValueError, match="train.loss=rkl needs the verifier's full distribution"):
        build(config(synth_dir, loss="rkl", feature_top_k=8), "distill", verifier)


# --- fit, export, decode -----------------------------------------------------------------------------------


def test_fit_with_cache_and_draft_vocabulary_exports_and_decodes_losslessly(
    verifier, synth_dir, vocab, tmp_path
):
    cfg = config(synth_dir, tmp_path / "features", val_prompts=1, max_offset=3)
    module, trainer, metrics = fit(cfg, "sd2", verifier, tmp_path / "run", vocab)
    assert trainer.global_step == 2 and metrics.last["val/tau"] >= 1.0
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    meta = module.metadata()
    assert (
        meta["draft_vocab_ids"] == vocab.draft_ids.tolist()
        and meta["draft_vocab_fingerprint"] == vocab.fingerprint()
    )
    trained = load_trained_drafter(path, tiny_verifier(), tiny_drafter(), "sd2")
    assert trained.drafter.draft_vocab == vocab  # decodes with the vocabulary it was trained over
    for name, param in module.drafter.state_dict().items():
        torch.testing.assert_close(trained.drafter.model.state_dict()[name], param)
    settings = GenerationSettings(max_new_tokens=16)
    engine, reference = build_engines(
        verifier,
        trained.drafter,
        VerificationRule(),
        DraftSchedule("constant", 3),
        settings,
        steering=trained.steering,
    )
    assert engine.drafter.draft_vocab == vocab
    prompts = [
        row["input_ids"][: row["prompt_len"]] for row in load_synthetic(str(synth_dir))[0]["validation"]
    ][:3]
    results = engine.generate(prompts)
    assert [r.output_ids for r in results] == [r.output_ids for r in reference.generate(prompts)]
    outside = DraftVocab(list(range(48)), VOCAB)
    with pytest.raises(CheckpointMismatchError, match="was trained over another one of 48"):
        load_trained_drafter(path, verifier, tiny_drafter(outside), "sd2")
    spec = ModelSpec(kind="tiny_random", draft_vocab_size=32)
    with pytest.raises(
        ConfigError, match="draft_vocab_size=32, but steering.checkpoint=.* 48 tokens"
    ) as info:
        trained_vocab_spec(spec, str(path), "steering.checkpoint")
    assert "\n" not in str(info.value)
    assert (
        trained_vocab_spec(
            ModelSpec(kind="tiny_random", draft_vocab_size=48), str(path), "k"
        ).draft_vocab_size
        is None
    )


def test_train_with_cache_and_vocabulary_then_eval_through_launch(tmp_path):
    """task=train method=distill then sd2 on one cache (built once), over a draft vocabulary; task=eval
    decodes with the checkpoint's vocabulary and refuses another size in one line."""
    tiny = [
        "model/verifier=tiny-random",
        "model/drafter=tiny-random",
        "runtime.num_threads=1",
        "tracking=none",
    ]
    synth = tmp_path / "synth"
    proc = launch(["task=synth", *tiny, "dataset=demo", "synth.target_len=80", "synth.max_prompt_len=60",
                   f"synth.output_dir={synth}", f"hydra.run.dir={tmp_path / 'h-synth'}"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    common = [*tiny, "steering.v_layers=[0,1,2]", f"train.data={synth}", f"model.drafter.draft_vocab={synth}",
              "model.drafter.draft_vocab_size=64", f"train.feature_cache={tmp_path / 'features'}",
              "train.max_steps=2", "train.batch_size=2", "train.val_every_steps=2", "train.val_prompts=1",
              "train.checkpoint_every_steps=2"]  # fmt: skip
    logs = []
    for method in (["method=distill", "steering=none"], ["method=sd2", "steering=sd2"]):
        out = tmp_path / method[0].split("=")[1]
        proc = launch(
            ["task=train", *method, *common, f"train.output_dir={out}", f"hydra.run.dir={out / 'h'}"]
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        logs.append(proc.stdout + proc.stderr)
    assert "feature cache written" in logs[0] and "feature cache written" not in logs[1]
    checkpoint = tmp_path / "distill" / "trained.pt"
    eval_dir = tmp_path / "eval"
    proc = launch([*tiny, "method=distill", f"method.drafter_checkpoint={checkpoint}", "gen.max_new_tokens=8",
                   "dataset.limit=2", f"eval.output_dir={eval_dir}"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((eval_dir / "metrics.json").read_text())
    assert metrics["draft_vocab_size"] == 64 and metrics["baseline_match_rate"] == 1.0
    proc = launch([*tiny, "method=distill", f"method.drafter_checkpoint={checkpoint}",
                   "model.drafter.draft_vocab_size=32", f"eval.output_dir={tmp_path / 'bad'}"])  # fmt: skip
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("Config error:")]
    assert len(lines) == 1 and "model.drafter.draft_vocab_size=32, but method.drafter_checkpoint=" in lines[0]
