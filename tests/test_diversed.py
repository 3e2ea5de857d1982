"""DIVERSED (methods.md §5): the weight head, the rule in the engine, the training objective, checkpoints.

Tiny seeded random models (specbench.models.tiny); the training run uses Lightning on CPU for 2 + 1 steps.
"""

from __future__ import annotations

import copy
import functools
import json
import math

import pytest
import torch
from helpers import compose_config

import specbench.config  # noqa: F401  (registers the schemas)
from specbench.data.prompts import Prompt
from specbench.decoding import (
    DraftSchedule,
    EnsembleRule,
    GenerationSettings,
    SpeculativeEngine,
    VerificationRule,
)
from specbench.decoding.diversed import (
    CheckpointMismatchError,
    DiversedRule,
    WeightHead,
    fresh_diversed_rule,
    load_diversed_rule,
    pair_metadata,
)
from specbench.decoding.metrics import summarize
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.rules import one_step_distribution, pool_distributions
from specbench.evaluation import result_from_row, saved_timing
from specbench.models.early_exit import early_exit_drafter
from specbench.models.loading import LoadedModel, ModelSpec
from specbench.models.tiny import EOS_ID, PAD_ID, byte_tokenizer, tiny_random_model
from specbench.tracking import NULL_TRACKER
from specbench.training.diversed import DiversedModule, build_diversed_training
from specbench.training.diversed_objective import regularizer_loss, reinforce_loss, update_baseline
from specbench.training.diversed_rewards import RewardSpec
from specbench.training.diversed_rollout import pooled_log_prob_and_agreement, rollout
from specbench.training.prompt_data import split_validation
from specbench.training.trainer import build_trainer, export_trained, last_checkpoint, read_checkpoint

PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]
MAX_NEW = 16
POOLS = ("linear", "log_linear")


@functools.cache
def verifier_model():
    return tiny_random_model("llama", seed=0, num_layers=3)


@functools.cache
def drafter_model(kind: str):
    if kind == "independent":
        return tiny_random_model("llama", seed=1, num_layers=1, hidden_size=32)
    if kind == "early_exit":
        return early_exit_drafter(verifier_model(), 1)
    model = copy.deepcopy(verifier_model())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.01)
    return model


def loaded(model, name: str) -> LoadedModel:
    return LoadedModel(model, byte_tokenizer(), ModelSpec(kind="tiny_random"), name)


def pair(kind: str = "independent") -> tuple[LoadedModel, LoadedModel]:
    return loaded(verifier_model(), "tiny-verifier"), loaded(drafter_model(kind), f"tiny-drafter-{kind}")


def zero_weight_head(drafter_hidden: int, verifier_hidden: int) -> WeightHead:
    """w_draft = 0 exactly for every input (draft logit −inf)."""
    head = WeightHead(drafter_hidden, verifier_hidden)
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.copy_(torch.tensor([-math.inf, 0.0]))
    return head


def engine(rule, drafter_kind="independent", schedule=None, **settings) -> SpeculativeEngine:
    settings.setdefault("max_new_tokens", MAX_NEW)
    drafter = ModelDrafter(drafter_model(drafter_kind))
    return SpeculativeEngine(
        verifier_model(), drafter, rule=rule, schedule=schedule or DraftSchedule("constant", 3),
        settings=GenerationSettings(**settings), eos_token_ids=(EOS_ID,), pad_token_id=PAD_ID,
    )  # fmt: skip


def hidden(model) -> int:
    return model.config.hidden_size


# ---------------------------------------------------------------------------------------------------------
# Head
# ---------------------------------------------------------------------------------------------------------


