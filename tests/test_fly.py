"""FLy deferred verification (Li et al., arXiv 2511.22972; vLLM docs/features/speculative_decoding/fly.md and
vllm/v1/spec_decode/fly.py) against an independent reference.

FLy has no one-step closed form: whether draft i is kept depends on the acceptance decisions of the next W
drafts. Its *round* has one, though. Given a drafted block, exact SD accepts each draft on its own with
probability a_i = min(1, p_i(x_i)/q_i(x_i)) (independent uniforms); FLy is a deterministic function of that
accept/reject pattern and of the per-position gates (top-k entropy of p_i ≥ θ, p_i(x_i) > 0). Enumerating the
2^L patterns and every draft block of a small table model gives the exact distribution of the emitted
sequence (accepted drafts + correction from the SD residual, or the bonus token from p_L). The tests sample
``verify_round`` and compare with it (chi-square), check the defining properties on crafted greedy rounds,
that FLy is exactly ``sd`` where it must be (gate that can never open, or a window that never fits) and that
under the same uniforms it never accepts fewer drafts than ``sd``.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specbench.decoding import (
    DraftSchedule,
    GenerationSettings,
    SpeculativeEngine,
    VerificationRule,
    verify_round,
)
from specbench.decoding.fly import FlyRule, max_top_k_entropy, top_k_entropy
from specbench.decoding.model_drafter import ModelDrafter
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

N_ROUNDS = 60_000
P_VALUE = 1e-3


# ---------------------------------------------------------------------------------------------------------
# Independent references
# ---------------------------------------------------------------------------------------------------------


def reference_entropy(p: np.ndarray, k: int) -> float:
    top = np.sort(p)[::-1][:k]
    top = top[top > 0]
    return float(-(top * np.log(top)).sum())


def reference_fly_length(native, gate, length: int, window: int) -> int:
    """Accepted drafts of one FLy round from the per-position SD decisions and gates (vLLM's rule)."""
    kept = []
    for i in range(length):
        in_window = all(native[j] for j in range(i + 1, i + window + 1)) if i + window < length else False
        kept.append(native[i] or (gate[i] and in_window))
    n = 0
    while n < length and kept[n]:
        n += 1
    return n


class TablePair:
    """p(· | prefix) for prefix lengths 0..G, q(· | prefix) for 0..G−1 (float64 tables over V tokens).

    Each row is flat or peaked at random, so the entropy gate is open at some prefixes and shut at others.
    """

    def __init__(self, seed: int, vocab: int, gamma: int, deterministic: bool = False):
        rng = np.random.default_rng(seed)
        self.vocab, self.gamma, self.deterministic = vocab, gamma, deterministic

        def table(prefix_len):
            rows = vocab ** prefix_len
            scale = np.where(rng.random(rows) < 0.5, 0.4, 3.0)[:, None]
            logits = rng.normal(size=(rows, vocab)) * scale
            probs = np.exp(logits - logits.max(1, keepdims=True))
            return probs / probs.sum(1, keepdims=True)

        self.P = [table(n) for n in range(gamma + 1)]
        self.Q = [table(n) for n in range(gamma)]
        if deterministic:
            # A lookup-style proposal: the verifier's favourite at most prefixes, another token at the rest.
            picks = [np.where(rng.random(len(p)) < 0.7, p.argmax(1), rng.integers(0, vocab, size=len(p)))
                     for p in self.P[:gamma]]
            self.Q = [np.eye(vocab)[pick] for pick in picks]

    def code(self, prefix) -> int:
        value = 0
        for token in prefix:
            value = value * self.vocab + int(token)
        return value

    def p(self, prefix):
        return self.P[len(prefix)][self.code(prefix)]

    def q(self, prefix):
        return self.Q[len(prefix)][self.code(prefix)]

    def round_inputs(self, drafts: torch.Tensor):
        n, gamma = drafts.shape
        codes = np.zeros(n, dtype=np.int64)
        p_rows, q_rows = [], []
        d = drafts.numpy()
        for i in range(gamma + 1):
            p_rows.append(self.P[i][codes])
            if i < gamma:
                q_rows.append(self.Q[i][codes])
                codes = codes * self.vocab + d[:, i]
        return torch.tensor(np.stack(p_rows, 1)), torch.tensor(np.stack(q_rows, 1))

    def sample_drafts(self, n: int, g: torch.Generator, verifier_argmax: float = 0.0) -> torch.Tensor:
        """Drafts from q; with ``verifier_argmax`` > 0 that share of them is p's argmax instead (greedy
        tests)."""
        codes = torch.zeros(n, dtype=torch.long)
        out = []
        for i in range(self.gamma):
            token = torch.multinomial(torch.tensor(self.Q[i])[codes], 1, generator=g).squeeze(1)
            favourite = torch.tensor(self.P[i].argmax(1))[codes]
            token = torch.where(torch.rand(n, generator=g) < verifier_argmax, favourite, token)
            out.append(token)
            codes = codes * self.vocab + token
        return torch.stack(out, 1)


def exact_round(pair: TablePair, window: int, threshold: float, top_k: int = 3, greedy: bool = False) -> dict:
    """Exact distribution of one FLy round's emitted sequence (tuple of tokens) on a full-length block."""
    length, vocab = pair.gamma, pair.vocab
    out: dict[tuple, float] = {}
    for block in itertools.product(range(vocab), repeat=length):
        prob = math.prod(pair.q(block[:i])[block[i]] for i in range(length))
        if prob == 0:
            continue
        p_at = [pair.p(block[:i]) for i in range(length + 1)]
        q_at = [pair.q(block[:i]) for i in range(length)]
        gate = [
            reference_entropy(p_at[i], top_k) >= threshold and p_at[i][block[i]] > 0 and q_at[i][block[i]] > 0
            for i in range(length)
        ]
        if greedy:
            native_prob = [float(block[i] == int(np.argmax(p_at[i]))) for i in range(length)]
        else:
            native_prob = [min(1.0, p_at[i][block[i]] / q_at[i][block[i]]) for i in range(length)]
        for pattern in itertools.product((False, True), repeat=length):
            weight = prob * math.prod(a if s else 1 - a for a, s in zip(native_prob, pattern))
            if weight == 0:
                continue
            n = reference_fly_length(pattern, gate, length, window)
            if n == length:
                emitted = p_at[length]
            else:
                mass = np.maximum(p_at[n] - q_at[n], 0)
                emitted = mass / mass.sum() if mass.sum() > 1e-12 else p_at[n]
            if greedy:
                emitted = np.eye(vocab)[int(np.argmax(p_at[n]))]
            for y in np.nonzero(emitted)[0]:
                key = block[:n] + (int(y),)
                out[key] = out.get(key, 0.0) + weight * emitted[y]
    return out


def sample_rounds(pair: TablePair, rule, n: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    drafts = pair.sample_drafts(n, g)
    p, q = pair.round_inputs(drafts)
    lens = torch.full((n,), pair.gamma)
    verdict = verify_round(rule, p, None if pair.deterministic else q, drafts, lens, False, g)
    counts: dict[tuple, int] = {}
    for row, accepted, token in zip(drafts.tolist(), verdict.accepted.tolist(), verdict.next_token.tolist()):
        key = tuple(row[:accepted]) + (token,)
        counts[key] = counts.get(key, 0) + 1
    return counts


def chi2_pvalue(counts: dict, expected: dict) -> float:
    n = sum(counts.values())
    assert set(counts) <= {k for k, v in expected.items() if v > 1e-12}, "an impossible sequence was emitted"
    keys = sorted(expected)
    obs = np.array([counts.get(k, 0) for k in keys], dtype=np.float64)
    exp = np.array([expected[k] for k in keys]) * n
    big = exp >= 5
    o, e = list(obs[big]), list(exp[big])
    if (~big).any() and exp[~big].sum() > 0:
        o.append(obs[~big].sum())
        e.append(exp[~big].sum())
    e = np.array(e) * (np.sum(o) / np.sum(e))
    return float(chisquare(o, e).pvalue)


def tv(a: dict, b: dict) -> float:
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


# ---------------------------------------------------------------------------------------------------------
# Entropy gate
# ---------------------------------------------------------------------------------------------------------


def test_top_k_entropy_is_the_unnormalised_top_k_sum():
    g = torch.Generator().manual_seed(0)
    p = torch.softmax(torch.randn(200, 9, generator=g, dtype=torch.float64) * 2, -1)
    p[:50, :3] = 0.0  # zeros inside the top k of some rows
    p = p / p.sum(-1, keepdim=True)
    for k in (1, 2, 3, 5, 9, 20):
        got = top_k_entropy(p, k).numpy()
        expected = [reference_entropy(row, k) for row in p.numpy()]
        np.testing.assert_allclose(got, expected, atol=1e-12)
        assert (got <= max_top_k_entropy(min(k, 9)) + 1e-12).all()
    # The bounds are reached: k equal tokens (k ≥ 3), one token at 1/e (k = 1), two at 1/e (k = 2).
    assert top_k_entropy(torch.full((3,), 1 / 3, dtype=torch.float64), 3).item() == pytest.approx(math.log(3))
    one = torch.tensor([1 / math.e, (1 - 1 / math.e) / 2, (1 - 1 / math.e) / 2], dtype=torch.float64)
    assert top_k_entropy(one, 1).item() == pytest.approx(max_top_k_entropy(1))
    two = torch.tensor([1 / math.e, 1 / math.e, 1 - 2 / math.e], dtype=torch.float64)
    assert top_k_entropy(two, 2).item() == pytest.approx(max_top_k_entropy(2))


def test_lossless_exactly_when_the_gate_cannot_open():
    for k in (1, 2, 3, 10):
        bound = max_top_k_entropy(k)
        assert FlyRule(entropy_threshold=bound + 1e-6, entropy_top_k=k).lossless
        assert not FlyRule(entropy_threshold=bound - 1e-6, entropy_top_k=k).lossless
    assert not FlyRule().lossless


def test_default_window_is_vllms_min_6_drafts_minus_1():
    lens = torch.arange(0, 11)
    assert FlyRule().windows(lens).tolist() == [1, 1, 1, 2, 3, 4, 5, 6, 6, 6, 6]
    assert FlyRule(window_size=2).windows(lens).tolist() == [2] * 11


# ---------------------------------------------------------------------------------------------------------
# The round's closed form (chi-square), model and deterministic drafters
# ---------------------------------------------------------------------------------------------------------

ROUND_CASES = {
    "v4-g3-w1": (TablePair(1, 4, 3), {"window_size": 1, "entropy_threshold": 0.6}),
    "v4-g3-w2": (TablePair(2, 4, 3), {"window_size": 2, "entropy_threshold": 0.6}),
    "v3-g4-default-window": (TablePair(3, 3, 4), {"entropy_threshold": 0.5}),
    "v4-g3-gate-always-open": (TablePair(4, 4, 3), {"window_size": 1, "entropy_threshold": 0.0}),
    "v4-g3-deterministic": (
        TablePair(5, 4, 3, deterministic=True),
        {"window_size": 1, "entropy_threshold": 0.6},
    ),
}


def _window(params, gamma):
    return params.get("window_size") or max(1, min(6, gamma - 1))


@pytest.mark.parametrize("case", list(ROUND_CASES))
def test_sampled_rounds_match_the_closed_form(case):
    pair, params = ROUND_CASES[case]
    expected = exact_round(pair, _window(params, pair.gamma), params["entropy_threshold"])
    assert sum(expected.values()) == pytest.approx(1.0, abs=1e-12)
    counts = sample_rounds(pair, FlyRule(**params), N_ROUNDS, seed=7)
    assert chi2_pvalue(counts, expected) > P_VALUE, case


@pytest.mark.parametrize("case", list(ROUND_CASES))
def test_closed_form_cases_defer_and_are_lossy(case):
    """Deferrals change the round (not vacuous) and raise the expected accepted length over exact SD."""
    pair, params = ROUND_CASES[case]
    fly = exact_round(pair, _window(params, pair.gamma), params["entropy_threshold"])
    sd = exact_round(pair, pair.gamma, params["entropy_threshold"])  # a window that never fits: exact SD
    assert tv(fly, sd) > 0.01
    mean_accepted = lambda dist: sum(w * (len(k) - 1) for k, w in dist.items())
    assert mean_accepted(fly) > mean_accepted(sd) + 0.01


def test_closed_form_has_power():
    """The chi-square above rejects samples of exact SD against FLy's closed form."""
    pair, params = ROUND_CASES["v4-g3-w1"]
    expected = exact_round(pair, 1, params["entropy_threshold"])
    counts = sample_rounds(pair, VerificationRule(), N_ROUNDS, seed=8)
    assert chi2_pvalue(counts, expected) < 1e-6


@pytest.mark.parametrize("window,threshold", [(1, 0.0), (2, 0.6), (1, 0.9)])
def test_greedy_rounds_match_the_reference_row_by_row(window, threshold):
    """Greedy FLy is deterministic given the block: every row against the reference, mixed lengths."""
    pair = TablePair(6, 4, 4)
    g = torch.Generator().manual_seed(3)
    drafts = pair.sample_drafts(3000, g, verifier_argmax=0.6)
    p, q = pair.round_inputs(drafts)
    lens = torch.randint(0, 5, (3000,), generator=g)
    verdict = verify_round(FlyRule(window_size=window, entropy_threshold=threshold), p, q, drafts, lens, True)
    deferred = 0
    for row in range(3000):
        x, length = drafts[row].tolist(), int(lens[row])
        p_at = p[row].numpy()
        native = [x[i] == int(np.argmax(p_at[i])) for i in range(length)]
        gate = [reference_entropy(p_at[i], 3) >= threshold and p_at[i][x[i]] > 0 for i in range(length)]
        n = reference_fly_length(native, gate, length, window)
        assert (int(verdict.accepted[row]), int(verdict.next_token[row])) == (n, int(np.argmax(p_at[n])))
        deferred += n > reference_fly_length(native, [False] * length, length, window)
    assert deferred > 50


# ---------------------------------------------------------------------------------------------------------
# Defining properties on crafted greedy rounds
# ---------------------------------------------------------------------------------------------------------

FLAT = [0.4, 0.35, 0.2, 0.05, 0.0]  # top-3 entropy 1.02 nats; argmax 0
PEAKED = [0.9, 0.04, 0.03, 0.03, 0.0]  # top-3 entropy 0.33 nats
CONFIDENT = [0.97, 0.01, 0.01, 0.01, 0.0]  # top-3 entropy 0.12 nats


def _crafted(rows, drafts, length=None):
    p = torch.tensor([rows], dtype=torch.float64)
    d = torch.tensor([drafts])
    q = torch.full((1, len(drafts), 5), 0.2, dtype=torch.float64)
    lens = torch.tensor([len(drafts) if length is None else length])
    return p, q, d, lens


CRAFTED = [
    # (name, p rows (G+1), drafts, window, threshold, expected accepted, expected next token)
    ("deferred-high-entropy", [FLAT, CONFIDENT, CONFIDENT, CONFIDENT], [1, 0, 0], 2, 0.5, 3, 0),
    ("low-entropy-rejected", [PEAKED, CONFIDENT, CONFIDENT, CONFIDENT], [1, 0, 0], 2, 0.5, 0, 0),
    ("window-broken", [FLAT, CONFIDENT, CONFIDENT, CONFIDENT], [1, 0, 2], 2, 0.5, 0, 0),
    ("window-does-not-fit", [CONFIDENT, CONFIDENT, FLAT, CONFIDENT, CONFIDENT], [0, 0, 1, 0], 2, 0.5, 2, 0),
    ("zero-probability-draft", [FLAT, CONFIDENT, CONFIDENT, CONFIDENT], [4, 0, 0], 2, 0.5, 0, 0),
    ("deferred-draft-not-in-window", [FLAT, FLAT, CONFIDENT, CONFIDENT], [1, 1, 0], 1, 0.5, 0, 0),
    (
        "two-deferrals",
        [FLAT, CONFIDENT, FLAT, CONFIDENT, CONFIDENT, CONFIDENT],
        [2, 0, 1, 0, 0],
        1,
        0.5,
        5,
        0,
    ),
    ("threshold-is-inclusive", [PEAKED, CONFIDENT, CONFIDENT], [1, 0], 1, None, 2, 0),
    ("correction-after-deferral", [FLAT, CONFIDENT, FLAT, CONFIDENT], [1, 0, 3], 1, 0.5, 2, 0),
]


@pytest.mark.parametrize(
    "name,rows,drafts,window,threshold,accepted,token", CRAFTED, ids=[c[0] for c in CRAFTED]
)
def test_crafted_greedy_rounds(name, rows, drafts, window, threshold, accepted, token):
    p, q, d, lens = _crafted(rows, drafts)
    if threshold is None:
        threshold = float(top_k_entropy(p[0, 0], 3))
    rule = FlyRule(window_size=window, entropy_threshold=threshold)
    verdict = verify_round(rule, p, q, d, lens, True)
    assert (int(verdict.accepted[0]), int(verdict.next_token[0])) == (accepted, token)


def test_crafted_rounds_through_the_reference():
    """The crafted expectations agree with the independent reference length."""
    for name, rows, drafts, window, threshold, accepted, _ in CRAFTED:
        p = np.array(rows)
        if threshold is None:
            threshold = reference_entropy(p[0], 3)
        native = [drafts[i] == int(np.argmax(p[i])) for i in range(len(drafts))]
        gate = [reference_entropy(p[i], 3) >= threshold and p[i][drafts[i]] > 0 for i in range(len(drafts))]
        assert reference_fly_length(native, gate, len(drafts), window) == accepted, name


# ---------------------------------------------------------------------------------------------------------
# Relation to exact SD under the same uniforms
# ---------------------------------------------------------------------------------------------------------


def random_round(seed: int, batch: int = 3000, gamma: int = 6, vocab: int = 6):
    g = torch.Generator().manual_seed(seed)
    scale = torch.where(torch.rand(batch, gamma + 1, 1, generator=g) < 0.5, 0.5, 3.0)
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=g) * scale, -1)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g) * 2, -1)
    drafts = torch.where(torch.rand(batch, gamma, generator=g) < 0.6, p[:, :gamma].argmax(-1),
                         torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma))
    lens = torch.randint(0, gamma + 1, (batch,), generator=g)
    return p, q, drafts, lens


