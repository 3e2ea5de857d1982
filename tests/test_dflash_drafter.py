"""The DFlash drafter through the engine (docs/dflash.md): greedy output equals the verifier's at batch 1 and
4; the joint law of the first two tokens at T = 1 is the verifier's; after every round (partial acceptances
included) the draft's context equals a fresh prefill's. The draft is a tiny random DFlash network fitted for a
few seconds to the verifier's greedy continuations, so that it proposes tokens the verifier accepts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specbench.decoding.cache import CachedModel
from specbench.decoding.engine import GenerationSettings, SpeculativeEngine
from specbench.decoding.schedules import DraftSchedule
from specbench.drafters.base import VerifierView
from specbench.drafters.dflash.config import DFlashConfig
from specbench.drafters.dflash.drafter import DFlashDrafter, verifier_needs
from specbench.drafters.dflash.model import DFlashDraftModel
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model
from specbench.pairs import check_drafter_spec

VOCAB, LAYERS, BLOCK = 259, 4, 4
STEPS = 100
TAPS = (0, 1, 3)  # z-lab ids; 3 = the last layer: HF's final-normed entry, the view's hidden


def draft_config(mask_token_id=300) -> DFlashConfig:
    return DFlashConfig.from_dict({
        "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 320, "num_target_layers": LAYERS,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 1024,
        "dflash_config": {
            "block_size": BLOCK, "mask_token_id": mask_token_id, "target_layer_ids": list(TAPS)
        },
    })  # fmt: skip


@pytest.fixture(scope="module")
def verifier():
    return tiny_random_model("qwen3", num_layers=LAYERS)


def prompts_for(count, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(32, 127, (int(torch.randint(3, 12, (1,), generator=g)),), generator=g).tolist()
            for _ in range(count)]  # fmt: skip


def greedy(verifier, prompt, max_new):
    out = verifier.generate(torch.tensor([prompt]), max_new_tokens=max_new, do_sample=False,
                            eos_token_id=EOS_ID, pad_token_id=PAD_ID)  # fmt: skip
    return out[0, len(prompt) :].tolist()


def hf_features(verifier, ids: torch.Tensor) -> torch.Tensor:
    """z-lab's context features: HF hidden_states[id + 1] for each target layer id, concatenated."""
    states = verifier(ids, output_hidden_states=True).hidden_states
    return torch.cat([states[i + 1] for i in TAPS], dim=-1)


