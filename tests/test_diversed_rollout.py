"""DIVERSED rollouts decode through the engine's drafter objects: any drafter with hidden states works, and
the policy's q_t / hidden state come from the position that predicts y_t (checked against oracles)."""

from __future__ import annotations

import functools
import json

import pytest
import torch

from specbench.decoding import GenerationSettings, SpeculativeEngine
from specbench.decoding.cache import CachedModel
from specbench.decoding.diversed import WeightHead
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.warping import Warping
from specbench.drafters.eagle3 import Eagle3Drafter
from specbench.drafters.eagle3.head import Eagle3Head
from specbench.drafters.prompt_lookup import PromptLookupDrafter
from specbench.models.draft_vocab import DraftVocab
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model
from specbench.training.diversed_rollout import rollout

VOCAB = 259
PROMPTS = [[72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77], [65, 66]]
MAX_NEW = 12


@functools.cache
def verifier_model():
    return tiny_random_model("llama", seed=0, num_layers=6)


@functools.cache
def drafter_model():
    return tiny_random_model("llama", seed=3, num_layers=1, hidden_size=32)


def eagle_drafter() -> Eagle3Drafter:
    """The same perturbed head on every call (its layers start from the seeded global RNG)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        head = Eagle3Head.for_verifier(
            verifier_model(), DraftVocab(torch.arange(0, VOCAB, 2), VOCAB)
        )  # even ids
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in head.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return Eagle3Drafter(head)


def constant_head(drafter_hidden: int, draft_weight: float) -> WeightHead:
    """A head whose w_draft is ``draft_weight`` (0 or 1 up to float rounding) for every input."""
    head = WeightHead(drafter_hidden, verifier_model().config.hidden_size)
    logit = 40.0 if draft_weight > 0.5 else -40.0
    with torch.no_grad():
        head.linear.weight.zero_()
        head.linear.bias.copy_(torch.tensor([logit, 0.0]))
    return head


def run(drafter, draft_weight: float, prompts=PROMPTS, max_new=MAX_NEW, temperature=0.0, seed=0):
    head = constant_head(drafter.hidden_size, draft_weight)
    generator = torch.Generator().manual_seed(seed)
    return rollout(
        head, CachedModel(verifier_model(), VOCAB), drafter, prompts, max_new, Warping(temperature), "linear",
        (EOS_ID,), PAD_ID, generator,
    )  # fmt: skip


def autoregressive(model, prompts, max_new=MAX_NEW):
    engine = SpeculativeEngine(
        model, None, settings=GenerationSettings(max_new_tokens=max_new), vocab_size=VOCAB,
        eos_token_ids=(EOS_ID,), pad_token_id=PAD_ID,
    )  # fmt: skip
    return [r.output_ids for r in engine.generate(prompts)]


@pytest.mark.parametrize("make_drafter", [lambda: ModelDrafter(drafter_model(), VOCAB), eagle_drafter],
                         ids=["model", "eagle3"])  # fmt: skip
def test_a_zero_draft_weight_rolls_out_the_verifiers_greedy_output(make_drafter):
    assert run(make_drafter(), 0.0).outputs() == autoregressive(verifier_model(), PROMPTS)


def test_a_full_draft_weight_rolls_out_the_model_drafters_own_greedy_output():
    # π = q: the rollout is the drafter decoding alone, so each q_t is the drafter's at the right position.
    assert run(ModelDrafter(drafter_model(), VOCAB), 1.0).outputs() == autoregressive(
        drafter_model(), PROMPTS
    )


def test_an_eagle_rollout_continues_as_a_rollout_restarted_from_its_own_prefix():
    # π = q: token t comes from the head's features of the committed context; restarting from the prompt plus
    # the first t tokens (features then come from the prefill, not from the per-step commits) gives the same.
    full = run(eagle_drafter(), 1.0).outputs()
    for prompt, output in zip(PROMPTS, full):
        for t in (1, len(output) // 2, len(output) - 1):
            restarted = run(eagle_drafter(), 1.0, prompts=[prompt + output[:t]], max_new=1).outputs()[0]
            assert restarted == output[t : t + 1]


def test_sampled_rollouts_carry_the_heads_graph_for_every_drafter():
    for drafter in (ModelDrafter(drafter_model(), VOCAB), eagle_drafter()):
        head = WeightHead(drafter.hidden_size, verifier_model().config.hidden_size)
        out = rollout(head, CachedModel(verifier_model(), VOCAB), drafter, PROMPTS, 6, Warping(1.0), "linear",
                      (EOS_ID,), PAD_ID, torch.Generator().manual_seed(0))  # fmt: skip
        assert out.log_probs.requires_grad and bool((out.log_probs[out.mask] <= 0).all())
        (out.log_probs * out.mask).sum().backward()
        assert head.linear.weight.grad is not None and bool(head.linear.weight.grad.abs().sum() > 0)


def test_the_policy_stream_does_not_depend_on_the_drafters_own_draws():
    # With w = 0 the policy is p: two different drafters give the same sampled rollout for one seed.
    a = run(ModelDrafter(drafter_model(), VOCAB), 0.0, temperature=1.0, seed=5).outputs()
    b = run(eagle_drafter(), 0.0, temperature=1.0, seed=5).outputs()
    assert a == b


def test_a_drafter_without_hidden_states_is_refused():
    with pytest.raises(ValueError, match="hidden states"):
        run_head = WeightHead(8, verifier_model().config.hidden_size)
        rollout(
            run_head, CachedModel(verifier_model(), VOCAB), PromptLookupDrafter(), PROMPTS, 4, Warping(0.0)
        )


# --- training the head over an EAGLE-3 drafter
# ---------------------------------------------------------------


def _train_config(tmp_path, *drafter):
    from helpers import compose_config

    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(
        json.dumps({"id": i, "prompt": f"Say {w}", "reference": w}) + "\n"
        for i, w in enumerate(["hello", "cat", "dog", "the sun", "blue sky", "red"])
    ))  # fmt: skip
    return compose_config([
        "task=train", "model/verifier=tiny-random", *drafter, "method=diversed", "dataset=jsonl",
        f"dataset.path={data}", "dataset.metric=bleu", "gen.max_new_tokens=5", "runtime.device=cpu",
        "train.max_steps=2", "train.batch_size=2", "train.lr_start=0.05", "train.warmup_steps=0",
        "train.val_every_steps=2", "train.val_prompts=2", "tracking=none",
    ])  # fmt: skip


def test_diversed_training_accepts_an_eagle_head_and_refuses_a_lookup_drafter(tmp_path):
    from specbench.config.train_checks import validate_train
    from specbench.errors import ConfigError

    head = tmp_path / "head.pt"
    head.write_bytes(b"")  # validation only checks that it exists (nothing loads)
    plan = validate_train(
        _train_config(tmp_path, "model/drafter=eagle3", f"model.drafter.params.path={head}")
    )
    assert plan.method == "diversed" and plan.drafter.kind == "drafter"
    with pytest.raises(ConfigError, match="method=diversed pools the drafter's distribution q"):
        validate_train(_train_config(tmp_path, "model/drafter=prompt-lookup"))


def test_a_short_diversed_fit_over_an_eagle_head_trains_and_loads_for_decoding(tmp_path):
    from specbench.data.prompts import Prompt
    from specbench.decoding.diversed import load_diversed_rule
    from specbench.models.loading import LoadedModel, ModelSpec
    from specbench.models.tiny import byte_tokenizer
    from specbench.tracking import NULL_TRACKER
    from specbench.training.diversed import build_diversed_training
    from specbench.training.trainer import build_trainer, export_trained

    cfg = _train_config(tmp_path, "model/drafter=tiny-random")
    verifier = LoadedModel(verifier_model(), byte_tokenizer(), ModelSpec(kind="tiny_random"), "tiny-verifier")
    drafter = eagle_drafter()
    prompts = [
        Prompt(i, f"Say {w}", reference=w) for i, w in enumerate(["hello", "cat", "dog", "sun", "sky", "red"])
    ]
    module, data = build_diversed_training(cfg, verifier, drafter, prompts)
    module.reward = lambda texts, items: [float(len(t) % 3) / 2 for t in texts]  # any reward that varies
    start = {k: v.clone() for k, v in module.head.state_dict().items()}
    trainer, metrics = build_trainer(cfg.train, tmp_path / "run", NULL_TRACKER, torch.device("cpu"),
                                     automatic_optimization=False)  # fmt: skip
    trainer.fit(module, datamodule=data)
    assert trainer.global_step == 2 and "val/acceptance_rate" in metrics.last
    assert not torch.equal(start["linear.weight"], module.head.state_dict()["linear.weight"])
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    rule = load_diversed_rule(path, verifier, drafter)
    assert (
        module.metadata()["drafter"] == "eagle3"
        and module.metadata()["drafter_hidden_size"] == drafter.hidden_size
    )
    assert torch.equal(rule.head.linear.weight, module.head.linear.weight)


def test_the_rollouts_verifier_log_likelihood_is_the_teacher_forced_one():
    out = run(ModelDrafter(drafter_model(), VOCAB), 0.5, temperature=1.0, seed=3)
    for row, (prompt, output) in enumerate(zip(PROMPTS, out.outputs())):
        with torch.no_grad():
            logits = verifier_model()(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1, :VOCAB]
        oracle = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(output).unsqueeze(-1)).mean()
        assert out.mean_verifier_log_prob()[row] == pytest.approx(float(oracle), abs=1e-4)


def test_the_verifier_likelihood_reward_needs_no_references_and_the_regulariser_alone_raises_the_weight(
    tmp_path,
):
    from specbench.config.train_checks import validate_train
    from specbench.data.prompts import Prompt
    from specbench.models.loading import LoadedModel, ModelSpec
    from specbench.models.tiny import byte_tokenizer
    from specbench.tracking import NULL_TRACKER
    from specbench.training.diversed import build_diversed_training
    from specbench.training.trainer import build_trainer

    overrides = ["train.reward=verifier_logp", "train.reward_weight=0", "train.regularizer_weight=5",
                 "dataset.metric=none", "train.max_steps=4", "train.lr_start=0.5"]  # fmt: skip
    cfg = _train_config(tmp_path, "model/drafter=tiny-random")
    from omegaconf import OmegaConf

    cfg = OmegaConf.merge(cfg, OmegaConf.from_dotlist(overrides))
    validate_train(cfg)  # no references needed for this reward
    verifier = LoadedModel(verifier_model(), byte_tokenizer(), ModelSpec(kind="tiny_random"), "tiny-verifier")
    prompts = [Prompt(i, f"Say {w}") for i, w in enumerate(["hello", "cat", "dog", "sun", "sky", "red"])]
    module, data = build_diversed_training(cfg, verifier, eagle_drafter(), prompts)
    before = module.rollout(data.train_items[:2]).weights.mean().item()
    trainer, metrics = build_trainer(cfg.train, tmp_path / "run", NULL_TRACKER, torch.device("cpu"),
                                     automatic_optimization=False)  # fmt: skip
    trainer.fit(module, datamodule=data)
    assert metrics.last["train/reward"] < 0  # a mean log-likelihood
    assert metrics.last["train/loss_pg"] == 0.0
    assert module.rollout(data.train_items[:2]).weights.mean().item() > before + 0.05
    assert module.metadata()["reward_metric"] == "verifier_logp"


@pytest.mark.parametrize("pool", ["linear", "log_linear"])
def test_the_expected_log_likelihood_is_the_pools_expectation_with_its_gradient(pool):
    from specbench.decoding.rules import pool_distributions
    from specbench.training.diversed_rollout import expected_log_likelihood

    g = torch.Generator().manual_seed(0)
    log_p = torch.log_softmax(torch.randn(5, 40, generator=g) * 2, -1)
    p = log_p.exp()
    q = torch.softmax(torch.randn(5, 40, generator=g) * 2, -1)
    w = torch.rand(5, generator=g).requires_grad_()
    expected = expected_log_likelihood(log_p, p, q, w, pool)
    oracle = (pool_distributions(p, q, w.detach().unsqueeze(-1), pool) * log_p).sum(-1)
    torch.testing.assert_close(expected.detach(), oracle)
    expected.sum().backward()
    if pool == "linear":  # d/dw [(1 − w) Σ p log p + w Σ q log p] = Σ (q − p) log p
        torch.testing.assert_close(w.grad, ((q - p) * log_p).sum(-1))


@pytest.mark.parametrize("strength, direction", [(0.0, -1), (200.0, 1)])
def test_the_expected_likelihood_objective_moves_the_weight_as_its_trade_off_says(
    tmp_path, strength, direction
):
    # Drafting from q costs verifier likelihood (Σ (p − q) log p > 0 here) and buys acceptance (λ·TV): with λ
    # = 0
    # the head lowers w, with a large λ it raises it.
    from omegaconf import OmegaConf

    from specbench.data.prompts import Prompt
    from specbench.models.loading import LoadedModel, ModelSpec
    from specbench.models.tiny import byte_tokenizer
    from specbench.tracking import NULL_TRACKER
    from specbench.training.diversed import build_diversed_training
    from specbench.training.trainer import build_trainer

    cfg = OmegaConf.merge(_train_config(tmp_path, "model/drafter=tiny-random"), OmegaConf.from_dotlist([
        "train.reward=expected_verifier_logp", f"train.regularizer_weight={strength}", "train.max_steps=3",
        "train.lr_start=0.2", "dataset.metric=none", "train.val_prompts=0"]))  # fmt: skip
    verifier = LoadedModel(verifier_model(), byte_tokenizer(), ModelSpec(kind="tiny_random"), "tiny-verifier")
    prompts = [Prompt(i, f"Say {w}") for i, w in enumerate(["hello", "cat", "dog", "sun", "sky", "red"])]
    module, data = build_diversed_training(cfg, verifier, ModelDrafter(drafter_model(), VOCAB), prompts)
    before = module.rollout(data.train_items[:2]).weights.mean().item()
    trainer, _ = build_trainer(
        cfg.train, tmp_path / "run", NULL_TRACKER, torch.device("cpu"), automatic_optimization=False
    )
    trainer.fit(module, datamodule=data)
    after = module.rollout(data.train_items[:2]).weights.mean().item()
    assert direction * (after - before) > 0.05


def test_the_gate_loss_is_cross_entropy_against_the_per_token_optimum():
    from types import SimpleNamespace

    from specbench.training.diversed_objective import gate_loss

    cost = torch.tensor([[1.0, 6.0, 2.0, 9.0]])
    tv = torch.tensor(
        [[0.5, 0.5, 0.1, 0.9]]
    )  # with λ = 5: labels 1, 0, 0, 0 (1 < 2.5, 6 > 2.5, 2 > 0.5, 9 > 4.5)
    w = torch.tensor([[0.9, 0.2, 0.3, 0.6]], requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    out = SimpleNamespace(drafting_cost=cost, verifier_agreement=1 - tv, weights=w, mask=mask)
    loss = gate_loss(out, 5.0)
    expected = (
        -(torch.log(torch.tensor(0.9)) + torch.log(torch.tensor(0.8)) + torch.log(torch.tensor(0.7))) / 3
    )
    assert float(loss) == pytest.approx(float(expected), rel=1e-5)
    loss.backward()
    assert w.grad[0, 0] < 0 and w.grad[0, 1] > 0 and w.grad[0, 3] == 0  # towards the labels; masked out: none


def test_the_rollouts_drafting_cost_is_minus_the_likelihood_slope_of_the_linear_pool():
    from specbench.training.diversed_rollout import expected_log_likelihood

    g = torch.Generator().manual_seed(2)
    log_p = torch.log_softmax(torch.randn(3, 30, generator=g), -1)
    p, q = log_p.exp(), torch.softmax(torch.randn(3, 30, generator=g), -1)
    cost = ((p - q) * log_p).sum(-1)  # what the rollout records
    at = lambda w: expected_log_likelihood(log_p, p, q, torch.full((3,), w), "linear")
    torch.testing.assert_close(at(1.0) - at(0.0), -cost)
    out = run(ModelDrafter(drafter_model(), VOCAB), 0.5, temperature=1.0, seed=4, max_new=4)
    assert out.drafting_cost.shape == out.weights.shape and not out.drafting_cost.requires_grad
