"""Verification rules, one verification round and logits warping as pure tensor maths (methods.md §1–2).

The reference for every rule is written here independently in numpy from the formulas of methods.md §2
(not by calling the library), and the library is checked against it three ways: the closed form
``one_step_distribution``, the greedy decisions, and the empirical output distribution of
``verify_round`` (chi-square on tens of thousands of vectorised samples, fixed seeds).
"""

from __future__ import annotations

import itertools
import math
import zlib

import numpy as np
import pytest
import torch
from scipy.stats import chisquare
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from specbench.decoding import (
    CascadeRule,
    EnsembleRule,
    LenientRule,
    TypicalRule,
    VerificationRule,
    Warping,
    one_step_distribution,
    pool_distributions,
    verify_round,
)
from specbench.decoding.methods import build_rule, canonical_method

V = 7
N_SAMPLES = 40_000
P_VALUE = 1e-3
MAX_ABS_DEV = 0.015  # ~6 standard deviations of a frequency estimated from 40k samples



# ---------------------------------------------------------------------------------------------------------
# Distributions under test: small random p, q, some truncated (zeros) the way top-k truncation makes them.
# ---------------------------------------------------------------------------------------------------------


def _random_dist(seed: int, keep: int | None = None, scale: float = 1.5) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(V, generator=g, dtype=torch.float64) * scale
    if keep is not None:
        kth = torch.topk(logits, keep).values[-1]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return torch.softmax(logits, dim=-1).float()


PAIRS = {
    "full": (_random_dist(1), _random_dist(2)),
    "p_truncated": (_random_dist(3, keep=4), _random_dist(4)),
    "q_truncated": (_random_dist(5), _random_dist(6, keep=3)),
    "both_truncated": (_random_dist(7, keep=4), _random_dist(8, keep=4)),
    "peaked": (_random_dist(9, scale=4.0), _random_dist(10, scale=4.0)),
}


def test_pairs_cover_the_truncation_cases():
    p, q = PAIRS["p_truncated"]
    assert (p == 0).sum() == V - 4 and (q > 0).all()
    p, q = PAIRS["q_truncated"]
    assert (q == 0).sum() == V - 3 and (p > 0).all()
    p, q = PAIRS["both_truncated"]
    # Partial overlap: each puts mass where the other has none, and they share some support.
    assert ((p > 0) & (q == 0)).any() and ((q > 0) & (p == 0)).any() and ((p > 0) & (q > 0)).any()


# ---------------------------------------------------------------------------------------------------------
# Independent numpy references (methods.md §2 table)
# ---------------------------------------------------------------------------------------------------------


def _np(t: torch.Tensor) -> np.ndarray:
    return t.double().numpy()


def _tv(a: np.ndarray, b: np.ndarray) -> float:
    return 0.5 * float(np.abs(a - b).sum())


def _ratio_rule_output(pi: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Output of accept-with-min(1, π/q), residual ∝ max(0, π − q): equals π for any distribution π."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(q > 0, np.minimum(1.0, pi / np.where(q > 0, q, 1.0)), 1.0)
    acc = q * a
    mass = np.maximum(0.0, pi - q)
    r = mass / mass.sum() if mass.sum() > 1e-12 else pi
    return acc + (1.0 - acc.sum()) * r


def _loglinear(p, q, w):
    with np.errstate(divide="ignore"):
        log_p, log_q = np.log(p), np.log(q)
    term = (w * log_q if w > 0 else 0.0) + ((1 - w) * log_p if w < 1 else 0.0)
    un = np.exp(term)
    return un / un.sum()


def reference_target(spec: tuple, p: np.ndarray, q: np.ndarray) -> np.ndarray | None:
    """π of a rule given as a replacement target; None for rules that are not (lossy, typical)."""
    kind = spec[0]
    if kind == "sd":
        return p
    if kind == "linear":
        w = spec[1]
        return (1 - w) * p + w * q
    if kind == "log_linear":
        return _loglinear(p, q, spec[1])
    if kind == "cascade":
        deferral, alpha = spec[1], spec[2]
        if deferral == "token":
            allowed = p >= (1 - alpha) * p.max()
            return q * allowed + (1 - (q * allowed).sum()) * p
        if deferral == "chow":
            defer = q.max() < 1 - alpha
        elif deferral == "diff":
            defer = q.max() < p.max() - alpha
        else:
            defer = q.max() < p.max() - alpha * _tv(p, q)
        return p if defer else q
    return None


def reference_output(spec: tuple, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """Exact one-step output distribution P(x) of a rule, from the formulas of methods.md §2."""
    kind = spec[0]
    if kind == "lossy":
        lenience = spec[1]
        with np.errstate(divide="ignore", invalid="ignore"):
            a = np.where(q > 0, np.minimum(1.0, p / (lenience * np.where(q > 0, q, 1.0))), 1.0)
        acc = q * a
        mass = np.maximum(0.0, p - lenience * q)
        r = mass / mass.sum() if mass.sum() > 1e-12 else p
        return acc + (1 - acc.sum()) * r
    if kind == "typical":
        eps, delta = spec[1], spec[2]
        entropy = -float(np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1.0)), 0.0)))
        accept = p > min(eps, delta * math.exp(-entropy))
        acc = q * accept
        return acc + (1 - acc.sum()) * p
    return _ratio_rule_output(reference_target(spec, p, q), q)


