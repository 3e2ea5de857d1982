"""EAGLE-3 heads (the specbench/drafters/eagle3/ package; specbench/training/eagle3.py, features.py).

Taps pinned against the verifier's own forward and SpecForge / vLLM indices; training-time test that
reproduces decoding (same inputs at the same positions, same logits at every depth); a TTT run that
learns; lossless greedy decoding at batch 1 and 4 and a chi-square test at T = 1 through the engine;
feature-cache reuse and refusal; export / load round trips and a checkpoint in the SpecForge layout
written by hand; Lightning fit, resume and loading for decoding.
"""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from specbench.data.prompts import Prompt
from specbench.data.synth_dataset import load_synthetic
from specbench.decoding.cache import CachedModel
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.engine import GenerationSettings, SpeculativeEngine
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping
from specbench.drafters.base import VerifierView
from specbench.drafters.eagle3 import Eagle3Drafter
from specbench.drafters.eagle3.format import (
    Eagle3FormatError,
    export_eagle3,
    load_eagle3_drafter,
    load_eagle3_pretrained,
)
from specbench.drafters.eagle3.head import Eagle3Head, default_taps, resolve_taps
from specbench.models.draft_vocab import DraftVocab
from specbench.models.loading import LoadedModel, ModelSpec, load_verifier
from specbench.models.pair import CheckpointMismatchError
from specbench.models.tiny import EOS_ID, PAD_ID, byte_tokenizer, tiny_random_model
from specbench.pipelines.synth_plan import SynthSettings
from specbench.pipelines.synthesize import synthesize
from specbench.training.batches import TargetSpec, verifier_batch, verifier_taps
from specbench.training.eagle3 import (
    build_eagle3_training,
    chain_tau_estimate,
    collate,
    ttt_chains,
    ttt_loss,
)
from specbench.training.feature_build import build_feature_cache
from specbench.training.features import FeatureCacheMismatch, cache_identity, open_feature_cache
from specbench.training.objectives import build_training
from specbench.training.trainer import build_trainer, export_trained, last_checkpoint

VOCAB = 259  # the byte tokenizer's size (the tiny LM heads have 320 rows)
LAYERS = 8  # default taps (2, 4, 5)


def tiny_verifier(arch="llama", seed=0, name="tiny-eagle-verifier") -> LoadedModel:
    spec = ModelSpec(kind="tiny_random", name=name, arch=arch, num_layers=LAYERS, seed=seed)
    return load_verifier(spec, device="cpu", dtype="float32")


@pytest.fixture(scope="module")
def verifier() -> LoadedModel:
    return tiny_verifier()


@pytest.fixture(scope="module")
def synth_dir(verifier, tmp_path_factory):
    """task=synth rows of the tiny verifier (greedy, so a small head can learn them)."""
    words = ["apple", "river", "stone", "cloud", "engine", "garden", "violin", "planet", "copper", "lantern"]
    prompts = [Prompt(i, f"{words[i % 10]} {words[(3 * i + 1) % 10]} {i}") for i in range(30)]
    settings = SynthSettings(
        target_len=56, max_prompt_len=40, temperature=0.0, batch_size=10, validation_fraction=0.2, seed=0
    )
    out = tmp_path_factory.mktemp("eagle-synth")
    synthesize(verifier, prompts, settings, out, progress=False)
    return out


@pytest.fixture(scope="module")
def data(synth_dir):
    return load_synthetic(str(synth_dir))[0]


def batch_of(rows, verifier, taps, vocab, top_k=None):
    from specbench.training.batches import pad_batch

    batch = pad_batch([dict(r) for r in rows], PAD_ID)
    return {**batch, **verifier_batch(verifier.model, batch, taps, TargetSpec(vocab, top_k))}


def perturbed_head(verifier, vocab, seed=0, taps=None):
    head = Eagle3Head.for_verifier(verifier.model, vocab, taps)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in head.parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=generator))
    return head.eval()


@pytest.fixture(scope="module")
def trained_head(verifier, data):
    """A head over a 64-token draft vocabulary, trained 80 TTT steps on the synthetic rows."""
    torch.manual_seed(0)
    rows = data["train"]
    vocab = DraftVocab.from_rows(zip(rows["input_ids"], rows["loss_mask"]), 64, VOCAB)
    head = Eagle3Head.for_verifier(verifier.model, vocab).train()
    batch = batch_of(rows, verifier, head.taps, vocab)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=6e-3)
    for _ in range(80):
        loss = ttt_loss(head, batch, 3)["loss"]
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return head.eval().requires_grad_(False)