def test_head_starts_at_exactly_one_half_and_stays_float32():
    head = WeightHead(32, 64)
    g = torch.Generator().manual_seed(0)
    for scale in (1e-3, 1.0, 1e3):
        d, v = torch.randn(5, 7, 32, generator=g) * scale, torch.randn(5, 7, 64, generator=g) * scale
        w = head(d, v)
        assert w.shape == (5, 7) and w.dtype == torch.float32
        assert torch.equal(w, torch.full_like(w, 0.5))
        assert torch.equal(head.log_weights(d, v).exp(), torch.full((5, 7, 2), 0.5))
    head.to(torch.bfloat16)
    assert head.linear.weight.dtype == torch.float32
    assert torch.equal(
        head(torch.randn(3, 32).bfloat16(), torch.randn(3, 64).bfloat16()), torch.full((3,), 0.5)
    )
    with pytest.raises(ValueError, match="hidden sizes 32/64"):
        head(torch.randn(3, 64), torch.randn(3, 64))


def test_rule_weights_come_from_the_head_without_grad():
    rule = DiversedRule(WeightHead(8, 8), "linear")
    assert rule.requires_hidden_states and not rule.lossless and rule.describe()["rule"] == "diversed"
    w = rule.position_weights(torch.randn(2, 3, 8), torch.randn(2, 3, 8))
    assert w.shape == (2, 3) and not w.requires_grad
    with pytest.raises(ValueError, match="per-position draft weights"):
        rule.target(torch.rand(4), torch.rand(4))