def make_rule(spec: tuple):
    kind = spec[0]
    if kind == "sd":
        return VerificationRule()
    if kind == "lossy":
        return LenientRule(spec[1])
    if kind in ("linear", "log_linear"):
        return EnsembleRule(spec[1], pool=kind)
    if kind == "cascade":
        return CascadeRule(spec[1], spec[2])
    return TypicalRule(epsilon=spec[1], delta=spec[2])


RULES = (
    [("sd",)]
    + [("lossy", l) for l in (0.2, 0.5, 0.8, 1.0)]
    + [(pool, w) for pool in ("linear", "log_linear") for w in (0.0, 0.3, 0.7, 1.0)]
    + [("cascade", "chow", a) for a in (0.0, 0.5, 0.8)]
    + [("cascade", "diff", a) for a in (0.0, 0.1, 0.3)]
    + [("cascade", "opt", a) for a in (0.0, 0.5, 2.0)]
    + [("cascade", "token", a) for a in (0.0, 0.3, 0.8, 1.0)]
    + [("typical", 0.09, 0.3), ("typical", 0.3, 0.6)]
)
LOSSLESS = [("sd",), ("lossy", 1.0), ("linear", 0.0), ("log_linear", 0.0), ("cascade", "chow", 0.0)]


def _rule_id(spec):
    return "-".join(str(s) for s in spec)


def test_cascade_cases_exercise_both_deferral_branches():
    """The chi-square matrix below must see deferred and non-deferred positions for every cascade rule."""
    for deferral in ("chow", "diff", "opt"):
        decisions = set()
        for spec in RULES:
            if spec[:2] != ("cascade", deferral):
                continue
            for p, q in PAIRS.values():
                decisions.add(bool(CascadeRule(deferral, spec[2]).defer(p, q)))
        assert decisions == {True, False}, deferral


# ---------------------------------------------------------------------------------------------------------
# Closed form
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("spec", RULES, ids=_rule_id)
def test_closed_form_matches_reference_and_is_a_distribution(spec, pair):
    p, q = PAIRS[pair]
    closed = one_step_distribution(make_rule(spec), p, q)
    assert torch.isfinite(closed).all()
    assert (closed >= 0).all()
    assert closed.sum().item() == pytest.approx(1.0, abs=1e-5)
    np.testing.assert_allclose(_np(closed), reference_output(spec, _np(p), _np(q)), atol=1e-5)
    rule = make_rule(spec)
    acceptance = rule.acceptance(p, q)
    assert ((acceptance >= 0) & (acceptance <= 1)).all()
    residual = rule.residual(p, q)
    assert (residual >= 0).all() and residual.sum().item() == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize(
    "spec",
    [s for s in RULES if reference_target(s, np.ones(2) / 2, np.ones(2) / 2) is not None],
    ids=_rule_id,
)
def test_target_rules_output_their_target(spec, pair):
    """Speculative sampling towards π outputs exactly π (methods.md §2), so P == target(p, q)."""
    p, q = PAIRS[pair]
    rule = make_rule(spec)
    target = rule.target(p, q)
    np.testing.assert_allclose(_np(target), reference_target(spec, _np(p), _np(q)), atol=1e-6)
    np.testing.assert_allclose(_np(one_step_distribution(rule, p, q)), _np(target), atol=1e-6)


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("spec", LOSSLESS, ids=_rule_id)
def test_lossless_settings_output_p(spec, pair):
    p, q = PAIRS[pair]
    rule = make_rule(spec)
    if spec[0] != "cascade":
        assert rule.lossless
    torch.testing.assert_close(one_step_distribution(rule, p, q), p, atol=1e-6, rtol=0)


