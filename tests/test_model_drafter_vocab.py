"""A model drafter (early exit, distilled, SD²-steered) over a reduced draft vocabulary (docs/draft-vocab.md).

The drafter runs its model's body and only the draft rows of the LM head; q is exactly 0 outside the draft
vocabulary, so greedy decoding must equal autoregressive decoding and ``sd`` must sample the verifier's own
distribution. Also: the sliced logits against the full LM head, the vocabulary sources (task=synth data, a
saved EAGLE-3 vocabulary) and their config errors. Tiny seeded random models (``specbench.models.tiny``).
"""

from __future__ import annotations

import copy
import functools
import json
import shutil

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens
from helpers import compose_config, launch

from specbench.config import ConfigError, validate
from specbench.data.prompts import Prompt
from specbench.decoding import DraftSchedule, GenerationSettings, SpeculativeEngine, VerificationRule
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.warping import Warping
from specbench.drafters.base import VerifierView
from specbench.drafters.sd2 import SD2Drafter
from specbench.drafters.steering import SteeredDrafter, resolve_spec
from specbench.evaluation import build_engines, measure_profile
from specbench.models import ModelSpec, load_verifier
from specbench.models.draft_vocab import DraftVocab, load_draft_vocab
from specbench.models.early_exit import early_exit_drafter
from specbench.models.pair import tokenizer_hash
from specbench.models.tiny import EOS_ID, PAD_ID, byte_tokenizer, tiny_random_model
from specbench.pairs import load_drafter

VOCAB = 259  # the byte tokenizer's size (the tiny LM heads have 320 rows, the rest padding)
PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]
MAX_NEW = 24
TINY = ["model/verifier=tiny-random", "model/drafter=tiny-random", "method=sd", "dataset=demo"]


@functools.cache
def verifier(arch: str):
    return tiny_random_model(arch, seed=0, num_layers=3)


@functools.cache
def drafter_model(arch: str, kind: str):
    if kind == "early_exit":
        return early_exit_drafter(verifier(arch), 1)
    if kind == "independent":
        return tiny_random_model(arch, seed=1, num_layers=1)
    model = copy.deepcopy(verifier(arch))  # "perturbed": close to the verifier, so drafts are accepted
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.02)
    return model


def engine(arch, drafter=None, gamma=3, vocab=VOCAB, eos=(EOS_ID,), **settings):
    settings.setdefault("max_new_tokens", MAX_NEW)
    return SpeculativeEngine(
        verifier(arch), drafter, VerificationRule() if drafter is not None else None,
        DraftSchedule("constant", gamma), GenerationSettings(**settings), vocab, list(eos), PAD_ID,
    )  # fmt: skip


@functools.cache
def autoregressive(arch: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(r.output_ids) for r in engine(arch).generate(PROMPTS))


@functools.cache
def greedy_vocab(arch: str) -> DraftVocab:
    """Every other distinct token of the verifier's greedy outputs plus every 5th id: drafts can be accepted,
    and some tokens the verifier emits lie outside (they must come from the correction)."""
    emitted = sorted({t for out in autoregressive(arch) for t in out})
    return DraftVocab(sorted(set(emitted[::2]) | set(range(0, VOCAB, 5))), VOCAB)


def count_calls(module: torch.nn.Module) -> tuple[list[int], object]:
    calls = [0]

    def hook(*_):
        calls[0] += 1

    return calls, module.register_forward_hook(hook)


# -- greedy: identical to autoregressive decoding ---------------------------------------------------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kind", ["early_exit", "perturbed"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("gamma", [1, 4])
def test_greedy_with_a_reduced_draft_vocabulary_equals_autoregressive(arch, kind, batch, gamma):
    vocab = greedy_vocab(arch)
    outside = [t for out in autoregressive(arch) for t in out if not bool(vocab.t2d[t])]
    assert outside, "the verifier must emit tokens the drafter cannot propose"
    spec = engine(arch, ModelDrafter(drafter_model(arch, kind), VOCAB, draft_vocab=vocab), gamma)
    results = []
    for first in range(0, len(PROMPTS), batch):
        results += spec.generate(PROMPTS[first : first + batch])
    assert tuple(tuple(r.output_ids) for r in results) == autoregressive(arch)
    assert sum(r.accepted for res in results for r in res.rounds) > 0