def fit_draft(verifier, steps):
    """A random draft network fitted 100 steps to predict blocks of the verifier's greedy continuations of
    the test prompts (the tests need drafts the verifier accepts, not a draft that generalises)."""
    torch.manual_seed(0)
    model = DFlashDraftModel(draft_config())
    prompts = prompts_for(7, seed=5) + [[66]] + prompts_for(4, seed=7) + prompts_for(1, seed=11)
    sequences = [p + greedy(verifier, p, 40) for p in prompts]
    with torch.no_grad():
        features = [hf_features(verifier, torch.tensor([s]))[0] for s in sequences]
    embedding, head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        rows = torch.randint(len(sequences), (32,), generator=g).tolist()
        anchors = [int(torch.randint(1, len(sequences[r]) - BLOCK, (1,), generator=g)) for r in rows]
        width = max(anchors)
        ctx = torch.zeros(len(rows), width, features[0].shape[-1])
        valid = torch.zeros(len(rows), width, dtype=torch.bool)
        for b, (r, a) in enumerate(zip(rows, anchors)):
            ctx[b, width - a :], valid[b, width - a :] = features[r][:a], True
        cache = model.empty_cache(len(rows))
        cache.append(model.context_kv(ctx, (valid.long().cumsum(1) - 1).clamp(min=0)), valid)
        last = torch.tensor([sequences[r][a] for r, a in zip(rows, anchors)])
        positions = torch.tensor(anchors)[:, None] + torch.arange(BLOCK)[None, :]
        hidden = model(model.embed_block(model.block_ids(last, BLOCK), embedding), positions, cache)[:, 1:]
        targets = torch.tensor([sequences[r][a + 1 : a + BLOCK] for r, a in zip(rows, anchors)])
        loss = F.cross_entropy(head(hidden)[..., :VOCAB].flatten(0, 1), targets.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def draft(verifier):
    return fit_draft(verifier, STEPS)


def engine_for(verifier, drafter, gamma=3, max_new=24, temperature=0.0, schedule="constant", eos=(EOS_ID,)):
    return SpeculativeEngine(
        verifier, drafter, schedule=DraftSchedule(schedule, gamma, max_gamma=max(gamma, 6)),
        settings=GenerationSettings(max_new_tokens=max_new, temperature=temperature, seed=0),
        vocab_size=VOCAB, eos_token_ids=list(eos), pad_token_id=PAD_ID,
    )  # fmt: skip


def test_taps_map_zlab_layer_ids_to_specbench_taps():
    needs = verifier_needs((0, 1, 3), 4)
    assert needs.taps == (1, 2) and needs.hidden
    assert verifier_needs((1, 9, 17, 25, 33), 36).taps == (2, 10, 18, 26, 34)  # vLLM's aux layer ids
    assert not verifier_needs((1, 9, 17, 25, 33), 36).hidden


@pytest.mark.parametrize(("batch_size", "gamma", "schedule"), [(1, 3, "constant"), (4, 3, "constant"),
                                                               (4, 6, "dynamic")])  # fmt: skip
def test_greedy_decoding_equals_the_verifiers_greedy_output(verifier, draft, batch_size, gamma, schedule):
    prompts = prompts_for(7, seed=5)
    prompts.insert(1, [66])  # a one-token prompt: no context yet, the block attends only to itself
    engine = engine_for(verifier, DFlashDrafter(draft, verifier, VOCAB), gamma=gamma, schedule=schedule)
    results = []
    for first in range(0, len(prompts), batch_size):
        results += engine.generate(prompts[first : first + batch_size])
    for prompt, result in zip(prompts, results):
        assert result.output_ids == greedy(verifier, prompt, 24)
    rounds = [r for result in results for r in result.rounds]
    assert max(r.drafted for r in rounds) <= BLOCK - 1  # one forward drafts at most block_size - 1
    if schedule == "constant":
        assert max(r.drafted for r in rounds) == min(gamma, BLOCK - 1)
    assert sum(r.accepted for r in rounds) >= 20 and max(r.accepted for r in rounds) >= 2
    assert any(0 < r.accepted < r.drafted for r in rounds)  # partial acceptances are exercised


class CheckedDrafter(DFlashDrafter):
    """After every commit, compares the context cache with a fresh prefill of the committed tokens."""

    checks = partial = 0

    def commit(self, state, view, accepted):
        super().commit(state, view, accepted)
        drafted = (view.valid.sum(dim=1) - 1).clamp(min=0)
        CheckedDrafter.partial += int(((accepted > 0) & (accepted < drafted)).sum())
        verifier = CachedModel(self._verifier, VOCAB)
        verifier.reset(state.size)
        context, valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        out = verifier.forward(context, valid, output_hidden=self.needs.hidden, output_taps=self.needs.taps)
        fresh = DFlashDrafter(self.model, self._verifier, VOCAB)
        fresh.reset(state.size)
        fresh.prefill(state, VerifierView(context, valid, out.hidden, out.taps))
        assert torch.equal(fresh.cache.lengths, self.cache.lengths)
        for row in range(state.size):
            mine, theirs = self.cache.valid[row], fresh.cache.valid[row]
            for layer in range(len(self.cache.keys)):
                for a, b in ((self.cache.keys, fresh.cache.keys), (self.cache.values, fresh.cache.values)):
                    torch.testing.assert_close(
                        a[layer][row][:, mine], b[layer][row][:, theirs], atol=1e-5, rtol=1e-4
                    )
        CheckedDrafter.checks += 1


class TrimmedDrafter(CheckedDrafter):
    """Verifies fewer drafts than one forward drafted (every other row loses its last one), as a schedule
    may (``Proposal.truncated``)."""

    def propose(self, state, caps, sampler, want_hidden=False):
        proposal = super().propose(state, caps, sampler, want_hidden)
        cut = proposal.lengths - (torch.arange(state.size, device=state.device) % 2 == 0).long()
        return proposal.truncated(cut.clamp(min=0))


@pytest.mark.parametrize(
    ("temperature", "cls"), [(0.0, CheckedDrafter), (1.0, CheckedDrafter), (0.0, TrimmedDrafter)]
)
def test_the_context_after_a_partial_acceptance_equals_a_fresh_prefill(verifier, draft, temperature, cls):
    CheckedDrafter.checks = CheckedDrafter.partial = 0
    drafter = cls(draft, verifier, VOCAB)
    drafter._verifier = verifier
    prompts = prompts_for(4, seed=7)
    results = engine_for(verifier, drafter, gamma=3, max_new=16, temperature=temperature).generate(prompts)
    assert CheckedDrafter.checks >= 4 and CheckedDrafter.partial >= 1
    if temperature == 0.0:
        assert [r.output_ids for r in results] == [greedy(verifier, p, 16) for p in prompts]


def until(tokens, stop):
    return tokens[: tokens.index(stop) + 1] if stop in tokens else tokens


def test_rows_that_finish_early_leave_the_other_rows_context_intact(verifier, draft):
    """A stop token that ends one row mid-batch (select_rows): the others keep decoding exactly, their
    context still equal to a fresh prefill's."""
    prompts = prompts_for(4, seed=7)
    stop = greedy(verifier, prompts[0], 16)[5]
    assert all(stop not in greedy(verifier, p, 16)[:8] for p in prompts[1:])  # row 0 finishes first
    CheckedDrafter.checks = CheckedDrafter.partial = 0
    drafter = CheckedDrafter(draft, verifier, VOCAB)
    drafter._verifier = verifier
    results = engine_for(verifier, drafter, max_new=16, eos=(EOS_ID, stop)).generate(prompts)
    assert [r.output_ids for r in results] == [until(greedy(verifier, p, 16), stop) for p in prompts]
    assert len(results[0].output_ids) <= 6 and CheckedDrafter.checks > len(results[0].rounds)


def test_joint_law_of_the_first_two_tokens_at_temperature_one_is_the_verifiers(verifier, draft):
    """Chi-square of 3000 (y1, y2) pairs against p(y1 | x) p(y2 | x, y1) at T = 1."""
    from scipy.stats import chisquare

    prompt = prompts_for(1, seed=11)[0]
    with torch.no_grad():
        p1 = torch.softmax(verifier(torch.tensor([prompt])).logits[0, -1, :VOCAB].float(), dim=-1)
        pairs = torch.tensor([prompt + [y] for y in range(VOCAB)])
        p2 = torch.softmax(verifier(pairs).logits[:, -1, :VOCAB].float(), dim=-1)
    joint = p1[:, None] * p2
    joint[EOS_ID] = 0.0  # an EOS first token ends the row: its own cell, the last one
    joint = torch.cat([joint.flatten(), p1[EOS_ID : EOS_ID + 1]])
    engine = engine_for(verifier, DFlashDrafter(draft, verifier, VOCAB), gamma=3, max_new=2, temperature=1.0)
    counts = torch.zeros(VOCAB * VOCAB + 1)
    drafted = accepted = 0
    for seed in range(6):
        engine.reseed(seed)
        for result in engine.generate([prompt] * 500):
            y = result.output_ids
            counts[y[0] * VOCAB + y[1] if len(y) == 2 else VOCAB * VOCAB] += 1
            drafted += result.rounds[0].drafted
            accepted += result.rounds[0].accepted
    assert accepted > 0.05 * drafted  # the drafts, not only the residual, make the law
    expected = joint * counts.sum()
    big = expected >= 5
    assert int(big.sum()) >= 5
    observed = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    wanted = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    pvalue = chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue
    assert pvalue > 1e-3


def test_the_config_spec_and_a_missing_path(verifier):
    from helpers import compose_config

    import specbench.config  # noqa: F401  (registers the schemas)

    cfg = compose_config(["model/drafter=dflash"])
    spec = cfg.model.drafter
    factory = check_drafter_spec(spec._target_, dict(spec.params))
    with pytest.raises(ValueError, match="model.drafter.params.path is null"):
        factory(path=None, verifier=verifier, vocab_size=VOCAB)


def test_a_learned_mask_drafts_for_a_llama_verifier_and_the_block_size_caps_the_drafts():
    """The draft is Qwen3-style whatever the verifier (z-lab's Llama-3.1 draft too); batch 2."""
    verifier = tiny_random_model("llama", num_layers=LAYERS, seed=3)
    torch.manual_seed(0)
    model = DFlashDraftModel(draft_config(mask_token_id=None)).eval()
    with torch.no_grad():
        model.mask_embedding.normal_()
    drafter = DFlashDrafter(model, verifier, VOCAB, block_size=3)
    prompts = prompts_for(2, seed=3)
    results = engine_for(verifier, drafter, gamma=6, max_new=10).generate(prompts)
    assert [r.output_ids for r in results] == [greedy(verifier, p, 10) for p in prompts]
    assert max(r.drafted for result in results for r in result.rounds) == 2


def reference_logits(verifier, model, ids):
    """z-lab's draft step restated from scratch: HF ``hidden_states[id + 1]`` of every token but the last as
    context at positions 0.., the block [last token, masks] after it; its draft logits (W - 1, VOCAB)."""
    embedding, head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    with torch.no_grad():
        cache = model.empty_cache(1)
        if len(ids) > 1:
            features = hf_features(verifier, torch.tensor([ids[:-1]]))
            cache.append(model.context_kv(features, torch.arange(len(ids) - 1)[None]),
                         torch.ones(1, len(ids) - 1, dtype=torch.bool))  # fmt: skip
        positions = len(ids) - 1 + torch.arange(BLOCK)[None]
        block = model.embed_block(model.block_ids(torch.tensor([ids[-1]]), BLOCK), embedding)
        return head(model(block, positions, cache)[:, 1:])[0, :, :VOCAB]


class RecordingDrafter(DFlashDrafter):
    rounds: list

    def draft_logits(self, state, want_hidden=False):
        logits, hidden = super().draft_logits(state, want_hidden)
        self.rounds.append(([state.row_tokens(row) for row in range(state.size)], logits))
        return logits, hidden


def test_draft_logits_equal_the_reference_step_on_hf_hidden_states(verifier, draft):
    """Every round, the drafter's logits (taps read from the engine's views, the last layer's from the
    final-normed state; context grown incrementally) equal the from-scratch reference step's."""
    drafter = RecordingDrafter(draft, verifier, VOCAB)
    drafter.rounds = []
    prompts = prompts_for(3, seed=5)
    engine_for(verifier, drafter, gamma=BLOCK - 1, max_new=20).generate(prompts)
    assert len(drafter.rounds) >= 5
    widths = set()
    for rows, logits in drafter.rounds:
        widths.add(logits.shape[1])  # the LM head runs on the slots the round drafts (caps near the budget)
        for row, ids in enumerate(rows):
            reference = reference_logits(verifier, draft, ids)
            torch.testing.assert_close(logits[row], reference[: logits.shape[1]], atol=1e-4, rtol=1e-4)
    assert BLOCK - 1 in widths


def test_the_factory_loads_an_exported_draft_for_a_loaded_verifier(verifier, draft, tmp_path):
    from specbench.drafters.dflash.checkpoint import export_dflash
    from specbench.drafters.dflash.drafter import dflash_drafter
    from specbench.models.loading import LoadedModel, ModelSpec
    from specbench.models.tiny import byte_tokenizer

    export_dflash(draft, tmp_path / "draft")
    loaded = LoadedModel(verifier, byte_tokenizer(), ModelSpec(kind="tiny_random"), "tiny")
    drafter = dflash_drafter(str(tmp_path / "draft"), loaded, VOCAB)
    assert drafter.describe() == {"drafter": "dflash (draft)", "drafter_kind": "dflash",
                                  "target_layer_ids": list(TAPS), "block_size": BLOCK,
                                  "draft_vocab_size": None}  # fmt: skip
    prompt = prompts_for(1, seed=5)[0]
    result = engine_for(verifier, drafter, gamma=3, max_new=16).generate([prompt])[0]
    assert result.output_ids == greedy(verifier, prompt, 16) and sum(r.accepted for r in result.rounds) > 0