@pytest.mark.parametrize(
    "spec",
    [("lossy", 0.5), ("linear", 0.3), ("log_linear", 0.3), ("cascade", "chow", 0.6), ("typical", 0.09, 0.3)],
    ids=_rule_id,
)
def test_lossy_settings_are_flagged_and_change_the_output(spec):
    p, q = PAIRS["full"]
    rule = make_rule(spec)
    assert not rule.lossless
    assert (one_step_distribution(rule, p, q) - p).abs().max() > 1e-3


@pytest.mark.parametrize("pair", list(PAIRS))
def test_linear_pool_traces_the_acceptance_bias_front(pair):
    """Linear pool: acceptance 1 − (1−w)·TV(p,q), bias TV(π,p) = w·TV(p,q), their difference constant
    (§2.1)."""
    p, q = PAIRS[pair]
    tv = 0.5 * (p - q).abs().sum().item()
    differences = []
    for w in np.linspace(0.0, 1.0, 11):
        rule = EnsembleRule(float(w))
        acceptance = (q * rule.acceptance(p, q)).sum().item()
        bias = 0.5 * (one_step_distribution(rule, p, q) - p).abs().sum().item()
        assert acceptance == pytest.approx(1 - (1 - w) * tv, abs=1e-5)
        assert bias == pytest.approx(w * tv, abs=1e-5)
        differences.append(acceptance - bias)
    np.testing.assert_allclose(differences, 1 - tv, atol=1e-5)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_pools_at_the_end_points(pair):
    p, q = PAIRS[pair]
    for pool in ("linear", "log_linear"):
        # Equal to p up to float32 rounding (the log-linear pool goes through log/softmax).
        torch.testing.assert_close(pool_distributions(p, q, 0.0, pool), p, atol=1e-6, rtol=0)
        torch.testing.assert_close(pool_distributions(p, q, 1.0, pool), q, atol=1e-7, rtol=0)
        torch.testing.assert_close(one_step_distribution(EnsembleRule(1.0, pool), p, q), q, atol=1e-6, rtol=0)
    # w = 0 must be *exactly* exact SD: no NaN from 0·log 0, no renormalisation drift.
    assert torch.isfinite(pool_distributions(p, q, 0.0, "log_linear")).all()
    assert torch.equal(pool_distributions(p, q, 0.0, "log_linear").argmax(), p.argmax())


def test_log_linear_pool_is_the_normalised_geometric_mixture():
    p, q = PAIRS["full"]
    for w in (0.25, 0.5, 0.9):
        expected = q**w * p ** (1 - w)
        torch.testing.assert_close(
            pool_distributions(p, q, w, "log_linear"), expected / expected.sum(), atol=1e-6, rtol=0
        )


def test_log_linear_pool_with_disjoint_supports_is_a_distribution():
    """Top-k truncation can leave p and q with disjoint supports (common with small top_k and a poor drafter).

    Then q^w·p^(1−w) is zero everywhere for 0 < w < 1; the pool must still be a distribution (the library
    currently returns NaN, and sampling from the residual raises in ``torch.multinomial``).
    """
    p = torch.tensor([0.6, 0.4, 0.0, 0.0, 0.0])
    q = torch.tensor([0.0, 0.0, 0.7, 0.3, 0.0])
    pooled = pool_distributions(p, q, 0.5, "log_linear")
    assert torch.isfinite(pooled).all(), pooled
    assert pooled.sum().item() == pytest.approx(1.0, abs=1e-6)
    rule = EnsembleRule(0.5, "log_linear")
    out = one_step_distribution(rule, p, q)
    assert torch.isfinite(out).all() and out.sum().item() == pytest.approx(1.0, abs=1e-6)
    g = torch.Generator().manual_seed(0)
    verdict = verify_round(
        rule,
        torch.stack([p, p])[None],
        q[None, None],
        torch.tensor([[2]]),
        torch.tensor([1]),
        greedy=False,
        generator=g,
    )
    assert verdict.next_token.item() in (0, 1, 2, 3)


@pytest.mark.parametrize("pair", list(PAIRS))
def test_lossy_acceptance_is_monotone_in_lenience(pair):
    p, q = PAIRS[pair]
    lenience = np.linspace(0.05, 1.0, 20)
    rates = [(q * LenientRule(float(l)).acceptance(p, q)).sum().item() for l in lenience]
    assert all(a >= b - 1e-7 for a, b in itertools.pairwise(rates))
    # Per token too: a(x) = min(1, p(x) / (l q(x))) never grows with l.
    per_token = torch.stack([LenientRule(float(l)).acceptance(p, q) for l in lenience])
    assert (per_token[1:] <= per_token[:-1] + 1e-7).all()
    assert rates[-1] == pytest.approx(1 - 0.5 * (p - q).abs().sum().item(), abs=1e-5)