# --- taps --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("layers", [8, 30, 32, 36, 80])
def test_default_taps_are_specforge_and_vllm_indices(layers):
    specforge = (1 + 1, layers // 2 - 1 + 1, layers - 4 + 1)  # hidden_states[...] with the embedding offset
    vllm = (2, layers // 2, layers - 3)  # aux layers = inputs of these decoder layers
    assert default_taps(layers) == specforge == vllm == resolve_taps(None, layers)
    assert default_taps(30) == (2, 15, 27)  # the embedded SmolLM2-135M


def test_taps_are_validated_against_the_depth():
    assert resolve_taps([0, 3, 8], 8) == (0, 3, 8)
    with pytest.raises(ValueError, match=r"\[9\] outside \[0, 8\]"):
        resolve_taps([2, 9], 8)
    with pytest.raises(ValueError, match=">= 3 layers"):
        resolve_taps(None, 2)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_taps_are_the_models_own_hidden_states_and_layer_inputs(arch):
    verifier = tiny_verifier(arch)
    model = verifier.model
    assert any(
        (p - 1).abs().max() > 0.1 for n, p in model.named_parameters() if "norm" in n
    )  # non-unit norms
    ids = torch.randint(0, 250, (2, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    taps, last = verifier_taps(model, ids, mask, range(LAYERS + 1))
    reference = model(input_ids=ids, attention_mask=mask, output_hidden_states=True)
    for i in range(LAYERS):  # transformers: hidden_states[i] = after i layers (0 = embeddings)
        torch.testing.assert_close(taps[i], reference.hidden_states[i])
    torch.testing.assert_close(
        model.model.norm(taps[LAYERS]), reference.hidden_states[LAYERS]
    )  # normed there
    torch.testing.assert_close(model.lm_head(last), reference.logits)
    outputs = {}  # SpecForge's HF backend hooks layer *outputs* 1, N//2 - 1, N - 4
    handles = [
        model.model.layers[i].register_forward_hook(lambda m, a, o, i=i: outputs.__setitem__(i, o))
        for i in (1, LAYERS // 2 - 1, LAYERS - 4)
    ]
    model(input_ids=ids, attention_mask=mask)
    for handle in handles:
        handle.remove()
    for tap, layer_output in zip(default_taps(LAYERS), (1, LAYERS // 2 - 1, LAYERS - 4)):
        torch.testing.assert_close(taps[tap], outputs[layer_output])


# --- training-time test = decoding -------------------------------------------------------------------------


def test_ttt_steps_reproduce_the_decoding_drafts_at_every_depth(verifier, data):
    """Prefill + propose (the decoding path, left-padded batch, the head's KV cache) and the unrolled
    training-time test over prompt + drafts give the same step inputs at the same positions and the
    same draft distributions at every depth."""
    vocab = DraftVocab.full(VOCAB)
    head = perturbed_head(verifier, vocab, seed=3)
    prompts = [data["train"][i]["input_ids"][: data["train"][i]["prompt_len"]] for i in range(3)]
    prompts[1] = prompts[1][:-5]  # rows of different lengths
    depth = 4
    drafter = Eagle3Drafter(head)
    state = BatchState.create(prompts, depth, 32, [EOS_ID], PAD_ID, "cpu")
    cached = CachedModel(verifier.model, VOCAB)
    cached.reset(state.size)
    context, valid = state.tokens[:, :-1], state.token_valid[:, :-1]
    out = cached.forward(context, valid, output_taps=head.taps)
    drafter.reset(state.size)
    seen = []
    original = head.layer
    head.layer = lambda e, f, m, p, c: seen.append((e, f, p)) or original(e, f, m, p, c)
    drafter.prefill(state, VerifierView(context, valid, None, out.taps))
    sampler = DraftSampler(Warping(0.0), torch.Generator(), DraftSchedule("constant", depth))
    proposal = drafter.propose(state, torch.full((3,), depth), sampler)
    decoding_inputs = seen[0]
    seen.clear()
    assert proposal.lengths.tolist() == [depth] * 3
    for row, prompt in enumerate(prompts):
        sequence = prompt + proposal.tokens[row].tolist()
        batch = batch_of(
            [
                {
                    "input_ids": sequence,
                    "loss_mask": [0] * len(prompt) + [1] * depth,
                    "prompt_len": len(prompt),
                }
            ],
            verifier,
            head.taps,
            vocab,
        )
        steps, index, _ = head.unroll(
            batch["input_ids"][:, 1:], batch["features"][:, :-1], batch["attention_mask"][:, 1:].bool(), depth
        )
        assert index[0].tolist() == list(range(len(sequence) - 1))
        n = len(prompt)
        embeds, fused, positions = seen[0]
        # step 0: index t pairs the feature at t with token t + 1, at position t (t = 0 .. n - 2)
        width = decoding_inputs[1].shape[1]
        decoded = slice(width - (n - 1), width)
        torch.testing.assert_close(decoding_inputs[0][row, decoded], embeds[0, : n - 1])
        torch.testing.assert_close(decoding_inputs[1][row, decoded], fused[0, : n - 1], atol=1e-4, rtol=1e-3)
        assert (
            decoding_inputs[2][row, decoded].tolist() == positions[0, : n - 1].tolist() == list(range(n - 1))
        )
        for step in range(
            depth
        ):  # draft step + 1 after committed position n - 2 is TTT step `step` at index n - 2
            q_train = F.softmax(head.logits(steps[step][0, n - 2]).float(), dim=-1)
            torch.testing.assert_close(proposal.q[row, step], q_train, atol=1e-4, rtol=1e-3)
        seen.clear()


def test_ttt_loss_counts_response_predictions_with_the_argmax_in_the_draft_vocabulary(verifier, data):
    rows = [data["train"][i] for i in range(4)]
    counts = {}
    for row in rows:
        for t, m in zip(row["input_ids"], row["loss_mask"]):
            counts[t] = counts.get(t, 0) + m
    vocab = DraftVocab.from_counts(counts, 24, VOCAB)
    head = perturbed_head(verifier, vocab, seed=1)
    batch = batch_of(rows, verifier, head.taps, vocab)
    out = ttt_loss(head, batch, 1)
    # Step 0 by hand: head index t (token t + 1, feature t) predicts token t + 2 from p at position t + 1.
    logits = head(batch["input_ids"][:, 1:], verifier_features=batch["features"][:, :-1]).logits
    total, positions = 0.0, 0
    full = verifier.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[
        ..., :VOCAB
    ]
    for b, row in enumerate(rows):
        mask = row["loss_mask"]
        for t in range(len(row["input_ids"]) - 2):
            if not mask[t + 2]:
                continue
            positions += 1
            if not vocab.contains(full[b, t + 1].argmax()):
                continue
            p = F.softmax(vocab.restrict(full[b, t + 1]), dim=-1)
            total += float(-(p * F.log_softmax(logits[b, t], dim=-1)).sum())
    assert positions == int(out["positions"][0]) > 0
    assert math.isclose(float(out["loss"]), total / positions, rel_tol=1e-4)
    deeper = ttt_loss(head, batch, 3)
    assert math.isclose(
        float(deeper["loss"]),
        sum(0.8**i * float(x) for i, x in enumerate(deeper["step_losses"])),
        rel_tol=1e-5,
    )
    assert math.isclose(float(deeper["step_losses"][0]), float(out["loss"]), rel_tol=1e-5)
    size, length = batch["input_ids"].shape  # skipping the chains that reach no target changes nothing
    all_chains = (torch.arange(length - 1).expand(size, -1), batch["attention_mask"][:, 1:].bool())
    assert int(ttt_chains(batch["predict"], 3)[1].sum()) < int(all_chains[1].sum())
    everything = ttt_loss(head, batch, 3, chains=all_chains)
    for a, b in zip(deeper["step_losses"], everything["step_losses"]):
        assert math.isclose(float(a), float(b), rel_tol=1e-5)
    assert [int(c) for c in deeper["positions"]] == [int(c) for c in everything["positions"]]
    # anchored TTT: a quarter of the chains, an unbiased estimate of the same loss
    sampled = ttt_chains(batch["predict"], 3, 0.25, torch.Generator().manual_seed(0))
    counts = ttt_chains(batch["predict"], 3)[1].sum(dim=1)
    assert sampled[1].sum(dim=1).tolist() == torch.ceil(counts * 0.25).long().tolist()
    estimates = [
        float(
            ttt_loss(
                head, batch, 3, chains=ttt_chains(batch["predict"], 3, 0.25, torch.Generator().manual_seed(s))
            )["loss"]
        )
        for s in range(12)
    ]
    assert abs(sum(estimates) / 12 - float(deeper["loss"])) < 0.05 * float(deeper["loss"])


def test_training_time_test_lowers_the_loss_on_a_tiny_run(verifier, data):
    torch.manual_seed(0)
    vocab = DraftVocab.full(VOCAB)
    head = Eagle3Head.for_verifier(verifier.model, vocab).train()
    batch = batch_of(data["train"], verifier, head.taps, vocab, top_k=16)
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=3e-3)
    first = ttt_loss(head, batch, 3)
    for _ in range(25):
        out = ttt_loss(head, batch, 3)
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    last = ttt_loss(head, batch, 3)
    assert float(last["loss"]) < 0.8 * float(first["loss"])
    assert int(last["correct"][0]) > 2 * int(first["correct"][0]) + 5


def test_chain_tau_estimate_is_the_expected_accepted_chain():
    assert chain_tau_estimate([]) == 1.0
    assert chain_tau_estimate([1.0, 1.0, 1.0]) == 4.0
    assert math.isclose(chain_tau_estimate([0.5, 0.5]), 1 + 0.5 + 0.25)


# --- decoding through the engine ---------------------------------------------------------------------------


def engine_for(verifier, head, gamma=3, max_new=24, temperature=0.0, seed=0, schedule="constant"):
    return SpeculativeEngine(
        verifier.model,
        Eagle3Drafter(head),
        schedule=DraftSchedule(schedule, gamma, max_gamma=max(gamma, 6)),
        settings=GenerationSettings(max_new_tokens=max_new, temperature=temperature, seed=seed),
        vocab_size=VOCAB,
        eos_token_ids=[EOS_ID],
        pad_token_id=PAD_ID,
    )


_REFERENCES: dict = {}


def greedy_reference(verifier, prompt, max_new):
    """The verifier's own greedy continuation (HF generate), computed once per prompt."""
    key = (id(verifier.model), tuple(prompt), max_new)
    if key not in _REFERENCES:
        out = verifier.model.generate(
            torch.tensor([prompt]),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=EOS_ID,
            pad_token_id=PAD_ID,
        )
        _REFERENCES[key] = out[0, len(prompt) :].tolist()
    return _REFERENCES[key]


@pytest.mark.parametrize(
    ("batch_size", "schedule"), [(1, "constant"), (4, "constant"), (4, "heuristic"), (4, "dynamic")]
)
def test_greedy_decoding_equals_the_verifiers_greedy_output(
    verifier, data, trained_head, batch_size, schedule
):
    rows = [data["train"][i] for i in range(4)] + [data["validation"][0]]
    prompts = [r["input_ids"][: r["prompt_len"]] for r in rows]
    prompts[2] = prompts[2][:9]  # rows of different lengths
    prompts.insert(1, [66])  # a one-token prompt: nothing to prefill, the head drafts from round 2 on
    prompts.append(prompts[0][:-3])
    engine = engine_for(verifier, trained_head, gamma=4, max_new=20, schedule=schedule)
    results = []
    for first in range(0, len(prompts), batch_size):
        results += engine.generate(prompts[first : first + batch_size])
    for prompt, result in zip(prompts, results):
        assert result.output_ids == greedy_reference(verifier, prompt, 20)
    accepted = [r.accepted for result in results for r in result.rounds]
    assert sum(accepted) >= 15 and max(accepted) >= 2  # multi-token commits are exercised


def test_first_token_law_at_temperature_one_is_the_verifiers(verifier, data, trained_head):
    """Chi-square of 3000 first emitted tokens against p(·|prompt) at T = 1: drafts come from a
    64-token draft vocabulary, so the tokens outside it must come from the residual with q = 0."""
    from scipy.stats import chisquare

    prompt = data["validation"][0]["input_ids"][: data["validation"][0]["prompt_len"]]
    p = torch.softmax(verifier.model(torch.tensor([prompt])).logits[0, -1, :VOCAB].float(), dim=-1)
    outside = float(p[~trained_head.vocab.t2d].sum())
    assert outside > 0.05
    engine = engine_for(verifier, trained_head, gamma=3, max_new=2, temperature=1.0)
    counts = torch.zeros(VOCAB)
    drafted = accepted = 0
    for seed in range(6):
        engine.reseed(seed)
        for result in engine.generate([prompt] * 500):
            counts[result.output_ids[0]] += 1
            drafted += result.rounds[0].drafted
            accepted += result.rounds[0].accepted
    assert accepted > 0.05 * drafted
    expected = p * counts.sum()
    big = expected >= 5
    observed = torch.cat([counts[big], counts[~big].sum(0, keepdim=True)])
    wanted = torch.cat([expected[big], expected[~big].sum(0, keepdim=True)])
    assert (
        chisquare(observed.numpy(), wanted.numpy() * observed.sum().item() / wanted.sum().item()).pvalue
        > 1e-3
    )


def test_proposal_hidden_is_the_final_normed_state_the_lm_head_reads(verifier, trained_head, data):
    prompt = data["train"][0]["input_ids"][: data["train"][0]["prompt_len"]]
    drafter = Eagle3Drafter(trained_head)
    state = BatchState.create([prompt], 3, 16, [EOS_ID], PAD_ID, "cpu")
    cached = CachedModel(verifier.model, VOCAB)
    cached.reset(1)
    out = cached.forward(state.tokens[:, :-1], state.token_valid[:, :-1], output_taps=trained_head.taps)
    drafter.reset(1)
    drafter.prefill(state, VerifierView(state.tokens[:, :-1], state.token_valid[:, :-1], None, out.taps))
    sampler = DraftSampler(Warping(1.0), torch.Generator().manual_seed(0), DraftSchedule("constant", 3))
    proposal = drafter.propose(state, torch.tensor([3]), sampler, want_hidden=True)
    assert proposal.hidden.shape == (1, 3, trained_head.hidden_size) and drafter.hidden_size == 64
    q = trained_head.vocab.expand_probs(F.softmax(trained_head.lm_head(proposal.hidden).float(), dim=-1))
    torch.testing.assert_close(q, proposal.q, atol=1e-5, rtol=1e-4)


# --- feature cache -----------------------------------------------------------------------------------------


def test_feature_cache_holds_the_verifier_pass_and_refuses_other_verifiers_and_data(verifier, data, tmp_path):
    rows = data["train"]
    vocab = DraftVocab.from_rows(zip(rows["input_ids"], rows["loss_mask"]), 40, VOCAB)
    taps, targets = (2, 4, 5), TargetSpec(vocab, top_k=8)
    cache = build_feature_cache(
        tmp_path, verifier, data, taps, targets, PAD_ID, batch_size=4, log=lambda _: None
    )
    stamp = (tmp_path / "features.json").stat().st_mtime_ns
    assert build_feature_cache(tmp_path, verifier, data, taps, targets, PAD_ID, log=print) is not None
    assert (tmp_path / "features.json").stat().st_mtime_ns == stamp  # reused, not rebuilt
    # the cached rows are the on-the-fly pass in bf16
    live = batch_of([rows[i] for i in range(3)], verifier, taps, vocab, top_k=8)
    cached = collate([{**rows[i], **cache["train"].row(i)} for i in range(3)], PAD_ID)
    torch.testing.assert_close(cached["features"].float(), live["features"], rtol=1e-2, atol=1e-2)
    assert torch.equal(cached["predict"], live["predict"]) and torch.equal(
        cached["in_vocab"], live["in_vocab"]
    )
    torch.testing.assert_close(cached["target_values"].float(), live["target_values"], rtol=1e-2, atol=2e-2)
    assert (cached["target_index"] == live["target_index"]).float().mean() > 0.97  # bf16 ties may reorder
    head = perturbed_head(verifier, vocab, seed=2)
    assert math.isclose(
        float(ttt_loss(head, cached, 3)["loss"]), float(ttt_loss(head, live, 3)["loss"]), rel_tol=2e-2
    )
    # a subset of the taps is served; anything else is refused with the reason
    assert open_feature_cache(tmp_path, cache_identity(verifier, data, (4,), None), (4,)) is not None
    same_name = tiny_verifier(seed=5)  # same name, other weights
    with pytest.raises(FeatureCacheMismatch, match="verifier weights"):
        build_feature_cache(tmp_path, same_name, data, taps, targets, PAD_ID)
    fewer = {"train": rows.select(range(len(rows) - 1)), "validation": data["validation"]}
    with pytest.raises(FeatureCacheMismatch, match="other data"):
        build_feature_cache(tmp_path, verifier, fewer, taps, targets, PAD_ID)
    with pytest.raises(FeatureCacheMismatch, match=r"not \[3\]"):
        build_feature_cache(tmp_path, verifier, data, (2, 3, 5), targets, PAD_ID)
    with pytest.raises(FeatureCacheMismatch, match="other targets"):
        build_feature_cache(tmp_path, verifier, data, taps, TargetSpec(vocab, top_k=4), PAD_ID)


def test_a_cache_built_for_some_rows_is_extended_by_a_run_that_needs_more(verifier, data, tmp_path,
                                                                         monkeypatch):
    """A budget's cache holds its rows only; a larger budget computes just the rows missing into the same
    files (the rows already there untouched), a killed extension leaves the cache as it was, and a row that
    was never computed is refused, not read as zeros."""
    from specbench.training import feature_build

    rows = data["train"]
    vocab = DraftVocab.from_rows(zip(rows["input_ids"], rows["loss_mask"]), 40, VOCAB)
    taps, targets = (2, 4), TargetSpec(vocab, top_k=8)

    def build(folder, wanted=targets, **options):
        options = {"batch_size": 2, "log": lambda _: None, **options}
        return build_feature_cache(tmp_path / folder, verifier, data, taps, wanted, PAD_ID, **options)

    whole = build("whole")
    part = build("part", rows={"train": [0, 2]})
    assert part["train"].covered.tolist() == [i in (0, 2) for i in range(len(rows))]
    assert part["validation"].covered.all()  # the validation split is always whole
    with pytest.raises(FeatureCacheMismatch, match="train row 1 is not cached"):
        part["train"].row(1)
    first = {k: v.clone() for k, v in part["train"].row(0).items()}
    for key, value in whole["train"].row(2).items():
        torch.testing.assert_close(part["train"].row(2)[key].float(), value.float(), rtol=1e-2, atol=1e-2)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(feature_build, "verifier_targets", killed)
    with pytest.raises(KeyboardInterrupt):
        build("part", rows={"train": [1]})
    monkeypatch.undo()
    reopened = open_feature_cache(tmp_path / "part", cache_identity(verifier, data, taps, targets))
    assert reopened["train"].covered.tolist() == part["train"].covered.tolist()  # nothing half-marked
    logged = []
    grown = build("part", rows={"train": [0, 1]}, log=logged.append)
    assert any("computing 1 rows it lacks" in line for line in logged)
    assert grown["train"].covered.tolist() == [i in (0, 1, 2) for i in range(len(rows))]
    for key, value in whole["train"].row(1).items():
        torch.testing.assert_close(grown["train"].row(1)[key].float(), value.float(), rtol=1e-2, atol=1e-2)
    assert all(torch.equal(grown["train"].row(0)[k], v) for k, v in first.items())  # untouched
    stamp = (tmp_path / "part" / "features.json").stat().st_mtime_ns
    build("part", rows={"train": [1]})
    assert (tmp_path / "part" / "features.json").stat().st_mtime_ns == stamp  # covered: nothing recomputed
    with pytest.raises(FeatureCacheMismatch, match="extend it with the run that built it"):
        build("part", wanted=None)  # a DFlash run (no targets) needing every row


# --- checkpoints in the EAGLE / SpecForge layout -----------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_export_then_load_gives_identical_logits(arch, tmp_path):
    verifier = tiny_verifier(arch)
    vocab = DraftVocab(list(range(0, VOCAB, 3)), VOCAB)
    head = perturbed_head(verifier, vocab, seed=4, taps=(1, 3, 8))
    out = export_eagle3(head, tmp_path, dtype=torch.float32)
    config = json.loads((out / "config.json").read_text())
    assert config["draft_vocab_size"] == vocab.size and config["num_hidden_layers"] == 1
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 8]  # not the default: written
    loaded = load_eagle3_pretrained(out, verifier, VOCAB)
    assert loaded.taps == (1, 3, 8) and loaded.vocab == vocab
    ids = torch.randint(0, VOCAB, (2, 7))
    features = torch.randn(2, 7, 3 * 64)
    assert torch.equal(
        loaded(ids, verifier_features=features).logits, head(ids, verifier_features=features).logits
    )
    bf16 = load_eagle3_pretrained(export_eagle3(head, tmp_path / "bf16"), verifier, VOCAB)
    torch.testing.assert_close(
        bf16(ids, verifier_features=features).logits,
        head(ids, verifier_features=features).logits,
        atol=0.1,
        rtol=0.05,
    )
    assert (
        "eagle_aux_hidden_state_layer_ids"
        not in json.loads(
            (export_eagle3(perturbed_head(verifier, vocab), tmp_path / "default") / "config.json").read_text()
        )["eagle_config"]
    )  # default taps: left to the engines' shared default


def rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def specforge_step(w, config, embedding, ids, features):
    """SpecForge's LlamaForCausalLMEagle3 step (llama3_eagle.py) over a causal sequence, in plain torch."""
    eps, heads, kv = config["rms_norm_eps"], config["num_attention_heads"], config["num_key_value_heads"]
    dim = config["hidden_size"] // heads
    batch, length = ids.shape
    fused = features @ w["fc.weight"].T
    x = torch.cat(
        [
            rms(embedding[ids], w["midlayer.input_layernorm.weight"], eps),
            rms(fused, w["midlayer.hidden_norm.weight"], eps),
        ],
        dim=-1,
    )
    q = (x @ w["midlayer.self_attn.q_proj.weight"].T).view(batch, length, heads, dim).transpose(1, 2)
    k = (x @ w["midlayer.self_attn.k_proj.weight"].T).view(batch, length, kv, dim).transpose(1, 2)
    v = (x @ w["midlayer.self_attn.v_proj.weight"].T).view(batch, length, kv, dim).transpose(1, 2)
    inv = 1.0 / (config["rope_theta"] ** (torch.arange(0, dim, 2).float() / dim))
    angles = torch.arange(length).float()[:, None] * inv
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()

    def rotate(t):
        return t * cos + torch.cat([-t[..., dim // 2 :], t[..., : dim // 2]], -1) * sin

    q, k = rotate(q), rotate(k)
    k, v = k.repeat_interleave(heads // kv, 1), v.repeat_interleave(heads // kv, 1)
    scores = q @ k.transpose(2, 3) / math.sqrt(dim)
    scores = scores.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
    attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(batch, length, heads * dim)
    h = fused + attended @ w["midlayer.self_attn.o_proj.weight"].T
    y = rms(h, w["midlayer.post_attention_layernorm.weight"], eps)
    h = (
        h
        + (F.silu(y @ w["midlayer.mlp.gate_proj.weight"].T) * (y @ w["midlayer.mlp.up_proj.weight"].T))
        @ w["midlayer.mlp.down_proj.weight"].T
    )
    return rms(h, w["norm.weight"], eps) @ w["lm_head.weight"].T


def test_loads_a_checkpoint_written_in_the_specforge_layout(verifier, tmp_path):
    from safetensors.torch import save_file

    hidden, inner, draft = 64, 96, 50
    config = {  # as SpecForge's configs/llama3-8B-eagle3.json, scaled down
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inner,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "hidden_act": "silu",
        "max_position_embeddings": 1024,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "num_hidden_layers": 1,
        "vocab_size": 320,
        "draft_vocab_size": draft,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "pad_token_id": PAD_ID,
        "bos_token_id": 257,
        "eos_token_id": EOS_ID,
    }
    g = torch.Generator().manual_seed(7)

    def rand(*shape, scale=0.1):
        return (scale * torch.randn(*shape, generator=g)).to(torch.bfloat16)

    used = sorted(torch.randperm(VOCAB, generator=g)[:draft].tolist())
    t2d = torch.zeros(320, dtype=torch.bool)
    t2d[used] = True
    weights = {
        "fc.weight": rand(hidden, 3 * hidden),
        "midlayer.self_attn.q_proj.weight": rand(hidden, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": rand(hidden // 2, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": rand(hidden // 2, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": rand(hidden, hidden),
        "midlayer.mlp.gate_proj.weight": rand(inner, hidden),
        "midlayer.mlp.up_proj.weight": rand(inner, hidden),
        "midlayer.mlp.down_proj.weight": rand(hidden, inner),
        "midlayer.hidden_norm.weight": 1 + rand(hidden),
        "midlayer.input_layernorm.weight": 1 + rand(hidden),
        "midlayer.post_attention_layernorm.weight": 1 + rand(hidden),
        "norm.weight": 1 + rand(hidden),
        "lm_head.weight": rand(draft, hidden),
        "embed_tokens.weight": verifier.model.get_input_embeddings().weight.to(torch.bfloat16),
        "d2t": torch.tensor(used) - torch.arange(draft),
        "t2d": t2d,
    }
    save_file({k: v.contiguous() for k, v in weights.items()}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    drafter = load_eagle3_drafter(tmp_path, verifier, VOCAB)
    head = drafter.head
    assert head.taps == (2, 4, 5) and head.vocab.draft_ids.tolist() == used
    # its embed_tokens is the verifier's (up to bf16): shared, not copied
    assert head.embed_tokens is None and head.embedding is verifier.model.get_input_embeddings()
    ids = torch.randint(0, VOCAB, (2, 6), generator=g)
    features = torch.randn(2, 6, 3 * hidden, generator=g)
    reference = specforge_step(
        {k: v.float() for k, v in weights.items()},
        config,
        verifier.model.get_input_embeddings().weight,
        ids,
        features,
    )
    torch.testing.assert_close(head(ids, verifier_features=features).logits, reference, atol=1e-4, rtol=1e-4)
    # and it decodes losslessly
    prompt = [40, 41, 42, 43, 44, 45]
    result = engine_for(verifier, head, gamma=3, max_new=12).generate([prompt])[0]
    assert result.output_ids == greedy_reference(verifier, prompt, 12)
    wider = tiny_random_model("llama", num_layers=LAYERS, hidden_size=32)
    other = LoadedModel(wider, byte_tokenizer(), ModelSpec(kind="tiny_random"), "narrow")
    with pytest.raises(Eagle3FormatError, match="hidden size 64"):
        load_eagle3_pretrained(tmp_path, other, VOCAB)


# --- Lightning: build, fit, resume, load -----------------------------------------------------------------


def train_cfg(synth_dir, tmp_path, **overrides):
    train = {
        "data": str(synth_dir),
        "max_steps": 2,
        "batch_size": 4,
        "accumulate_grad_batches": 1,
        "lr_start": 3e-3,
        "lr_end": 3e-4,
        "warmup_steps": 1,
        "weight_decay": 0.0,
        "grad_clip": 1.0,
        "val_every_steps": 2,
        "val_batches": 1,
        "val_prompts": 1,
        "checkpoint_every_steps": 2,
        "seed": 0,
        "devices": 1,
        "strategy": "auto",
        "precision": None,
        "num_workers": 0,
        "ttt_steps": 3,
        "feature_cache": str(tmp_path / "features"),
        "feature_top_k": None,
        "draft_vocab_size": 48,
        "taps": None,
    }
    train.update(overrides)
    return SimpleNamespace(train=SimpleNamespace(**train))


def fit(cfg, verifier, out_dir, max_steps):
    from specbench.tracking import NULL_TRACKER

    cfg.train.max_steps = max_steps
    module, datamodule = build_training("eagle3", cfg, verifier, VOCAB, [EOS_ID], PAD_ID)  # task=train's path
    trainer, metrics = build_trainer(cfg.train, out_dir, NULL_TRACKER, torch.device("cpu"))
    resume = last_checkpoint(out_dir)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(resume) if resume else None)
    return module, trainer, metrics


def test_lightning_fit_checkpoints_the_head_resumes_and_loads_for_decoding(verifier, synth_dir, tmp_path):
    cfg = train_cfg(synth_dir, tmp_path)
    module, trainer, metrics = fit(cfg, verifier, tmp_path / "run", 2)
    assert trainer.global_step == 2 and (tmp_path / "features" / "features.json").is_file()
    assert {"train/loss", "val/loss", "val/acc_step0", "val/tau_estimate", "val/tau"} <= set(metrics.last)
    saved = torch.load(last_checkpoint(tmp_path / "run"), map_location="cpu", weights_only=True)
    assert saved["state_dict"] and all(k.startswith("head.") for k in saved["state_dict"])
    assert not any("embed" in k for k in saved["state_dict"])  # the verifier's embedding is shared, not saved
    meta = saved["specbench"]
    assert meta["method"] == "eagle3" and meta["taps"] == [2, 4, 5] and meta["draft_vocab_size"] == 48
    resumed, trainer2, _ = fit(cfg, verifier, tmp_path / "run", 4)
    assert trainer2.global_step == 4
    path = export_trained(resumed, resumed.metadata(), tmp_path / "trained.pt")
    drafter = load_eagle3_drafter(path, verifier, VOCAB)
    for name, param in resumed.head.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(dict(drafter.head.named_parameters())[name], param)
    prompt = [33, 34, 35, 36, 37]
    assert engine_for(verifier, drafter.head, max_new=10).generate([prompt])[
        0
    ].output_ids == greedy_reference(verifier, prompt, 10)
    with pytest.raises(CheckpointMismatchError, match="verifier_weights"):
        load_eagle3_drafter(path, tiny_verifier(seed=9), VOCAB)
    frozen = train_cfg(
        synth_dir, tmp_path, freeze_lm_head=True, feature_cache=None, val_prompts=0, ttt_chain_fraction=0.5
    )
    module, _, _ = fit(
        frozen, verifier, tmp_path / "frozen", 1
    )  # on the fly, verifier's LM-head rows, anchors
    saved = torch.load(last_checkpoint(tmp_path / "frozen"), map_location="cpu", weights_only=True)
    assert (
        not any("lm_head" in k for k in saved["state_dict"]) and saved["specbench"]["lm_head"] == "verifier"
    )
    reloaded = load_eagle3_drafter(
        export_trained(module, module.metadata(), tmp_path / "frozen.pt"), verifier, VOCAB
    )
    rows = verifier.model.get_output_embeddings().weight[reloaded.head.vocab.draft_ids]
    torch.testing.assert_close(reloaded.head.lm_head.weight, rows)


def test_init_head_starts_training_from_a_trained_head_over_another_draft_vocabulary(
    verifier, synth_dir, tmp_path
):
    first = train_cfg(synth_dir, tmp_path, feature_cache=None, val_prompts=0, draft_vocab_size=40)
    trained, _, _ = fit(first, verifier, tmp_path / "first", 1)
    path = export_trained(trained, trained.metadata(), tmp_path / "first.pt")
    source = load_eagle3_drafter(path, verifier, VOCAB).head
    again = train_cfg(synth_dir, tmp_path, feature_cache=None, val_prompts=0, init_head=str(path))
    module, _ = build_eagle3_training(again, verifier, VOCAB, [EOS_ID], PAD_ID)
    head = module.head
    assert module.metadata()["init_head"] == str(path)
    for name, param in source.state_dict().items():
        if not name.startswith("lm_head."):
            torch.testing.assert_close(head.state_dict()[name], param)
    old_rows = {int(t): i for i, t in enumerate(source.vocab.draft_ids.tolist())}
    new_tokens = [int(t) for t in head.vocab.draft_ids.tolist()]
    shared = [r for r, t in enumerate(new_tokens) if t in old_rows]
    fresh = [r for r, t in enumerate(new_tokens) if t not in old_rows]
    assert shared and fresh, "the test needs tokens in both vocabularies and tokens new to the second"
    for row in shared:
        torch.testing.assert_close(head.lm_head.weight[row], source.lm_head.weight[old_rows[new_tokens[row]]])
    verifier_rows = verifier.model.get_output_embeddings().weight
    for row in fresh:
        torch.testing.assert_close(head.lm_head.weight[row], verifier_rows[new_tokens[row]])
    other_taps = train_cfg(synth_dir, tmp_path, feature_cache=None, taps=[1, 3, 5], init_head=str(path))
    with pytest.raises(CheckpointMismatchError, match=r"reads verifier taps \[2, 4, 5\].*set train.taps"):
        build_eagle3_training(other_taps, verifier, VOCAB, [EOS_ID], PAD_ID)
    with pytest.raises(CheckpointMismatchError, match="verifier_weights"):
        build_eagle3_training(again, tiny_verifier(seed=9), VOCAB, [EOS_ID], PAD_ID)


def test_export_command_writes_the_eagle_layout_for_a_trained_head(tmp_path):
    from specbench.drafters.eagle3.format import main
    from specbench.training.eagle3 import Eagle3Training, head_metadata

    model_dir = tmp_path / "verifier"
    tiny_verifier().model.save_pretrained(model_dir)
    byte_tokenizer().save_pretrained(model_dir)
    spec = ModelSpec(kind="local", name=str(model_dir), path=str(model_dir))
    local = load_verifier(spec, device="cpu", dtype="float32")
    vocab = DraftVocab(list(range(0, VOCAB, 2)), VOCAB)
    head = perturbed_head(local, vocab, seed=8).train()
    module = Eagle3Training(
        local.model, head, SimpleNamespace(), TargetSpec(vocab), head_metadata(local, head, VOCAB)
    )
    path = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    assert (
        main(["export", str(path), str(tmp_path / "out"), "--verifier", str(model_dir), "--dtype", "float32"])
        == 0
    )
    exported = load_eagle3_pretrained(tmp_path / "out", local, VOCAB)
    ids, features = torch.randint(0, VOCAB, (1, 5)), torch.randn(1, 5, 3 * 64)
    assert torch.equal(
        exported(ids, verifier_features=features).logits, head.eval()(ids, verifier_features=features).logits
    )


def test_compact_writes_bf16_weights_that_load_as_the_rounded_head(verifier, tmp_path):
    from specbench.drafters.eagle3.format import main
    from specbench.training.eagle3 import Eagle3Training, head_metadata

    vocab = DraftVocab(list(range(0, VOCAB, 3)), VOCAB)
    head = perturbed_head(verifier, vocab, seed=5).train()
    module = Eagle3Training(
        verifier.model, head, SimpleNamespace(), TargetSpec(vocab), head_metadata(verifier, head, VOCAB)
    )
    full = export_trained(module, module.metadata(), tmp_path / "trained.pt")
    assert main(["compact", str(full), str(tmp_path / "small" / "trained.pt")]) == 0
    saved = torch.load(tmp_path / "small" / "trained.pt", map_location="cpu", weights_only=True)
    assert {v.dtype for v in saved["state_dict"].values()} == {torch.bfloat16}
    assert saved["specbench"]["stored_dtype"] == "bfloat16"
    assert (tmp_path / "small" / "trained.pt").stat().st_size < 0.6 * full.stat().st_size
    loaded = load_eagle3_drafter(tmp_path / "small" / "trained.pt", verifier, VOCAB).head
    trained = dict(head.named_parameters())
    for name, param in loaded.named_parameters():
        if trained[name].requires_grad:
            assert param.dtype == torch.float32
            torch.testing.assert_close(param, trained[name].detach().to(torch.bfloat16).float())
    with pytest.raises(CheckpointMismatchError, match="not an EAGLE-3 head"):
        torch.save({"state_dict": {}, "specbench": {"method": "sd2"}}, tmp_path / "sd2.pt")
        main(["compact", str(tmp_path / "sd2.pt"), str(tmp_path / "x.pt")])


def test_init_layer_from_the_verifier_starts_as_its_last_layer_on_the_highest_tap(verifier):
    vocab = DraftVocab(list(range(0, VOCAB, 2)), VOCAB)
    head = Eagle3Head.for_verifier(verifier.model, vocab)
    head.init_layer_from_verifier(verifier.model)
    hidden = verifier.model.config.hidden_size
    features = torch.randn(2, 3, len(head.taps) * hidden)
    top = max(range(len(head.taps)), key=lambda i: head.taps[i])
    torch.testing.assert_close(head.fc(features), features[..., top * hidden : (top + 1) * hidden])
    last = verifier.model.model.layers[-1]
    for name in ("q_proj", "k_proj", "v_proj"):
        torch.testing.assert_close(getattr(head.midlayer.self_attn, name).weight[:, hidden:],
                                   getattr(last.self_attn, name).weight)
    for name, param in last.mlp.named_parameters():
        torch.testing.assert_close(dict(head.midlayer.mlp.named_parameters())[name], param)
    torch.testing.assert_close(head.midlayer.hidden_norm.weight, last.input_layernorm.weight)
    assert not torch.equal(
        head.midlayer.hidden_norm.weight, torch.ones_like(head.midlayer.hidden_norm.weight)
    )


@pytest.mark.slow
def test_the_committed_head_loads_for_the_embedded_verifier_and_decodes_losslessly():
    from specbench.drafters.eagle3.format import eagle3_drafter
    from specbench.evaluation import eos_token_ids

    embedded = load_verifier(ModelSpec(kind="embedded"), device="cpu", dtype="float32")
    vocab = len(embedded.tokenizer)
    drafter = eagle3_drafter(
        "checkpoints/eagle3-smollm2-135m/trained.pt", embedded, vocab
    )  # project-relative
    assert drafter.head.taps == (2, 15, 27) and drafter.head.vocab.size == 8192
    prompt = embedded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name three colours of the rainbow."}], add_generation_prompt=True
    )
    ids = prompt if isinstance(prompt, list) else prompt["input_ids"]
    eos = eos_token_ids(embedded.model, embedded.tokenizer)
    settings = GenerationSettings(max_new_tokens=24)
    engine = SpeculativeEngine(embedded.model, drafter, schedule=DraftSchedule("constant", 3),
                               settings=settings, vocab_size=vocab, eos_token_ids=eos,
                               pad_token_id=eos[0])  # fmt: skip
    plain = SpeculativeEngine(embedded.model, None, settings=settings, vocab_size=vocab, eos_token_ids=eos,
                              pad_token_id=eos[0])  # fmt: skip
    result = engine.generate([list(ids)])[0]
    assert result.output_ids == plain.generate([list(ids)])[0].output_ids
    assert sum(r.accepted for r in result.rounds) > 0  # the trained head's drafts are accepted


def test_the_package_and_the_old_module_path_name_the_same_objects():
    from specbench.drafters import eagle3
    from specbench.drafters.eagle3 import format as public
    from specbench.targets import import_target

    assert import_target("specbench.drafters.eagle3.Eagle3Drafter") is Eagle3Drafter
    assert (
        import_target("specbench.drafters.eagle3.eagle3_drafter")
        is public.eagle3_drafter
        is eagle3.eagle3_drafter
    )
    assert import_target("specbench.drafters.eagle3_format.eagle3_drafter") is public.eagle3_drafter
    assert import_target("specbench.drafters.eagle3_format.resolve_head_path") is public.resolve_head_path