def test_sd2_steering_acts_through_the_reduced_vocabulary_path_and_stays_lossless():
    arch = "llama"
    vocab = greedy_vocab(arch)
    model = drafter_model(arch, "independent")
    steering = SteeredDrafter(model, resolve_spec(verifier(arch), model, [1, 2, 3]))
    try:
        with torch.no_grad():
            steering.head.project.weight.normal_(0, 0.5, generator=torch.Generator().manual_seed(0))
        steered = SD2Drafter(steering, VOCAB, draft_vocab=vocab)
        results = engine(arch, steered).generate(PROMPTS)
        assert tuple(tuple(r.output_ids) for r in results) == autoregressive(arch)
        # The steering hooks reach the body's MLPs: steered and plain drafts differ.
        plain = ModelDrafter(model, VOCAB, draft_vocab=vocab)
        sampler = DraftSampler(Warping(1.0), torch.Generator(), DraftSchedule("constant", 3))
        state = BatchState.create(PROMPTS, 3, 10, [], PAD_ID, torch.device("cpu"))
        context, valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        g = torch.Generator().manual_seed(2)
        taps = {
            i: torch.randn(*context.shape, verifier(arch).config.hidden_size, generator=g) for i in (1, 2, 3)
        }
        view = VerifierView(context, torch.ones_like(valid), taps=taps)  # a steering source for every row
        qs = []
        for drafter in (steered, plain):
            drafter.reset(len(PROMPTS))
            drafter.prefill(state, view)
            qs.append(drafter.propose(state, torch.ones(len(PROMPTS), dtype=torch.long), sampler).q)
        assert not torch.allclose(qs[0], qs[1], atol=1e-4)
        assert bool((qs[0][..., ~vocab.t2d] == 0).all()) and bool((qs[1][..., ~vocab.t2d] == 0).all())
    finally:
        steering.remove()