def test_cascade_rules_at_their_limits():
    for p, q in PAIRS.values():
        # chow α = 0 defers unless q is one-hot: π = p; α = 1 never defers: π = q.
        torch.testing.assert_close(CascadeRule("chow", 0.0).target(p, q), p)
        torch.testing.assert_close(CascadeRule("chow", 1.0).target(p, q), q)
        # diff / opt at α = 0: defer iff max q < max p.
        expected = p if q.max() < p.max() else q
        torch.testing.assert_close(CascadeRule("diff", 0.0).target(p, q), expected)
        torch.testing.assert_close(CascadeRule("opt", 0.0).target(p, q), expected)
        # diff with α ≥ 1 never defers.
        torch.testing.assert_close(CascadeRule("diff", 1.0).target(p, q), q)
        # token α = 0: A = argmax p; α = 1: A = everything, π = q.
        top = int(p.argmax())
        expected = (1 - q[top]) * p
        expected[top] += q[top]
        torch.testing.assert_close(CascadeRule("token", 0.0).target(p, q), expected)
        torch.testing.assert_close(CascadeRule("token", 1.0).target(p, q), q)


def test_cascade_deferral_decisions_on_crafted_distributions():
    p = torch.tensor([0.7, 0.2, 0.1, 0.0])
    q = torch.tensor([0.1, 0.5, 0.2, 0.2])  # max q = 0.5, max p = 0.7, TV = 0.6
    assert bool(CascadeRule("chow", 0.4).defer(p, q))  # 0.5 < 0.6
    assert not bool(CascadeRule("chow", 0.6).defer(p, q))  # 0.5 < 0.4 is false
    assert bool(CascadeRule("diff", 0.1).defer(p, q))  # 0.5 < 0.6
    assert not bool(CascadeRule("diff", 0.3).defer(p, q))  # 0.5 < 0.4 is false
    assert bool(CascadeRule("opt", 0.3).defer(p, q))  # 0.5 < 0.7 − 0.18
    assert not bool(CascadeRule("opt", 0.5).defer(p, q))  # 0.5 < 0.7 − 0.3 is false
    # Batched: one decision per row.
    both = CascadeRule("chow", 0.4).defer(
        torch.stack([p, p]), torch.stack([q, torch.tensor([0.9, 0.1, 0, 0])])
    )
    assert both.tolist() == [True, False]


def test_typical_rule_threshold():
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    entropy = -(p * p.log()).sum()
    rule = TypicalRule(epsilon=0.09, delta=0.3)
    assert rule.threshold(p).item() == pytest.approx(min(0.09, 0.3 * math.exp(-entropy.item())), rel=1e-6)
    assert rule.acceptance(p, p).tolist() == [1.0, 1.0, 1.0, 0.0]  # threshold = 0.09
    loose = TypicalRule(epsilon=0.5, delta=0.3)  # δ·e^{−H} ≈ 0.095 < 0.5
    assert loose.acceptance(p, p).tolist() == [1.0, 1.0, 1.0, 0.0]
    strict = TypicalRule(epsilon=0.2, delta=10.0)
    assert strict.acceptance(p, p).tolist() == [1.0, 1.0, 0.0, 0.0]


def test_per_position_weights_override_the_static_weight():
    """DIVERSED passes one draft weight per position; the ensemble rule must use it instead of its own."""
    p = torch.stack([PAIRS["full"][0], PAIRS["peaked"][0]])
    q = torch.stack([PAIRS["full"][1], PAIRS["peaked"][1]])
    weights = torch.tensor([0.2, 0.9])
    for pool in ("linear", "log_linear"):
        rule = EnsembleRule(0.5, pool)
        got = one_step_distribution(rule, p, q, weights)
        for row, w in enumerate(weights.tolist()):
            expected = one_step_distribution(EnsembleRule(w, pool), p[row], q[row])
            torch.testing.assert_close(got[row], expected, atol=1e-6, rtol=0)


# ---------------------------------------------------------------------------------------------------------
# Empirical one-step output of verify_round (gamma = 1) vs the closed form: chi-square
# ---------------------------------------------------------------------------------------------------------