SETTINGS = [{"window_size": 1, "entropy_threshold": 0.0}, {"window_size": 2, "entropy_threshold": 0.5},
            {"entropy_threshold": 0.3}, {"window_size": 3, "entropy_threshold": 0.8, "entropy_top_k": 5}]


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("params", SETTINGS, ids=lambda s: "-".join(f"{k}{v}" for k, v in s.items()))
def test_never_accepts_fewer_drafts_than_sd_under_the_same_uniforms(params, deterministic, greedy):
    p, q, drafts, lens = random_round(11)
    q_in = None if deterministic else q
    fly = verify_round(FlyRule(**params), p, q_in, drafts, lens, greedy, torch.Generator().manual_seed(5))
    sd = verify_round(VerificationRule(), p, q_in, drafts, lens, greedy, torch.Generator().manual_seed(5))
    assert (fly.accepted >= sd.accepted).all() and (fly.accepted <= lens).all()
    assert (fly.accepted > sd.accepted).any()
    if greedy:  # same stop position: the same correction or bonus token
        same = fly.accepted == sd.accepted
        assert torch.equal(fly.next_token[same], sd.next_token[same])


@pytest.mark.parametrize("greedy", [False, True])
@pytest.mark.parametrize(
    "params",
    [{"entropy_threshold": max_top_k_entropy(3) + 1e-9}, {"window_size": 6, "entropy_threshold": 0.0}],
    ids=["gate-shut", "window-too-long"],
)
def test_reduces_to_sd_decision_for_decision(params, greedy):
    """Gate that cannot open, or a window that never fits in γ = 6 drafts: exactly exact SD."""
    p, q, drafts, lens = random_round(12)
    fly = verify_round(FlyRule(**params), p, q, drafts, lens, greedy, torch.Generator().manual_seed(6))
    sd = verify_round(VerificationRule(), p, q, drafts, lens, greedy, torch.Generator().manual_seed(6))
    assert torch.equal(fly.accepted, sd.accepted) and torch.equal(fly.next_token, sd.next_token)