# -- q: exactly 0 outside, the softmax over the draft rows inside; no full-vocabulary LM head ----------------


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("kind", ["early_exit", "independent"])
def test_q_is_zero_outside_and_the_draft_rows_softmax_inside(arch, kind):
    model = drafter_model(arch, kind)
    vocab = DraftVocab(list(range(3, VOCAB, 4)), VOCAB)
    drafter = ModelDrafter(model, VOCAB, draft_vocab=vocab)
    steps = 4
    state = BatchState.create(PROMPTS, steps, 10, [], PAD_ID, torch.device("cpu"))
    sampler = DraftSampler(Warping(1.0), torch.Generator().manual_seed(0), DraftSchedule("constant", steps))
    calls, handle = count_calls(model.get_output_embeddings())
    try:
        drafter.reset(len(PROMPTS))
        drafter.prefill(state, None)
        proposal = drafter.propose(state, torch.full((len(PROMPTS),), steps), sampler, want_hidden=True)
    finally:
        handle.remove()
    assert calls[0] == 0, "the drafter ran its full-vocabulary LM head"
    assert proposal.q.shape == (len(PROMPTS), steps, VOCAB) and proposal.lengths.tolist() == [steps] * 4
    assert bool((proposal.q[..., ~vocab.t2d] == 0).all())  # exactly zero, not just small
    assert bool(vocab.contains(proposal.tokens).all())
    for row, prompt in enumerate(PROMPTS):
        ids = torch.tensor([prompt + proposal.tokens[row, : steps - 1].tolist()])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 :]
        wanted = torch.softmax(logits[:, vocab.draft_ids].float(), dim=-1)
        torch.testing.assert_close(proposal.q[row][:, vocab.draft_ids], wanted, rtol=1e-5, atol=1e-6)
        # Proposal.hidden is still the final-normed state the LM head reads.
        full = model.get_output_embeddings()(proposal.hidden[row])[:, :VOCAB]
        torch.testing.assert_close(full, logits[:, :VOCAB], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_sliced_lm_head_logits_equal_the_full_heads_at_the_draft_ids(arch):
    model = copy.deepcopy(verifier(arch))
    vocab = DraftVocab([0, 7, 65, 101, 200, EOS_ID], VOCAB)
    drafter = ModelDrafter(model, VOCAB, draft_vocab=vocab)
    ids = torch.tensor([PROMPTS[3], PROMPTS[3][::-1]])
    drafter.cached.reset(2)
    out = drafter.cached.forward(ids, output_hidden=True)
    with torch.no_grad():
        full = model(input_ids=ids).logits
    assert out.logits.shape == (2, 1, vocab.size)  # only the last column, only the draft rows
    torch.testing.assert_close(out.logits[:, -1], full[:, -1, vocab.draft_ids], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(model.lm_head(out.hidden), full)  # the body's output is the LM head's input
    # Sliced once per device and dtype; sliced again after the LM head's weights change (training).
    rows, _ = drafter.draft_rows(torch.device("cpu"), torch.float32)
    assert drafter.draft_rows(torch.device("cpu"), torch.float32)[0] is rows
    with torch.no_grad():
        model.lm_head.weight[65].add_(1.0)
    again, _ = drafter.draft_rows(torch.device("cpu"), torch.float32)
    torch.testing.assert_close(again, model.lm_head.weight[vocab.draft_ids])
    # An LM head with a bias: its draft entries too.
    with torch.no_grad():
        biased = torch.nn.Linear(model.config.hidden_size, 320, bias=True)
        biased.weight.copy_(model.lm_head.weight)
        biased.bias.normal_(generator=torch.Generator().manual_seed(1))
    model.lm_head = biased
    drafter = ModelDrafter(model, VOCAB, draft_vocab=vocab)
    drafter.cached.reset(2)
    with torch.no_grad():
        full = model(input_ids=ids).logits
    torch.testing.assert_close(drafter.cached.forward(ids).logits[:, -1], full[:, -1, vocab.draft_ids])


def test_the_full_vocabulary_through_the_sliced_path_gives_the_same_q_as_the_model_forward():
    arch = "qwen3"
    model = drafter_model(arch, "early_exit")
    qs = []
    for vocab in (None, DraftVocab.full(VOCAB)):
        drafter = ModelDrafter(model, VOCAB, draft_vocab=vocab)
        state = BatchState.create(PROMPTS, 3, 10, [], PAD_ID, torch.device("cpu"))
        sampler = DraftSampler(Warping(1.0), torch.Generator().manual_seed(5), DraftSchedule("constant", 3))
        drafter.reset(len(PROMPTS))
        drafter.prefill(state, None)
        qs.append(drafter.propose(state, torch.full((len(PROMPTS),), 3), sampler).q)
    torch.testing.assert_close(qs[0], qs[1], rtol=1e-5, atol=1e-6)


def test_a_vocabulary_for_another_vocabulary_size_or_a_transformed_head_is_refused():
    model = drafter_model("llama", "independent")
    with pytest.raises(ValueError, match="another tokenizer"):
        ModelDrafter(model, VOCAB, draft_vocab=DraftVocab([1, 2, 3], 300))
    capped = copy.deepcopy(model)
    capped.config.final_logit_softcapping = 30.0
    with pytest.raises(ValueError, match="final_logit_softcapping"):
        ModelDrafter(capped, VOCAB, draft_vocab=DraftVocab([1, 2, 3], VOCAB))


# -- sampling: sd with the reduced-vocabulary drafter samples the verifier's distribution -------------------

SAMPLE_ROWS = 4000
# the sampling tests compare over the whole LM head, as the exact reference (tests/distribution.py) does
HEAD = 320


def chi_square_vocab(arch: str, prompt: list[int]) -> DraftVocab:
    """The verifier's most likely first tokens up to 60 % of its mass: the rest must come from the
    residual."""
    p1, _ = exact_first_tokens(verifier(arch), prompt)
    order = np.argsort(-p1)
    keep = order[: int(np.searchsorted(np.cumsum(p1[order]), 0.6)) + 1]
    return DraftVocab(sorted(int(t) for t in keep), HEAD)


def sampled(arch, drafter, gamma, max_new, prompt, seed=1234):
    """Outputs of ``prompt`` in rows mixed with a longer prompt (left padding); no EOS, so every row has
    ``max_new`` tokens."""
    prompts = [prompt if i % 2 == 0 else PROMPTS[3] for i in range(SAMPLE_ROWS)]
    spec = engine(arch, drafter, gamma, HEAD, (), temperature=1.0, max_new_tokens=max_new, seed=seed)
    results = spec.generate(prompts)
    outs = np.array([r.output_ids for r, p in zip(results, prompts) if p is prompt])
    assert outs.shape == (SAMPLE_ROWS // 2, max_new)
    return results, outs


def test_sd_with_a_reduced_vocabulary_drafter_samples_the_verifiers_distribution():
    arch, prompt = "llama", PROMPTS[1]
    vocab = chi_square_vocab(arch, prompt)
    p1, joint = exact_first_tokens(verifier(arch), prompt)
    outside = ~vocab.t2d.numpy()
    assert 0.25 < float(p1[outside].sum()) <= 0.4
    drafter = ModelDrafter(drafter_model(arch, "perturbed"), HEAD, draft_vocab=vocab)
    results, outs = sampled(arch, drafter, 3, 3, prompt)
    drafted = sum(r.drafted for res in results for r in res.rounds)
    accepted = sum(r.accepted for res in results for r in res.rounds)
    assert 0.1 * drafted < accepted < drafted
    first, second = outs[:, 0], outs[:, 1]
    size = p1.shape[0]
    counts1 = np.bincount(first, minlength=size)
    assert counts1[outside].sum() > 0.2 * len(outs)  # tokens the drafter cannot propose: from the residual
    p_values = {
        "t1": chi2_pvalue(counts1, p1),
        "t2": chi2_pvalue(np.bincount(second, minlength=size), joint.sum(0)),
        "t1,t2": chi2_pvalue(np.bincount(first * size + second, minlength=size * size), joint.reshape(-1)),
    }
    assert min(p_values.values()) > 1e-3, p_values


class _FullHeadQ(ModelDrafter):
    """A plausible bug: the token is drawn from the draft rows but q is reported from the full LM head."""

    def reset(self, batch_size):
        super().reset(batch_size)
        self._full = []

    def _draft_logits(self, hidden):
        self._full.append(self.model.get_output_embeddings()(hidden[:, -1])[..., : self.vocab_size].float())
        return super()._draft_logits(hidden)

    def propose(self, state, caps, sampler, want_hidden=False):
        self._full = []
        proposal = super().propose(state, caps, sampler, want_hidden)
        proposal.q = torch.softmax(torch.stack(self._full[-proposal.tokens.shape[1] :], dim=1), dim=-1)
        return proposal


def test_the_chi_square_test_rejects_a_q_that_is_not_zero_outside_the_draft_vocabulary():
    arch, prompt = "llama", PROMPTS[1]
    vocab = chi_square_vocab(arch, prompt)
    p1, _ = exact_first_tokens(verifier(arch), prompt)
    _, outs = sampled(
        arch, _FullHeadQ(drafter_model(arch, "perturbed"), HEAD, draft_vocab=vocab), 1, 2, prompt, 7
    )
    assert chi2_pvalue(np.bincount(outs[:, 0], minlength=p1.shape[0]), p1) < 1e-6


# -- sources: task=synth data, a saved EAGLE-3 vocabulary; the loader, the engines and task=profile
# -------------


def tiny_loaded(num_layers=2):
    """The ``model/verifier=tiny-random`` verifier (8 layers: one an EAGLE-3 head can be built for)."""
    spec = ModelSpec(kind="tiny_random", name="tiny-random-llama", num_layers=num_layers, seed=0)
    return load_verifier(spec, "cpu", "float32")


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory):
    from specbench.pipelines.synth_plan import SynthSettings
    from specbench.pipelines.synthesize import synthesize

    prompts = [Prompt(i, f"{w} stone {i}") for i, w in enumerate(["apple", "river", "cloud", "violin"] * 3)]
    settings = SynthSettings(
        target_len=40, max_prompt_len=30, temperature=1.0, batch_size=6, validation_fraction=0.2
    )
    out = tmp_path_factory.mktemp("synth")
    synthesize(tiny_loaded(), prompts, settings, out, progress=False)
    return out


def save_vocab_checkpoint(path, vocab: DraftVocab, **overrides):
    """A checkpoint holding a draft vocabulary as task=train method=eagle3 saves it (head_metadata)."""
    from specbench.drafters.eagle3.head import Eagle3Head
    from specbench.training.eagle3 import head_metadata

    loaded = tiny_loaded(num_layers=8)
    metadata = head_metadata(loaded, Eagle3Head.for_verifier(loaded.model, vocab), VOCAB)
    torch.save({"state_dict": {}, "specbench": {**metadata, **overrides}}, path)
    return path


def test_vocabulary_from_synth_data_is_the_most_frequent_response_tokens(synth_dir):
    from specbench.data.synth_dataset import load_synthetic

    vocab, info = load_draft_vocab(str(synth_dir), 40, VOCAB, tokenizer_hash(byte_tokenizer()))
    rows = load_synthetic(str(synth_dir))[0]["train"]
    assert vocab == DraftVocab.from_rows(zip(rows["input_ids"], rows["loss_mask"]), 40, VOCAB)
    assert info["draft_vocab_size"] == 40 and 0.0 < info["draft_vocab_coverage"] <= 1.0


def test_load_drafter_builds_the_vocabulary_and_the_engine_and_profile_use_it(tmp_path):
    vocab = DraftVocab(list(range(0, VOCAB, 4)), VOCAB)
    saved = save_vocab_checkpoint(tmp_path / "trained.pt", vocab)
    verifier_model = tiny_loaded()
    for kind in ("early_exit", "tiny_random"):
        spec = ModelSpec(kind=kind, num_layers=1, seed=1, draft_vocab=str(saved))
        drafter = load_drafter(spec, verifier_model, "cpu", "float32")
        assert drafter.draft_vocab == vocab
        built, _ = build_engines(verifier_model, drafter, VerificationRule(), DraftSchedule("constant", 3),
                                 GenerationSettings(max_new_tokens=8), baseline=False)  # fmt: skip
        assert (
            built.drafter.draft_vocab == vocab and built.drafter.describe()["draft_vocab_size"] == vocab.size
        )
    profile = measure_profile(
        verifier_model, built.drafter, VOCAB, 2, context_len=8, repeats=1, prompts=[PROMPTS[3]]
    )
    assert profile.meta["draft_vocab_size"] == vocab.size and "draft vocabulary 65" in profile.table()


def test_a_source_for_another_tokenizer_is_a_config_error_when_the_drafter_loads(tmp_path, synth_dir):
    verifier_model = tiny_loaded()
    saved = save_vocab_checkpoint(
        tmp_path / "other.pt", DraftVocab([1, 2, 3], VOCAB), tokenizer_hash="0123456789abcdef"
    )
    with pytest.raises(ConfigError, match=r"model.drafter.draft_vocab=.*another tokenizer"):
        load_drafter(
            ModelSpec(kind="early_exit", num_layers=1, draft_vocab=str(saved)), verifier_model, "cpu"
        )
    other = tmp_path / "other-synth"
    shutil.copytree(synth_dir, other)
    for meta in other.glob("dataset*/specbench_synth.json"):
        data = json.loads(meta.read_text())
        data["tokenizer_hash"] = "0123456789abcdef"
        meta.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"model.drafter.draft_vocab=.*another tokenizer"):
        load_drafter(
            ModelSpec(kind="early_exit", num_layers=1, draft_vocab=str(other), draft_vocab_size=8),
            verifier_model,
        )


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    vocab = DraftVocab(list(range(64)), VOCAB)
    (root / "synth" / "dataset").mkdir(parents=True)
    (root / "synth" / "dataset" / "specbench_synth.json").write_text("{}")
    (root / "empty").mkdir()
    return {
        "saved": save_vocab_checkpoint(root / "saved.pt", vocab),
        "wide": save_vocab_checkpoint(root / "wide.pt", vocab, vocab_size=50000),
        "no_vocab": save_vocab_checkpoint(root / "sd2.pt", vocab, method="sd2", draft_vocab_ids=None),
        "synth": root / "synth",
        "empty": root / "empty",
    }


CONFIG_ERRORS = [
    (
        ["model.drafter.draft_vocab_size=64"],
        r"^model.drafter.draft_vocab_size=64 needs model.drafter.draft_vocab=PATH",
    ),
    (
        ["model.drafter.draft_vocab_size=0", "model.drafter.draft_vocab={synth}"],
        r"must be an integer >= 1 or null",
    ),
    (
        ["model.drafter.draft_vocab_size=400", "model.drafter.draft_vocab={synth}"],
        r"400 exceeds the verifier's vocab",
    ),
    (["model.drafter.draft_vocab={synth}/missing"], r"draft_vocab='.*missing': no such file or directory"),
    (["model.drafter.draft_vocab={synth}"], r"names task=synth data: set model.drafter.draft_vocab_size"),
    (["model.drafter.draft_vocab={empty}"], r"is neither a task=synth output dir nor a checkpoint"),
    (["model.drafter.draft_vocab={no_vocab}"], r"method='sd2' checkpoint that saved no draft vocabulary"),
    (
        ["model.drafter.draft_vocab={saved}", "model.drafter.draft_vocab_size=32"],
        r"holds a vocabulary of 64 tokens",
    ),
    (
        ["model.drafter.draft_vocab={wide}"],
        r"vocabulary of 50000 tokens, but the verifier has 320: another tokenizer",
    ),
    (
        ["model.verifier.draft_vocab_size=64", "model.verifier.draft_vocab={saved}"],
        r"the verifier drafts nothing",
    ),
    (
        ["model/drafter=ngram", "model.drafter.draft_vocab={saved}"],
        r"apply to model drafters .* not kind='drafter'",
    ),
]


@pytest.mark.parametrize("overrides,message", CONFIG_ERRORS)
def test_bad_draft_vocabulary_settings_are_one_line_config_errors(sources, overrides, message):
    cfg = compose_config(TINY + [o.format(**sources) for o in overrides])
    with pytest.raises(ConfigError, match=message) as info:
        validate(cfg)
    assert "\n" not in str(info.value)


def test_valid_sources_pass_validation_and_distill_sd2_training_take_them(sources):
    for extra in (
        ["model.drafter.draft_vocab={saved}"],
        ["model.drafter.draft_vocab={synth}", "model.drafter.draft_vocab_size=64"],
    ):
        plan = validate(compose_config(TINY + [o.format(**sources) for o in extra]))
        assert plan.drafter.draft_vocab is not None
    from specbench.config.train_checks import validate_train

    vocab = [f"model.drafter.draft_vocab={sources['saved']}", f"train.data={sources['synth']}"]
    for method in (
        ["method=distill"],
        ["method=sd2", "steering=sd2"],
    ):  # trained over it (tests/test_drafter_feature_cache.py)
        assert validate_train(compose_config(["task=train", *method, *TINY[:2], *vocab])).drafter.draft_vocab
    cfg = compose_config(
        ["task=train", "method=distill", *TINY[:2], *vocab, "model.drafter.draft_vocab_size=32"]
    )
    with pytest.raises(ConfigError, match="holds a vocabulary of 64 tokens"):
        validate_train(cfg)
    cfg = compose_config(
        ["task=train", "method=diversed", *TINY[:2], *vocab, "dataset=demo", "train.reward=verifier_logp"]
    )
    with pytest.raises(ConfigError, match="method=diversed does not"):
        validate_train(cfg)


def test_profile_task_times_the_reduced_vocabulary_drafter_and_records_its_size(tmp_path, sources):
    out = tmp_path / "profile.json"
    proc = launch(
        ["task=profile", "model/verifier=tiny-random", "model/drafter=tiny-random",
         f"model.drafter.draft_vocab={sources['saved']}", "profile.max_n=2", "profile.repeats=1",
         "profile.context_len=8", f"profile.output={out}", "tracking=none",
         f"hydra.run.dir={tmp_path / 'run'}"],
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(out.read_text())["meta"]["draft_vocab_size"] == 64
    assert "draft vocabulary 64" in proc.stdout
    bad = launch(
        ["task=profile", "model/verifier=tiny-random", "model/drafter=tiny-random",
         "model.drafter.draft_vocab_size=64", "tracking=none", f"hydra.run.dir={tmp_path / 'bad'}"],
        cache_dir=tmp_path / "cache",
    )  # fmt: skip
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert (
        "Config error: model.drafter.draft_vocab_size=64 needs model.drafter.draft_vocab=PATH" in bad.stderr
    )