def _sample_one_step(rule, p, q, n=N_SAMPLES, seed=0, weights=None):
    """Draft x ~ q, verify with gamma = 1; the output is x if accepted else the correction token."""
    g = torch.Generator().manual_seed(seed)
    drafts = torch.multinomial(q, n, replacement=True, generator=g)
    big_p = torch.stack([p, p]).expand(n, 2, V)
    big_q = q.expand(n, 1, V)
    verdict = verify_round(
        rule,
        big_p,
        big_q,
        drafts.unsqueeze(1),
        torch.ones(n, dtype=torch.long),
        greedy=False,
        generator=g,
        weights=weights,
    )
    assert set(verdict.accepted.unique().tolist()) <= {0, 1}
    out = torch.where(verdict.accepted == 1, drafts, verdict.next_token)
    return torch.bincount(out, minlength=V).double().numpy(), verdict.accepted.double().mean().item()


def _assert_matches(counts: np.ndarray, expected: np.ndarray, label=""):
    n = counts.sum()
    expected = np.asarray(expected, dtype=np.float64)
    # Impossible outputs must never appear.
    assert counts[expected <= 1e-9].sum() == 0, (label, counts, expected)
    freq = counts / n
    assert np.abs(freq - expected).max() < MAX_ABS_DEV, (label, freq, expected)
    # Chi-square over cells with enough expected mass; the rest merged into one cell.
    exp_counts = expected * n
    big = exp_counts >= 5
    obs = list(counts[big])
    exp = list(exp_counts[big])
    if (~big).any() and exp_counts[~big].sum() > 0:
        obs.append(counts[~big].sum())
        exp.append(exp_counts[~big].sum())
    if len(obs) < 2:
        return
    exp = np.array(exp) * (np.sum(obs) / np.sum(exp))
    pvalue = chisquare(obs, exp).pvalue
    assert pvalue > P_VALUE, (label, pvalue, freq, expected)


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("spec", RULES, ids=_rule_id)
def test_verify_round_one_step_distribution(spec, pair):
    p, q = PAIRS[pair]
    rule = make_rule(spec)
    counts, acc_rate = _sample_one_step(rule, p, q, seed=zlib.crc32(f"{_rule_id(spec)}/{pair}".encode()))
    closed = one_step_distribution(rule, p, q).double().numpy()
    _assert_matches(counts, closed, label=(spec, pair))
    # Acceptance frequency matches Σ q·a too.
    expected_acc = (q * rule.acceptance(p, q)).sum().item()
    assert acc_rate == pytest.approx(expected_acc, abs=MAX_ABS_DEV)


@pytest.mark.parametrize("pair", list(PAIRS))
@pytest.mark.parametrize("spec", LOSSLESS, ids=_rule_id)
def test_lossless_verify_round_samples_p(spec, pair):
    p, q = PAIRS[pair]
    counts, _ = _sample_one_step(make_rule(spec), p, q, seed=17)
    _assert_matches(counts, _np(p), label=(spec, pair))


def test_verify_round_uses_per_position_weights():
    p, q = PAIRS["full"]
    n = N_SAMPLES
    weights = torch.full((n, 1), 0.8)
    counts, _ = _sample_one_step(EnsembleRule(0.0), p, q, seed=3, weights=weights)
    _assert_matches(counts, _np(one_step_distribution(EnsembleRule(0.8), p, q)))


def test_autoregressive_round_samples_p():
    """gamma = 0 (no drafter): the round emits one token from p[:, 0]."""
    p = PAIRS["full"][0]
    n = N_SAMPLES
    g = torch.Generator().manual_seed(5)
    verdict = verify_round(VerificationRule(), p.expand(n, 1, V), torch.zeros(n, 0, V),
                           torch.zeros(n, 0, dtype=torch.long), torch.zeros(n, dtype=torch.long), False, g)
    assert (verdict.accepted == 0).all()
    _assert_matches(torch.bincount(verdict.next_token, minlength=V).double().numpy(), _np(p))
    greedy = verify_round(VerificationRule(), p.expand(3, 1, V), torch.zeros(3, 0, V),
                          torch.zeros(3, 0, dtype=torch.long), torch.zeros(3, dtype=torch.long), True)
    assert (greedy.next_token == p.argmax()).all() and (greedy.accepted == 0).all()


# ---------------------------------------------------------------------------------------------------------
# Multi-position rounds: accepted prefix, correction and bonus positions
# ---------------------------------------------------------------------------------------------------------


def _one_hot(token, v=V):
    return torch.nn.functional.one_hot(torch.tensor(token), v).float()