# ---------------------------------------------------------------------------------------------------------
# w → 0 is exact SD; w = 0.5 is the static ensemble at 0.5
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", POOLS)
def test_zero_weights_give_the_sd_closed_form(pool):
    g = torch.Generator().manual_seed(1)
    p = torch.softmax(torch.randn(6, 3, 50, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(6, 3, 50, generator=g) * 2, -1)
    rule, sd = DiversedRule(WeightHead(4, 4), pool), VerificationRule()
    zeros = torch.zeros(6, 3)
    assert torch.equal(rule.acceptance(p, q, zeros), sd.acceptance(p, q))
    assert torch.equal(rule.residual(p, q, zeros), sd.residual(p, q))
    assert torch.allclose(one_step_distribution(rule, p, q, zeros), p, atol=1e-6)
    head = zero_weight_head(4, 4)
    assert torch.equal(
        DiversedRule(head, pool).position_weights(torch.randn(6, 3, 4), torch.randn(6, 3, 4)), zeros
    )


@pytest.mark.parametrize("kind", ["independent", "perturbed", "early_exit"])
@pytest.mark.parametrize("schedule", ["constant", "heuristic", "dynamic"])
@pytest.mark.parametrize("pool", POOLS)
def test_zero_weight_head_reproduces_sd_greedy_and_sampled(kind, schedule, pool):
    sched = DraftSchedule(schedule, gamma=3, max_gamma=3 if schedule == "dynamic" else 16)
    head = zero_weight_head(hidden(drafter_model(kind)), hidden(verifier_model()))
    greedy = engine(DiversedRule(head, pool), kind, sched).generate(PROMPTS)
    reference = engine(VerificationRule(), kind, sched).generate(PROMPTS)
    autoregressive = SpeculativeEngine(
        verifier_model(), None, settings=GenerationSettings(max_new_tokens=MAX_NEW), eos_token_ids=(EOS_ID,),
        pad_token_id=PAD_ID,
    ).generate(PROMPTS)  # fmt: skip
    assert [r.output_ids for r in greedy] == [r.output_ids for r in autoregressive]
    assert [r.output_ids for r in greedy] == [r.output_ids for r in reference]
    # Sampling: identical acceptance probabilities and residuals, so the same random stream gives the same
    # run.
    sampled = engine(DiversedRule(head, pool), kind, sched, temperature=1.0, seed=11).generate(PROMPTS)
    sd = engine(VerificationRule(), kind, sched, temperature=1.0, seed=11).generate(PROMPTS)
    assert [r.output_ids for r in sampled] == [r.output_ids for r in sd]
    assert [[(x.drafted, x.accepted) for x in r.rounds] for r in sampled] == [
        [(x.drafted, x.accepted) for x in r.rounds] for r in sd
    ]
    assert all(w == 0.0 for r in sampled for x in r.rounds for w in (x.draft_weights or ()))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("pool", POOLS)
def test_untrained_head_is_the_static_ensemble_at_one_half(temperature, pool):
    sched = DraftSchedule("constant", 3)
    head = WeightHead(hidden(drafter_model("perturbed")), hidden(verifier_model()))
    ours = engine(DiversedRule(head, pool), "perturbed", sched, temperature=temperature, seed=3).generate(
        PROMPTS
    )
    static = engine(EnsembleRule(0.5, pool), "perturbed", sched, temperature=temperature, seed=3).generate(
        PROMPTS
    )
    assert [r.output_ids for r in ours] == [r.output_ids for r in static]


# ---------------------------------------------------------------------------------------------------------
# In the engine: every drafter, schedule, batch size; weights logged per round and position
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["independent", "early_exit"])
@pytest.mark.parametrize("schedule", ["constant", "heuristic", "dynamic"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_trained_like_head_runs_in_the_engine(kind, schedule, temperature):
    sched = DraftSchedule(schedule, gamma=4, max_gamma=4 if schedule == "dynamic" else 8)
    head = WeightHead(hidden(drafter_model(kind)), hidden(verifier_model()))
    with torch.no_grad():  # an input-dependent head
        head.linear.weight[0].normal_(0, 0.02, generator=torch.Generator().manual_seed(0))
    results = engine(DiversedRule(head), kind, sched, temperature=temperature, top_k=40, seed=2).generate(
        PROMPTS * 2
    )
    weights = []
    for result in results:
        assert 1 <= len(result.output_ids) <= MAX_NEW
        assert sum(r.emitted for r in result.rounds) == len(result.output_ids)
        for record in result.rounds:
            assert 0 <= record.accepted <= record.drafted
            if record.drafted:
                assert len(record.draft_weights) == record.drafted
                assert record.mean_draft_weight == pytest.approx(sum(record.draft_weights) / record.drafted)
                weights.extend(record.draft_weights)
            else:
                assert record.draft_weights is None
    assert weights and 0 <= min(weights) and max(weights) <= 1 and max(weights) - min(weights) > 1e-3
    metrics = summarize(results, 1.0)
    assert 0 < metrics["mean_draft_weight"] < 1
    assert "draft_weight_pos_1" in metrics
    # Saved samples (samples.jsonl) keep the per-position weights, so a resumed summary is the same.
    rebuilt = [result_from_row({"output_ids": r.output_ids,
                                "rounds": [[x.drafted, x.accepted] for x in r.rounds],
                                **json.loads(json.dumps(saved_timing(r, 8)))}) for r in results]  # fmt: skip
    again = summarize(rebuilt, 1.0)
    assert {k: v for k, v in again.items() if "weight" in k} == {
        k: v for k, v in metrics.items() if "weight" in k
    }
    assert again["verifier_logp"] == pytest.approx(
        metrics["verifier_logp"]
    )  # and the verifier log-likelihood


def test_fresh_rule_for_a_loaded_pair():
    verifier, drafter = pair("independent")
    rule = fresh_diversed_rule(verifier, drafter, "log_linear")
    assert (
        rule.pool == "log_linear"
        and rule.head.drafter_hidden_size == 32
        and rule.head.verifier_hidden_size == 64
    )
    assert rule.metadata["verifier"] == "tiny-verifier"


# ---------------------------------------------------------------------------------------------------------
# Training objective on toys
# ---------------------------------------------------------------------------------------------------------


def _toy(pool: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(8, 20, generator=g) * 2, -1)
    q = torch.softmax(torch.randn(8, 20, generator=g) * 2, -1)
    d, v = torch.randn(8, 6, generator=g), torch.randn(8, 5, generator=g)
    return p, q, d, v


@pytest.mark.parametrize("pool", POOLS)
@pytest.mark.parametrize("reward_sign", [1.0, -1.0])
def test_reinforce_raises_the_log_probability_of_a_rewarded_action(pool, reward_sign):
    p, q, d, v = _toy(pool)
    # Actions where the drafter and verifier disagree most, so the pool weight matters for them.
    actions = (q - p).abs().argmax(dim=-1)
    head = WeightHead(6, 5)
    optimizer = torch.optim.SGD(head.parameters(), lr=0.5)

    def log_prob():
        return pooled_log_prob_and_agreement(p, q, head(d, v), actions, pool)[0]

    before = log_prob().detach()
    rewards = torch.full((8,), reward_sign)
    loss, advantages = reinforce_loss(
        log_prob().unsqueeze(1), torch.ones(8, 1, dtype=torch.bool), rewards, 0.0
    )
    assert torch.equal(advantages, rewards)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    change = (log_prob().detach() - before).sum()
    assert change * reward_sign > 0  # reward raises, punishment lowers the log-probability of the actions


def test_reinforce_with_the_baseline_ignores_a_constant_reward():
    log_probs = torch.randn(4, 3, requires_grad=True)
    loss, advantages = reinforce_loss(
        log_probs, torch.ones(4, 3, dtype=torch.bool), torch.full((4,), 0.7), 0.7
    )
    loss.backward()
    assert torch.equal(advantages, torch.zeros(4)) and torch.equal(log_probs.grad, torch.zeros(4, 3))
    assert update_baseline(None, [0.2, 0.4], 0.9) == pytest.approx(0.3)
    assert update_baseline(0.3, [1.0], 0.9) == pytest.approx(0.37)


@pytest.mark.parametrize("pool", POOLS)
def test_tv_regulariser_raises_acceptance(pool):
    p, q, d, v = _toy(pool, seed=3)
    head = WeightHead(6, 5)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    mask = torch.ones(8, 1, dtype=torch.bool)

    def agreement():
        w = head(d, v)
        pi = pool_distributions(p, q, w.unsqueeze(-1), pool)
        return 1.0 - 0.5 * (q - pi).abs().sum(-1), w  # exact 1 − TV(q, π): speculative acceptance vs π

    start, _ = agreement()
    for _ in range(20):
        tokens = torch.zeros(8, dtype=torch.long)
        _, agree = pooled_log_prob_and_agreement(p, q, head(d, v), tokens, pool)
        assert torch.allclose(agree, agreement()[0], atol=1e-5)
        loss = regularizer_loss("tv", 1.0, agree.unsqueeze(1), head(d, v).unsqueeze(1), mask)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    end, w = agreement()
    assert end.mean() > start.mean() + 0.05 and w.mean() > 0.6


def test_l2_regulariser_moves_the_mean_weight_to_the_target():
    _, _, d, v = _toy("linear")
    head = WeightHead(6, 5)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    mask = torch.ones(8, 1, dtype=torch.bool)
    for _ in range(200):
        w = head(d, v).unsqueeze(1)
        loss = regularizer_loss("l2", 1.0, torch.zeros_like(w), w, mask, target_weight=0.2)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert head(d, v).mean().item() == pytest.approx(0.2, abs=0.01)


def test_rollout_samples_the_pool_and_carries_the_heads_graph():
    from specbench.decoding.cache import CachedModel
    from specbench.decoding.model_drafter import ModelDrafter
    from specbench.decoding.warping import Warping

    vocab = 259
    head = WeightHead(32, 64)
    ver, dra = CachedModel(verifier_model(), vocab), ModelDrafter(drafter_model("independent"), vocab)
    out = rollout(
        head,
        ver,
        dra,
        PROMPTS,
        10,
        Warping(1.0),
        "linear",
        (EOS_ID,),
        PAD_ID,
        torch.Generator().manual_seed(0),
    )
    assert out.tokens.shape[0] == 4 and out.tokens.shape[1] <= 10
    assert out.log_probs.requires_grad and torch.all(out.log_probs <= 0)
    assert torch.equal(out.weights.detach(), torch.full_like(out.weights, 0.5))
    # 1 − TV(q, π) with w = 0.5 lies between sd's 1 − TV(p, q) and 1.
    assert torch.all(out.agreement.detach() >= out.verifier_agreement - 1e-6)
    (out.log_probs * out.mask).sum().backward()
    assert head.linear.weight.grad is not None
    # Greedy rollouts with a zero-weight head are the verifier's greedy output.
    greedy = rollout(
        zero_weight_head(32, 64), ver, dra, PROMPTS, MAX_NEW, Warping(0.0), "linear", (EOS_ID,), PAD_ID
    )
    reference = engine(VerificationRule()).generate(PROMPTS)
    assert greedy.outputs() == [r.output_ids for r in reference]


def test_rewards_follow_the_dataset_metric():
    from specbench.scoring import ScoringOptions

    spec = RewardSpec("spec_bench", (), ScoringOptions())
    items = [
        {"format": "chat", "category": "translation", "reference": "The cat sits on the mat."},
        {"format": "chat", "category": "math_reasoning", "reference": "#### 42"},
        {"format": "chat", "category": "qa", "reference": None},
    ]
    rewards = spec(["The cat sits on the mat.", "so the answer is 41", "anything"], items)
    assert rewards[0] == pytest.approx(1.0) and rewards[1] == 0.0 and rewards[2] == 0.0
    assert spec(["x", "The answer is 42", "y"], items)[1] == 1.0


def test_validation_split_keeps_training_prompts():
    prompts = [Prompt(i, f"p{i}") for i in range(10)]
    train, val = split_validation(prompts, 3, seed=0)
    assert len(train) == 7 and len(val) == 3 and not {p.id for p in train} & {p.id for p in val}
    assert split_validation(prompts[:1], 3)[1] == []


# ---------------------------------------------------------------------------------------------------------
# Checkpoints
# ---------------------------------------------------------------------------------------------------------


def test_checkpoint_round_trip_and_pair_mismatch(tmp_path):
    verifier, drafter = pair("independent")
    rule = fresh_diversed_rule(verifier, drafter)
    with torch.no_grad():
        rule.head.linear.weight.normal_()
        rule.head.linear.bias.normal_()
    path = export_trained(rule.head, pair_metadata(verifier, drafter), tmp_path / "trained.pt")
    loaded_rule = load_diversed_rule(path, verifier, drafter, "linear")
    for name, value in rule.head.state_dict().items():
        assert torch.equal(loaded_rule.head.state_dict()[name], value)
    assert loaded_rule.describe()["head_checkpoint"] == str(path)
    with pytest.warns(UserWarning, match="pool='linear'"):
        assert load_diversed_rule(path, verifier, drafter, "log_linear").pool == "log_linear"
    # Another drafter (name and hidden size), another verifier name, another tokenizer.
    _, other_drafter = pair("perturbed")
    with pytest.raises(
        CheckpointMismatchError, match=r"tiny-drafter-independent.*tiny-drafter-perturbed.*task=train"
    ):
        load_diversed_rule(path, verifier, other_drafter)
    renamed = LoadedModel(verifier.model, verifier.tokenizer, verifier.spec, "another-verifier")
    with pytest.raises(CheckpointMismatchError, match="another-verifier"):
        load_diversed_rule(path, renamed, drafter)
    _, metadata = read_checkpoint(path)
    torch.save({"state_dict": rule.head.state_dict(), "specbench": {**metadata, "tokenizer_hash": "0" * 16}},
               tmp_path / "other-tokenizer.pt")  # fmt: skip
    with pytest.raises(CheckpointMismatchError, match="tokenizer_hash"):
        load_diversed_rule(tmp_path / "other-tokenizer.pt", verifier, drafter)
    torch.save({"state_dict": {}, "specbench": {"method": "sd2"}}, tmp_path / "sd2.pt")
    with pytest.raises(CheckpointMismatchError, match="not a DIVERSED head"):
        load_diversed_rule(tmp_path / "sd2.pt", verifier, drafter)
    assert issubclass(CheckpointMismatchError, ValueError)


# ---------------------------------------------------------------------------------------------------------
# A short Lightning run: last.ckpt, resume (with the reward baseline), export, load
# ---------------------------------------------------------------------------------------------------------


def _train_config(tmp_path, max_steps: int):
    data = tmp_path / "prompts.jsonl"
    if not data.exists():
        rows = [{"id": i, "prompt": f"Say {w}", "reference": w} for i, w in enumerate(
            ["hello", "cat", "dog", "the sun", "blue sky", "red", "one two", "green tea"])]  # fmt: skip
        data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return compose_config([
        "model/verifier=tiny-random", "model/drafter=tiny-random", "method=diversed", "dataset=jsonl",
        f"dataset.path={data}", "dataset.metric=bleu", "gen.max_new_tokens=6", "runtime.device=cpu",
        f"train.max_steps={max_steps}", "train.batch_size=2", "train.rollouts_per_prompt=2",
        "train.lr_start=0.01", "train.lr_end=0.001", "train.warmup_steps=1", "train.val_every_steps=2",
        "train.val_prompts=2", "train.checkpoint_every_steps=1", "tracking=none",
    ])  # fmt: skip


class _BaselineAtStart(__import__("lightning").pytorch.Callback):
    def on_train_start(self, trainer, pl_module):
        self.baseline = pl_module.baseline


def _letters(texts, items):
    """A dense toy reward (share of ASCII letters), so the baseline moves with random tiny models."""
    return [sum(c.isascii() and c.isalpha() for c in t) / max(len(t), 1) for t in texts]


def _fit(tmp_path, max_steps: int, resume: bool):
    from specbench.data.datasets import load_dataset_prompts
    from specbench.models.loading import load_verifier
    from specbench.pairs import load_drafter

    cfg = _train_config(tmp_path, max_steps)
    verifier = load_verifier(ModelSpec(**cfg.model.verifier), "cpu", "float32")
    drafter = load_drafter(ModelSpec(**cfg.model.drafter), verifier, "cpu", "float32")
    module, data = build_diversed_training(cfg, verifier, drafter, load_dataset_prompts(cfg.dataset))
    module.reward = _letters
    assert isinstance(module, DiversedModule) and not module.automatic_optimization
    assert {n for n, p in module.named_parameters() if p.requires_grad} == {
        "head.linear.weight",
        "head.linear.bias",
    }
    out = tmp_path / "run"
    start = _BaselineAtStart()
    trainer, metrics = build_trainer(cfg.train, out, NULL_TRACKER, torch.device("cpu"), callbacks=[start],
                                     automatic_optimization=module.automatic_optimization)  # fmt: skip
    trainer.fit(module, datamodule=data, ckpt_path=last_checkpoint(out) if resume else None)
    return module, trainer, metrics, out, verifier, drafter, start.baseline


def test_short_training_run_checkpoints_and_resumes(tmp_path):
    module, trainer, metrics, out, verifier, drafter, start = _fit(tmp_path, 2, resume=False)
    assert start is None
    assert trainer.global_step == 2
    ckpt = last_checkpoint(out)
    assert ckpt is not None
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert set(saved["state_dict"]) == {"head.linear.weight", "head.linear.bias"}  # no frozen LM weights
    assert saved["specbench"]["method"] == "diversed" and saved["specbench"]["trained_steps"] == 2
    baseline = saved["diversed_baseline"]
    assert baseline is not None and baseline > 0 and baseline == module.baseline
    for key in ("train/reward", "train/advantage", "train/baseline", "train/mean_draft_weight",
                "train/loss_pg", "train/loss_reg", "val/reward", "val/acceptance_rate"):  # fmt: skip
        assert key in metrics.last, key
    head_after_two = {k: v.clone() for k, v in module.head.state_dict().items()}
    assert not torch.equal(
        head_after_two["linear.weight"][0], head_after_two["linear.weight"][1]
    )  # it trained

    resumed, trainer2, _, _, _, _, start = _fit(tmp_path, 3, resume=True)
    assert trainer2.global_step == 3
    assert start == baseline  # the resumed run continued with the saved reward baseline
    assert resumed.baseline != baseline  # and one more step moved it
    path = export_trained(resumed, resumed.metadata(), out / "trained.pt")
    rule = load_diversed_rule(path, verifier, drafter, "linear")
    assert torch.equal(rule.head.linear.weight, resumed.head.linear.weight)
    # The Lightning checkpoint (now the resumed run's step 3) loads as a head too.
    assert load_diversed_rule(ckpt, verifier, drafter).head.linear.weight.equal(resumed.head.linear.weight)