def test_no_drafts_is_autoregressive():
    p = torch.softmax(torch.randn(5, 1, 7, generator=torch.Generator().manual_seed(0)), -1)
    empty = torch.zeros(5, 0, dtype=torch.long)
    for greedy in (True, False):
        verdict = verify_round(FlyRule(entropy_threshold=0.0), p, torch.zeros(5, 0, 7), empty,
                               torch.zeros(5, dtype=torch.long), greedy, torch.Generator().manual_seed(1))
        assert verdict.accepted.tolist() == [0] * 5
    assert torch.equal(verdict.next_token, verify_round(VerificationRule(), p, torch.zeros(5, 0, 7), empty,
                       torch.zeros(5, dtype=torch.long), False, torch.Generator().manual_seed(1)).next_token)


@pytest.mark.parametrize("factory,key", [
    (lambda: FlyRule(window_size=0), "method.window_size"),
    (lambda: FlyRule(window_size=1.5), "method.window_size"),
    (lambda: FlyRule(entropy_threshold=-0.1), "method.entropy_threshold"),
    (lambda: FlyRule(entropy_threshold=float("nan")), "method.entropy_threshold"),
    (lambda: FlyRule(entropy_top_k=0), "method.entropy_top_k"),
])
def test_invalid_parameters_name_their_key(factory, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        factory()


# ---------------------------------------------------------------------------------------------------------
# End to end on a tiny model pair
# ---------------------------------------------------------------------------------------------------------

PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]