def _crafted_round():
    """p/q for gamma = 3 where drafts 1–2 are certainly accepted, draft 3 certainly rejected.

    p rows: positions predicting drafts 1..3, then the bonus slot. Deterministic even when sampling:
    accepted drafts have p = q one-hot; the rejected draft has p(x) = 0 and the residual is one-hot.
    """
    p = torch.stack([_one_hot(1), _one_hot(2), _one_hot(4), _one_hot(6)])[None]
    q = torch.stack([_one_hot(1), _one_hot(2), _one_hot(5)])[None]
    drafts = torch.tensor([[1, 2, 5]])
    return p, q, drafts


@pytest.mark.parametrize("greedy", [True, False])
@pytest.mark.parametrize(
    "spec", [("sd",), ("lossy", 1.0), ("linear", 0.0), ("log_linear", 0.0)], ids=_rule_id
)
def test_correction_follows_the_accepted_prefix(spec, greedy):
    p, q, drafts = _crafted_round()
    g = torch.Generator().manual_seed(0)
    verdict = verify_round(make_rule(spec), p, q, drafts, torch.tensor([3]), greedy, g)
    assert verdict.accepted.tolist() == [2]
    assert verdict.next_token.tolist() == [4]  # correction from position index 2, not the bonus slot


@pytest.mark.parametrize("greedy", [True, False])
def test_bonus_comes_from_p_after_the_last_draft(greedy):
    p, q, drafts = _crafted_round()
    drafts = torch.tensor([[1, 2, 4]])
    q = torch.stack([_one_hot(1), _one_hot(2), _one_hot(4)])[None]
    verdict = verify_round(VerificationRule(), p, q, drafts, torch.tensor([3]), greedy, torch.Generator())
    assert verdict.accepted.tolist() == [3]
    assert verdict.next_token.tolist() == [6]
    # The bonus is pure verifier for every rule, even one whose target is the drafter.
    verdict = verify_round(EnsembleRule(1.0), p, q, drafts, torch.tensor([3]), greedy, torch.Generator())
    assert verdict.next_token.tolist() == [6]


@pytest.mark.parametrize("greedy", [True, False])
def test_draft_lens_shorter_than_gamma_ignore_later_positions(greedy):
    p, q, drafts = _crafted_round()
    drafts = torch.tensor([[1, 2, 4], [1, 2, 4], [1, 2, 4]])
    q = torch.stack([_one_hot(1), _one_hot(2), _one_hot(4)])[None].expand(3, -1, -1)
    p = p.expand(3, -1, -1)
    verdict = verify_round(
        VerificationRule(), p, q, drafts, torch.tensor([1, 2, 0]), greedy, torch.Generator()
    )
    # Every draft would be accepted; a row accepts only its own drafts and takes the bonus from p[:, len].
    assert verdict.accepted.tolist() == [1, 2, 0]
    assert verdict.next_token.tolist() == [2, 4, 1]


def test_rows_of_a_batch_are_independent():
    """A mixed batch gives each row the verdict it gets alone (greedy, random p/q, random lengths)."""
    g = torch.Generator().manual_seed(11)
    batch, gamma = 16, 4
    p = torch.softmax(torch.randn(batch, gamma + 1, V, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(batch, gamma, V, generator=g) * 3, -1)
    # Drafts: mostly the argmax of p so that prefixes of various lengths are accepted.
    drafts = torch.where(torch.rand(batch, gamma, generator=g) < 0.7, p[:, :gamma].argmax(-1),
                         torch.randint(0, V, (batch, gamma), generator=g))
    lens = torch.randint(0, gamma + 1, (batch,), generator=g)
    rule = EnsembleRule(0.4)
    verdict = verify_round(rule, p, q, drafts, lens, True)
    accepted_values = set()
    for row in range(batch):
        alone = verify_round(
            rule, p[row : row + 1], q[row : row + 1], drafts[row : row + 1], lens[row : row + 1], True
        )
        assert verdict.accepted[row] == alone.accepted[0] and verdict.next_token[row] == alone.next_token[0]
        # And by hand: accepted prefix of drafts equal to argmax π, then argmax π or the bonus argmax p.
        pi = 0.6 * p[row, :gamma] + 0.4 * q[row]
        n = 0
        while n < lens[row] and drafts[row, n] == pi[n].argmax():
            n += 1
        assert verdict.accepted[row] == n
        expected = p[row, n].argmax() if n == lens[row] else pi[n].argmax()
        assert n == lens[row] or n < gamma
        assert verdict.next_token[row] == expected
        accepted_values.add((n, bool(n == lens[row])))
    assert len(accepted_values) >= 3  # the batch mixed rejected and fully accepted rows of various lengths


# ---------------------------------------------------------------------------------------------------------
# Greedy decisions
# ---------------------------------------------------------------------------------------------------------


def _random_batch(seed, batch=64):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, V, generator=g) * 2.5, -1)
    q = torch.softmax(torch.randn(batch, V, generator=g) * 2.5, -1)
    drafts = torch.where(
        torch.rand(batch, generator=g) < 0.5, q.argmax(-1), torch.randint(0, V, (batch,), generator=g)
    )
    return p, q, drafts


@pytest.mark.parametrize("spec", [s for s in RULES if s[0] not in ("lossy", "typical")], ids=_rule_id)
def test_greedy_accepts_iff_draft_is_argmax_target(spec):
    p, q, drafts = _random_batch(21)
    rule = make_rule(spec)
    pi = torch.tensor(np.stack([reference_target(spec, a, b) for a, b in zip(_np(p), _np(q))]))
    expected_accept = drafts == pi.argmax(-1)
    assert torch.equal(rule.greedy_accept(p, q, drafts), expected_accept)
    assert torch.equal(rule.greedy_correction(p, q), pi.argmax(-1))
    # Through verify_round with gamma = 1.
    verdict = verify_round(
        rule, torch.stack([p, p], 1), q[:, None], drafts[:, None], torch.ones(len(p), dtype=torch.long), True
    )
    assert torch.equal(verdict.accepted == 1, expected_accept)
    expected_next = torch.where(expected_accept, p.argmax(-1), pi.argmax(-1))
    assert torch.equal(verdict.next_token, expected_next)


@pytest.mark.parametrize("lenience", [0.1, 0.3, 0.6, 1.0])
def test_lossy_greedy_accepts_iff_p_of_draft_reaches_lenience_times_max(lenience):
    p, q, drafts = _random_batch(22)
    rule = LenientRule(lenience)
    p_draft = p.gather(1, drafts[:, None]).squeeze(1)
    expected = p_draft >= lenience * p.max(-1).values
    got = rule.greedy_accept(p, q, drafts)
    assert torch.equal(got, expected)
    assert 0 < int(got.sum()) < len(got) or lenience == 1.0
    assert torch.equal(rule.greedy_correction(p, q), p.argmax(-1))
    if lenience == 1.0:
        assert torch.equal(got, drafts == p.argmax(-1))


def test_lossy_greedy_lenience_one_draft_accepted_only_if_argmax():
    p = torch.tensor([[0.5, 0.3, 0.2]])
    assert LenientRule(1.0).greedy_accept(p, p, torch.tensor([1])).tolist() == [False]
    assert LenientRule(0.6).greedy_accept(p, p, torch.tensor([1])).tolist() == [True]
    assert LenientRule(0.6).greedy_accept(p, p, torch.tensor([2])).tolist() == [False]


def test_typical_greedy_accepts_iff_p_above_threshold():
    p, q, drafts = _random_batch(23)
    rule = TypicalRule(epsilon=0.2, delta=0.5)
    p_draft = p.gather(1, drafts[:, None]).squeeze(1)
    expected = p_draft > rule.threshold(p).squeeze(-1)
    assert torch.equal(rule.greedy_accept(p, q, drafts), expected)
    assert 0 < int(expected.sum()) < len(expected)
    assert torch.equal(rule.greedy_correction(p, q), p.argmax(-1))


# ---------------------------------------------------------------------------------------------------------
# Warping
# ---------------------------------------------------------------------------------------------------------


def _hf_warp(logits, temperature, top_k, top_p):
    procs = LogitsProcessorList()
    if temperature != 1.0:
        procs.append(TemperatureLogitsWarper(temperature))
    if top_k:
        procs.append(TopKLogitsWarper(top_k))
    if top_p < 1.0:
        procs.append(TopPLogitsWarper(top_p))
    return torch.softmax(procs(None, logits.clone()), dim=-1)


def test_top_k_keeps_exactly_the_k_largest():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(8, 50, generator=g)
    for k in (1, 3, 10):
        probs = Warping(temperature=1.0, top_k=k).probs(logits)
        assert ((probs > 0).sum(-1) == k).all()
        top = torch.topk(logits, k).indices
        assert (probs.gather(-1, top) > 0).all()
        kept = torch.full_like(logits, -math.inf).scatter(-1, top, logits.gather(-1, top))
        torch.testing.assert_close(probs, torch.softmax(kept, -1))
    # top_k ≥ vocabulary size (or 0) is no truncation.
    torch.testing.assert_close(Warping(1.0, top_k=50).probs(logits), torch.softmax(logits, -1))
    torch.testing.assert_close(Warping(1.0, top_k=0).probs(logits), torch.softmax(logits, -1))