@functools.cache
def tiny_pair():
    verifier = tiny_random_model("llama", seed=0)
    drafter = copy.deepcopy(verifier)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in drafter.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.02)
    return verifier, drafter


def run(rule, **settings):
    verifier, drafter = tiny_pair()
    engine = SpeculativeEngine(
        verifier,
        ModelDrafter(drafter),
        rule=rule,
        schedule=DraftSchedule("constant", gamma=5),
        settings=GenerationSettings(max_new_tokens=24, **settings),
        eos_token_ids=(EOS_ID,),
        pad_token_id=PAD_ID,
    )
    return engine.generate(PROMPTS)


def test_engine_lossless_setting_reproduces_the_verifier_greedy():
    verifier, _ = tiny_pair()
    for prompt, result in zip(PROMPTS, run(FlyRule(entropy_threshold=2.0))):
        hf = verifier.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=24,
            eos_token_id=[EOS_ID],
            pad_token_id=PAD_ID,
        )
        assert result.output_ids == hf[0, len(prompt):].tolist()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_engine_open_gate_defers_and_keeps_round_records_consistent(temperature):
    fly = run(FlyRule(window_size=2, entropy_threshold=0.0), temperature=temperature, seed=3)
    sd = run(VerificationRule(), temperature=temperature, seed=3)
    for result in fly:
        assert sum(r.emitted for r in result.rounds) == len(result.output_ids)
        assert all(0 <= r.accepted <= r.drafted for r in result.rounds)
    if temperature == 0.0:
        assert any(f.output_ids != s.output_ids for f, s in zip(fly, sd))  # lossy: it changed the text
    per_round = lambda results: np.mean([r.emitted for res in results for r in res.rounds])
    assert per_round(fly) > per_round(sd)