def test_top_p_keeps_the_minimal_prefix_reaching_p():
    probs = torch.tensor([0.05, 0.5, 0.15, 0.3])
    logits = probs.log()
    cases = {0.3: {1}, 0.75: {1, 3}, 0.85: {1, 3, 2}, 0.97: {0, 1, 2, 3}}
    for top_p, keep in cases.items():
        warped = Warping(1.0, top_p=top_p).probs(logits)
        assert set((warped > 0).nonzero().squeeze(-1).tolist()) == keep, top_p
        kept_mass = probs[list(keep)].sum()
        torch.testing.assert_close(warped[list(keep)], probs[list(keep)] / kept_mass)
    # Always at least one token.
    assert ((Warping(1.0, top_p=1e-6).probs(logits) > 0).sum() == 1)


@pytest.mark.parametrize(
    "temperature,top_k,top_p",
    [(1.0, 0, 0.9), (0.7, 0, 0.5), (1.3, 20, 1.0), (0.8, 12, 0.8), (2.0, 5, 0.95), (0.5, 0, 1.0)],
)
def test_warping_matches_hf_warpers(temperature, top_k, top_p):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(16, 100, generator=g) * 2
    ours = Warping(temperature, top_k, top_p).probs(logits)
    torch.testing.assert_close(ours, _hf_warp(logits, temperature, top_k, top_p), atol=1e-6, rtol=1e-5)


def test_temperature_scales_logits():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]])
    for t in (0.25, 1.0, 3.0):
        torch.testing.assert_close(Warping(t).probs(logits), torch.softmax(logits / t, -1))
    assert Warping(0.25).probs(logits).max() > Warping(3.0).probs(logits).max()


def test_greedy_warping_is_the_plain_softmax():
    logits = torch.tensor([[1.0, 2.0, 0.5, -1.0]], dtype=torch.float64)
    w = Warping(temperature=0.0, top_k=1, top_p=0.1)
    assert w.greedy and not Warping(0.5).greedy
    out = w.probs(logits)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.softmax(logits.float(), -1))


# ---------------------------------------------------------------------------------------------------------
# Invalid parameters name their config key
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("factory,key", [
    (lambda: LenientRule(0.0), "method.lenience"),
    (lambda: LenientRule(1.5), "method.lenience"),
    (lambda: LenientRule(-0.2), "method.lenience"),
    (lambda: EnsembleRule(-0.1), "method.draft_weight"),
    (lambda: EnsembleRule(1.1), "method.draft_weight"),
    (lambda: EnsembleRule(0.5, pool="geometric"), "method.pool"),
    (lambda: CascadeRule("max", 0.1), "method.deferral"),
    (lambda: CascadeRule("chow", -0.1), "method.alpha"),
    (lambda: CascadeRule("token", 1.5), "method.alpha"),
    (lambda: TypicalRule(epsilon=0.0), "method.epsilon"),
    (lambda: TypicalRule(epsilon=1.5), "method.epsilon"),
    (lambda: TypicalRule(delta=0.0), "method.delta"),
    (lambda: canonical_method("speculative"), "method.name"),
    (lambda: build_rule("lossy", lenience=2.0), "method.lenience"),
])
def test_invalid_parameters_raise_value_error_naming_the_key(factory, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        factory()


def test_build_rule_maps_methods_and_aliases():
    assert build_rule("auto") is None
    assert type(build_rule("sd")) is VerificationRule
    rule = build_rule("sd_static", draft_weight=0.3, pool="log_linear", lenience=0.5)
    assert isinstance(rule, EnsembleRule) and rule.draft_weight == 0.3 and rule.pool == "log_linear"
    rule = build_rule("sd_lossy", lenience=0.5)
    assert isinstance(rule, LenientRule) and rule.lenience == 0.5
    rule = build_rule("spe_cas", deferral="token", alpha=0.2)
    assert isinstance(rule, CascadeRule) and (rule.deferral, rule.alpha) == ("token", 0.2)
    assert isinstance(build_rule("typical", epsilon=0.2), TypicalRule)
    # Defaults are the methods' config defaults (conf/method/*.yaml, tests/test_config.py holds them equal);
    # the lossless setting of each lossy rule is one parameter away.
    assert not build_rule("lossy").lossless and not build_rule("static_ensemble").lossless
    assert (
        build_rule("lossy", lenience=1.0).lossless
        and build_rule("static_ensemble", draft_weight=0.0).lossless
    )
