"""Block verification (Sun et al., ICLR 2025, arXiv 2403.10444) at the distribution level.

What "lossless" means for one round. A round emits a variable-length sequence: the τ accepted drafts and
one more token (0 ≤ τ ≤ L). Its first k tokens are not distributed like the verifier's first k tokens on
their own (a round that stops at τ < k − 1 has no k-th token), so the tests use the validity notion of the
paper: emit one round, then continue *with the verifier itself* up to L + 1 tokens. A valid rule makes that
sequence exactly verifier-distributed, P(z_1..z_{L+1}) = Π_j p(z_j | z_<j), whatever the drafter.

The toy pairs are tables: p(· | prefix) and q(· | prefix) for every prefix over a vocabulary of 3–5
tokens, so p_i genuinely depends on what was drafted before (a context-free pair is one case among
others). Drafts are sampled from q prefix by prefix, and the verifier distributions handed to the rule are
p at the drafted prefixes, exactly what the engine hands it. The exact joint is the product of table
entries. Positions past a row's draft length hold garbage (random tokens and distributions) as in the
engine's padded batches.

Checks: the exact one-round output distribution (enumerating every draft block) equals the verifier joint;
sampled rounds pass a chi-square test against it, with model drafters and with deterministic (one-hot)
drafters, also when the draft length depends on the drafts (``dynamic`` schedule, EOS); the test has the
power to reject the residual bug vllm-ascend fixed (#7807/#7808); expected accepted length ≥ token-wise
by exact computation; a slow per-row transcription of Algorithm 2 agrees sample by sample with the batched
code under shared uniforms; greedy decisions are exactly ``sd``'s; the engine on a tiny model pair
reproduces HF greedy and samples the verifier's joint distribution of the first tokens.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math

import numpy as np
import pytest
import torch
from distribution import chi2_pvalue, exact_first_tokens

from specbench.decoding import (
    DraftSchedule,
    GenerationSettings,
    SpeculativeEngine,
    VerificationRule,
    verify_round,
)
from specbench.decoding.block import BlockRule, block_residual, block_terms, block_verdict
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.verification import one_hot_proposal
from specbench.models.tiny import EOS_ID, PAD_ID, tiny_random_model

N_ROUNDS = 60_000
P_VALUE = 1e-3


# ---------------------------------------------------------------------------------------------------------
# Toy pairs: p and q as tables over prefixes
# ---------------------------------------------------------------------------------------------------------


class ToyPair:
    """p(· | prefix) for prefixes of length 0..G and q(· | prefix) for length 0..G−1, float64 tables.

    ``P[n]`` has shape (V**n, V); a prefix is indexed by its base-V code. ``deterministic`` drafters put
    all of q on one token per prefix (their q is the one-hot that verify_round builds for q=None).
    """

    def __init__(
        self,
        seed: int,
        vocab: int,
        gamma: int,
        *,
        context_free: bool = False,
        truncate: bool = False,
        deterministic: bool = False,
        peaked: float = 2.0,
    ):
        rng = np.random.default_rng(seed)
        self.vocab, self.gamma, self.deterministic = vocab, gamma, deterministic

        def table(n_prefix_len: int, zeros: bool) -> torch.Tensor:
            rows = 1 if context_free else vocab ** n_prefix_len
            logits = rng.normal(size=(rows, vocab)) * peaked
            if zeros:  # top-k style truncation: drop one token (never the top one) in about half of the rows
                drop = rng.random(rows) < 0.5
                order = np.argsort(logits, axis=1)
                logits[np.arange(rows)[drop], order[drop, 0]] = -np.inf
            probs = np.exp(logits - logits.max(1, keepdims=True))
            probs /= probs.sum(1, keepdims=True)
            if context_free:
                probs = np.repeat(probs, vocab ** n_prefix_len, axis=0)
            return torch.tensor(probs, dtype=torch.float64)

        self.P = [table(n, truncate) for n in range(gamma + 1)]
        self.Q = [table(n, truncate) for n in range(gamma)]
        if deterministic:
            # A deterministic proposal: sometimes the verifier's favourite, sometimes not, sometimes p(x) = 0.
            self.Q = [
                torch.nn.functional.one_hot(
                    torch.multinomial(q, 1, generator=torch.Generator().manual_seed(seed + n)).squeeze(1),
                    vocab,
                ).double()
                for n, q in enumerate(self.Q)
            ]

    def code(self, prefix) -> int:
        value = 0
        for token in prefix:
            value = value * self.vocab + int(token)
        return value

    def p(self, prefix) -> np.ndarray:
        return self.P[len(prefix)][self.code(prefix)].numpy()

    def q(self, prefix) -> np.ndarray:
        return self.Q[len(prefix)][self.code(prefix)].numpy()

    def joint(self, length: int) -> np.ndarray:
        """Exact verifier probability of every sequence of ``length`` tokens, indexed by its code."""
        probs = np.ones(1)
        for n in range(length):
            probs = (probs[:, None] * self.P[n].numpy()).reshape(-1)
        return probs

    def round_inputs(self, drafts: torch.Tensor, lens: torch.Tensor, garbage: torch.Generator):
        """p (N, G+1, V) and q (N, G, V) at the drafted prefixes; garbage past each row's length."""
        n, gamma = drafts.shape
        codes = torch.zeros(n, dtype=torch.long)
        p_rows, q_rows = [], []
        for i in range(gamma + 1):
            p_rows.append(self.P[i][codes])
            if i < gamma:
                q_rows.append(self.Q[i][codes])
                codes = codes * self.vocab + drafts[:, i]
        p, q = torch.stack(p_rows, 1), torch.stack(q_rows, 1)
        noise_p = torch.softmax(torch.randn(p.shape, generator=garbage, dtype=torch.float64) * 2, -1)
        noise_q = torch.softmax(torch.randn(q.shape, generator=garbage, dtype=torch.float64) * 2, -1)
        positions = torch.arange(gamma + 1)
        p = torch.where((positions[None, :] > lens[:, None])[..., None], noise_p, p)
        q = torch.where((positions[None, :gamma] >= lens[:, None])[..., None], noise_q, q)
        return p, q

    def sample_drafts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        codes = torch.zeros(n, dtype=torch.long)
        drafts = []
        for i in range(self.gamma):
            token = torch.multinomial(self.Q[i][codes], 1, generator=generator).squeeze(1)
            drafts.append(token)
            codes = codes * self.vocab + token
        return torch.stack(drafts, 1)

    def extend_with_verifier(self, drafts, accepted, next_token, generator) -> torch.Tensor:
        """Codes of the G+1-token sequences: the round's output continued by sampling the verifier."""
        n = drafts.shape[0]
        codes = torch.zeros(n, dtype=torch.long)
        for j in range(self.gamma + 1):
            continued = torch.multinomial(self.P[j][codes], 1, generator=generator).squeeze(1)
            token = torch.where(j == accepted, next_token, continued)
            if j < self.gamma:
                token = torch.where(j < accepted, drafts[:, j], token)
            codes = codes * self.vocab + token
        return codes


def one_round_then_verifier(pair: ToyPair, rule, lens: torch.Tensor, seed: int) -> np.ndarray:
    """Counts of the G+1-token sequences over len(lens) sampled rounds (one row per round)."""
    g = torch.Generator().manual_seed(seed)
    drafts = pair.sample_drafts(len(lens), g)
    positions = torch.arange(pair.gamma)
    drafts = torch.where(
        positions[None] < lens[:, None], drafts, torch.randint(0, pair.vocab, drafts.shape, generator=g)
    )
    p, q = pair.round_inputs(drafts, lens, g)
    verdict = verify_round(rule, p, None if pair.deterministic else q, drafts, lens, False, g)
    assert ((verdict.accepted >= 0) & (verdict.accepted <= lens)).all()
    codes = pair.extend_with_verifier(drafts, verdict.accepted, verdict.next_token, g)
    return np.bincount(codes.numpy(), minlength=pair.vocab ** (pair.gamma + 1)).astype(np.float64)


def assert_matches(counts: np.ndarray, expected: np.ndarray, label="") -> None:
    """Chi-square goodness of fit (tests/distribution.py); impossible sequences must never be emitted."""
    assert counts[expected <= 1e-12].sum() == 0, (label, "an impossible sequence was emitted")
    pvalue = chi2_pvalue(counts, np.where(expected <= 1e-12, 0.0, expected))
    assert pvalue > P_VALUE, (label, pvalue)


# ---------------------------------------------------------------------------------------------------------
# Exact one-round output distribution from the library's ρ, h and residual (enumerating all draft blocks)
# ---------------------------------------------------------------------------------------------------------


def all_blocks(pair: ToyPair, length_of=None):
    """Every distinct drafted block (as its row length L and tokens) with its drafter probability."""
    seen = {}
    for block in itertools.product(range(pair.vocab), repeat=pair.gamma):
        length = pair.gamma if length_of is None else length_of(pair, block)
        prefix = block[:length]
        if prefix in seen:
            continue
        prob = math.prod(pair.q(prefix[:i])[prefix[i]] for i in range(length))
        if prob > 0:
            seen[prefix] = prob
    return seen


def exact_round_then_verifier(pair: ToyPair, length_of=None, residual=block_residual) -> np.ndarray:
    """Exact distribution of the G+1-token sequence 'one block-verified round, then the verifier'.

    P(τ = i | block) = h_i Π_{j>i} (1 − h_j) (h_0 = 1) from the library's thresholds; the emitted token from
    the library's residual (or ``residual``, to evaluate a wrong variant) or the bonus distribution.
    """
    blocks = all_blocks(pair, length_of)
    prefixes = list(blocks)
    gamma, vocab = pair.gamma, pair.vocab
    lens = torch.tensor([len(b) for b in prefixes])
    drafts = torch.tensor([list(b) + [0] * (gamma - len(b)) for b in prefixes])
    p, q = pair.round_inputs(drafts, lens, torch.Generator().manual_seed(0))
    if pair.deterministic:
        q = torch.where((torch.arange(gamma)[None, :] < lens[:, None])[..., None],
                        one_hot_proposal(drafts, vocab, torch.float64), q)
    terms = block_terms(p, q, drafts, lens)
    out = np.zeros(vocab ** (gamma + 1))
    for row, prefix in enumerate(prefixes):
        length = len(prefix)
        h = terms.threshold[row].numpy()
        for tau in range(length + 1):
            stay = (h[tau - 1] if tau > 0 else 1.0) * math.prod(
                1 - h[j - 1] for j in range(tau + 1, length + 1)
            )
            if tau == length:
                emitted = p[row, length].numpy()
            else:
                emitted = residual(
                    p[row : row + 1, tau], q[row : row + 1, tau], terms.prefix_ratio[row : row + 1, tau]
                )
                emitted = emitted[0].numpy()
            head = blocks[prefix] * stay
            for y in np.nonzero(emitted)[0]:
                seq = prefix[:tau] + (int(y),)
                tails = itertools.product(range(vocab), repeat=gamma - tau)
                for tail in tails:
                    full = seq + tail
                    cont = math.prod(pair.p(full[:j])[full[j]] for j in range(tau + 1, gamma + 1))
                    out[pair.code(full)] += head * emitted[y] * cont
    return out


def stop_after_unlikely_draft(pair: ToyPair, block) -> int:
    """Draft length of schedule=dynamic: stop after a draft the drafter gave probability < 0.4."""
    for i in range(pair.gamma):
        if pair.q(block[:i])[block[i]] < 0.4:
            return i + 1
    return pair.gamma


def stop_at_token_zero(pair: ToyPair, block) -> int:
    """Draft length when token 0 is EOS: drafting stops after it."""
    return next((i + 1 for i, t in enumerate(block) if t == 0), pair.gamma)


EXACT_CASES = {
    "v3-g2": (ToyPair(1, 3, 2), None),
    "v3-g3-truncated": (ToyPair(2, 3, 3, truncate=True), None),
    "v4-g3-peaked": (ToyPair(3, 4, 3, peaked=4.0), None),
    "v5-g2-context-free": (ToyPair(4, 5, 2, context_free=True), None),
    "v3-g3-deterministic": (ToyPair(5, 3, 3, deterministic=True), None),
    "v4-g2-deterministic-truncated": (ToyPair(6, 4, 2, deterministic=True, truncate=True), None),
    "v3-g3-dynamic-stop": (ToyPair(7, 3, 3), stop_after_unlikely_draft),
    "v3-g3-eos-stop": (ToyPair(8, 3, 3, truncate=True), stop_at_token_zero),
}


@pytest.mark.parametrize("case", list(EXACT_CASES))
def test_exact_round_output_is_the_verifier_joint(case):
    pair, length_of = EXACT_CASES[case]
    exact = exact_round_then_verifier(pair, length_of)
    np.testing.assert_allclose(exact, pair.joint(pair.gamma + 1), atol=1e-12, rtol=0)


def test_exact_cases_are_not_trivial():
    """The pairs above disagree (else any rule is exact) and the stopping rules give several lengths."""
    for name, (pair, length_of) in EXACT_CASES.items():
        gaps = [0.5 * (pair.P[n] - pair.Q[n]).abs().sum(-1).max().item() for n in range(pair.gamma)]
        assert max(gaps) > 0.2, name
        if length_of is not None:
            lengths = {len(b) for b in all_blocks(pair, length_of)}
            assert len(lengths) >= 2, name


def tokenwise_residual(p_stop, q_stop, rho_stop):
    """The bug vllm-ascend #7807 reported: block acceptance with the token-wise residual max(0, p − q)."""
    return block_residual(p_stop, q_stop, torch.ones_like(rho_stop))


# A pair on which the bug is visible: drafts with p < q early in the block make ρ_τ < 1 at the residual.
BUG_PAIR = ToyPair(1, 3, 3, truncate=True, peaked=1.0)


def test_the_tokenwise_residual_bug_is_not_exact():
    wrong = exact_round_then_verifier(BUG_PAIR, residual=tokenwise_residual)
    assert 0.5 * np.abs(wrong - BUG_PAIR.joint(BUG_PAIR.gamma + 1)).sum() > 0.02
    np.testing.assert_allclose(
        exact_round_then_verifier(BUG_PAIR), BUG_PAIR.joint(BUG_PAIR.gamma + 1), atol=1e-12
    )


# ---------------------------------------------------------------------------------------------------------
# Sampled rounds: chi-square against the verifier joint
# ---------------------------------------------------------------------------------------------------------

# Seeds picked so that the residual bug below moves the output by TV ≥ 0.02 on every case (checked below):
# with 60k rounds the chi-square sees a wrong rule, not only a broken one.
SAMPLED_CASES = {
    "v3-g2": ToyPair(31, 3, 2),
    "v4-g2-truncated": ToyPair(27, 4, 2, truncate=True),
    "v5-g2-context-free": ToyPair(23, 5, 2, context_free=True),
    "v3-g3-truncated": ToyPair(1, 3, 3, truncate=True, peaked=1.0),
}


def mixed_lengths(pair: ToyPair, n: int, seed: int) -> torch.Tensor:
    """Mostly full blocks, some shorter ones (0 = no draft): a batch mixing the rows of several rounds."""
    g = torch.Generator().manual_seed(seed)
    lens = torch.full((n,), pair.gamma)
    short = torch.rand(n, generator=g) < 0.3
    return torch.where(short, torch.randint(0, pair.gamma, (n,), generator=g), lens)


@pytest.mark.parametrize("case", list(SAMPLED_CASES))
def test_sampled_rounds_match_the_verifier_joint(case):
    pair = SAMPLED_CASES[case]
    counts = one_round_then_verifier(pair, BlockRule(), mixed_lengths(pair, N_ROUNDS, 1), seed=2)
    assert_matches(counts, pair.joint(pair.gamma + 1), label=case)


@pytest.mark.parametrize("case", ["v3-g3-deterministic", "v4-g2-deterministic-truncated"])
def test_deterministic_drafts_sampled_match_the_verifier_joint(case):
    """q = None: verify_round makes q one-hot on each draft (n-gram, suffix, greedy drafters)."""
    pair = EXACT_CASES[case][0]
    counts = one_round_then_verifier(pair, BlockRule(), mixed_lengths(pair, N_ROUNDS, 3), seed=4)
    assert_matches(counts, pair.joint(pair.gamma + 1), label=case)


@pytest.mark.parametrize("case", list(SAMPLED_CASES))
def test_sampled_cases_would_expose_the_residual_bug(case):
    pair = SAMPLED_CASES[case]
    wrong = exact_round_then_verifier(pair, residual=tokenwise_residual)
    assert 0.5 * np.abs(wrong - pair.joint(pair.gamma + 1)).sum() > 0.02


def test_chi_square_rejects_the_tokenwise_residual_bug():
    """Power: the same samples fail against the distribution the buggy rule would produce."""
    pair = BUG_PAIR
    counts = one_round_then_verifier(pair, BlockRule(), torch.full((N_ROUNDS,), pair.gamma), seed=5)
    assert_matches(counts, pair.joint(pair.gamma + 1))
    wrong = exact_round_then_verifier(pair, residual=tokenwise_residual)
    impossible_for_the_bug = counts[wrong <= 1e-12].sum() > 0
    assert impossible_for_the_bug or chi2_pvalue(counts, wrong) < 1e-6


# ---------------------------------------------------------------------------------------------------------
# Expected accepted length: never below token-wise (exact computation, all draft blocks enumerated)
# ---------------------------------------------------------------------------------------------------------


def expected_accepted(pair: ToyPair) -> tuple[float, float]:
    """E[τ] of block verification (library thresholds) and of token-wise SD (from the formula)."""
    blocks = all_blocks(pair)
    prefixes = list(blocks)
    drafts = torch.tensor(prefixes)
    lens = torch.full((len(prefixes),), pair.gamma)
    p, q = pair.round_inputs(drafts, lens, torch.Generator().manual_seed(0))
    h = block_terms(p, q, drafts, lens).threshold.numpy()
    block, tokenwise = 0.0, 0.0
    for row, prefix in enumerate(prefixes):
        weight = blocks[prefix]
        block += weight * sum(
            i * h[row, i - 1] * math.prod(1 - h[row, j - 1] for j in range(i + 1, pair.gamma + 1))
            for i in range(1, pair.gamma + 1)
        )
        ratios = [
            min(1.0, pair.p(prefix[:i])[prefix[i]] / pair.q(prefix[:i])[prefix[i]]) for i in range(pair.gamma)
        ]
        tokenwise += weight * sum(math.prod(ratios[:n]) for n in range(1, pair.gamma + 1))
    return block, tokenwise


def test_paper_example_accepted_lengths():
    """Sun et al. §2: i.i.d. p = (1/3, 2/3), q = (2/3, 1/3), γ = 2: token-wise 10/9, block 11/9."""
    pair = ToyPair(0, 2, 2, context_free=True)
    pair.P = [torch.tensor([[1 / 3, 2 / 3]], dtype=torch.float64).expand(2 ** n, 2) for n in range(3)]
    pair.Q = [torch.tensor([[2 / 3, 1 / 3]], dtype=torch.float64).expand(2 ** n, 2) for n in range(2)]
    block, tokenwise = expected_accepted(pair)
    assert tokenwise == pytest.approx(10 / 9, abs=1e-12)
    assert block == pytest.approx(11 / 9, abs=1e-12)


RANDOM_PAIRS = [
    pytest.param(seed, vocab, gamma, kind, id=f"s{seed}-v{vocab}-g{gamma}-{kind}")
    for seed, (vocab, gamma, kind) in enumerate(
        [(v, g, k) for v in (2, 3, 4) for g in (1, 2, 3, 4) for k in ("model", "truncated", "context-free",
                                                                        "deterministic")
         if v ** g <= 81]
    )
]


@pytest.mark.parametrize("seed,vocab,gamma,kind", RANDOM_PAIRS)
def test_expected_accepted_length_never_below_tokenwise(seed, vocab, gamma, kind):
    pair = ToyPair(
        100 + seed,
        vocab,
        gamma,
        truncate=kind == "truncated",
        context_free=kind == "context-free",
        deterministic=kind == "deterministic",
    )
    block, tokenwise = expected_accepted(pair)
    assert block >= tokenwise - 1e-12
    if gamma == 1 or kind == "deterministic":
        # One draft: the two rules are the same. Deterministic drafts: token-wise already reaches the bound
        # P(τ ≥ n) ≤ Π p(x_j) every valid rule obeys, so block verification can only tie.
        assert block == pytest.approx(tokenwise, abs=1e-12)


def test_block_gains_on_most_random_model_pairs():
    gains = []
    for seed in range(20):
        pair = ToyPair(300 + seed, 3, 3, peaked=1.5)
        block, tokenwise = expected_accepted(pair)
        gains.append(block - tokenwise)
    assert min(gains) >= -1e-12 and sum(g > 1e-3 for g in gains) >= 15, gains


# ---------------------------------------------------------------------------------------------------------
# Brute-force reference: Algorithm 2 transcribed for one row, replayed with the same uniforms
# ---------------------------------------------------------------------------------------------------------


def reference_round(p_rows, q_rows, drafts, length, eta, u):
    """Sun et al. Algorithm 2 for one row in plain Python floats; returns (τ, emitted token)."""
    vocab = len(p_rows[0])
    rho = [1.0]
    for i in range(length):
        x = drafts[i]
        ratio = p_rows[i][x] / q_rows[i][x] if q_rows[i][x] > 0 else 1.0
        rho.append(min(1.0, rho[-1] * ratio))
    tau = 0
    for i in range(1, length + 1):
        if i < length:
            mass = sum(max(0.0, rho[i] * p_rows[i][x] - q_rows[i][x]) for x in range(vocab))
            denominator = mass + 1.0 - rho[i]
            h = mass / denominator if denominator > 0 else 1.0
        else:
            h = rho[length]
        if eta[i - 1] < h:
            tau = i
    if tau == length:
        dist = list(p_rows[length])
    else:
        dist = [max(0.0, rho[tau] * p_rows[tau][x] - q_rows[tau][x]) for x in range(vocab)]
        if sum(dist) <= 1e-12:
            dist = list(p_rows[tau])
    target, cumulative = u * sum(dist), 0.0
    for token, weight in enumerate(dist):
        cumulative += weight
        if cumulative > target:
            return tau, token
    return tau, vocab - 1


def random_round(seed: int, batch: int, gamma: int, vocab: int):
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=g, dtype=torch.float64) * 2, -1)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g, dtype=torch.float64) * 2, -1)
    # Truncated supports in some rows, p = q at some positions, one-hot (deterministic) q in others.
    top = torch.nn.functional.one_hot(p.argmax(-1), vocab).bool()
    p = torch.where((torch.rand(batch, gamma + 1, vocab, generator=g) < 0.15) & ~top, 0.0, p)
    p = p / p.sum(-1, keepdim=True)
    same = torch.rand(batch, gamma, 1, generator=g) < 0.1
    q = torch.where(same, p[:, :gamma], q)
    drafts = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).reshape(batch, gamma)
    one_hot = torch.rand(batch, 1, 1, generator=g) < 0.25
    q = torch.where(one_hot, one_hot_proposal(drafts, vocab, torch.float64), q)
    lens = torch.randint(0, gamma + 1, (batch,), generator=g)
    return p, q, drafts, lens, g


def test_batched_rule_matches_the_reference_sample_by_sample():
    batch, gamma, vocab = 3000, 5, 6
    p, q, drafts, lens, g = random_round(21, batch, gamma, vocab)
    eta = torch.rand(batch, gamma, generator=g, dtype=torch.float64)
    u = torch.rand(batch, generator=g, dtype=torch.float64)
    verdict = block_verdict(p, q, drafts, lens, eta, u)
    taus = []
    for row in range(batch):
        length = int(lens[row])
        expected = reference_round(p[row].tolist(), q[row].tolist(), drafts[row].tolist(), length,
                                   eta[row].tolist(), float(u[row]))
        assert (int(verdict.accepted[row]), int(verdict.next_token[row])) == expected, row
        taus.append((expected[0], length))
    # Non-vacuous: every accepted length occurs, and accepted prefixes past a rejection (the block gain) too.
    assert {t for t, _ in taus} == set(range(gamma + 1))
    assert any(t < length for t, length in taus) and any(t == length > 0 for t, length in taus)


def test_block_accepts_past_a_tokenwise_rejection():
    """The defining difference: block verification can keep x_1 x_2 although u_1 would reject x_1."""
    p, q, drafts, lens, g = random_round(22, 4000, 3, 4)
    eta = torch.rand(4000, 3, generator=g, dtype=torch.float64)
    block = block_verdict(p, q, drafts, lens, eta, torch.rand(4000, generator=g, dtype=torch.float64))
    a = VerificationRule().acceptance(p[:, :3], q).gather(-1, drafts.unsqueeze(-1)).squeeze(-1)
    first_rejected = eta[:, 0] >= a[:, 0]
    assert bool((first_rejected & (block.accepted >= 2)).any())


def test_verify_block_draws_its_uniforms_from_the_generator():
    p, q, drafts, lens, _ = random_round(23, 500, 4, 5)
    got = BlockRule().verify_block(p, q, drafts, lens, False, torch.Generator().manual_seed(9))
    g = torch.Generator().manual_seed(9)
    eta = torch.rand(500, 4, generator=g, dtype=torch.float64)
    expected = block_verdict(p, q, drafts, lens, eta, torch.rand(500, generator=g, dtype=torch.float64))
    assert torch.equal(got.accepted, expected.accepted) and torch.equal(got.next_token, expected.next_token)


def test_one_draft_rounds_are_tokenwise_decision_for_decision():
    """γ = 1: h_1 = ρ_1 = min(1, p/q) and the residual is max(0, p − q): the same rule as exact SD."""
    p, q, drafts, lens, _ = random_round(24, 5000, 1, 5)
    lens = torch.ones_like(lens)
    block = verify_round(BlockRule(), p, q, drafts, lens, False, torch.Generator().manual_seed(3))
    sd = verify_round(VerificationRule(), p, q, drafts, lens, False, torch.Generator().manual_seed(3))
    assert torch.equal(block.accepted, sd.accepted)
    assert 0 < int(block.accepted.sum()) < len(lens)


def test_degenerate_rows_stay_finite():
    """p = q exactly (the 0/0 threshold), p(x) = 0 for a one-hot draft (ρ = 0), no drafts at all."""
    vocab = 4
    p = torch.tensor(
        [[[0.1, 0.2, 0.3, 0.4]] * 3, [[0.0, 0.5, 0.5, 0.0]] * 3, [[0.25] * 4] * 3], dtype=torch.float64
    )
    q = p[:, :2].clone()
    drafts = torch.tensor([[3, 3], [0, 1], [2, 2]])
    q[1] = one_hot_proposal(drafts[1:2], vocab, torch.float64)[0]
    lens = torch.tensor([2, 2, 0])
    terms = block_terms(p, q, drafts, lens)
    assert torch.isfinite(terms.prefix_ratio).all() and torch.isfinite(terms.threshold).all()
    assert terms.threshold[0].tolist() == [1.0, 1.0]  # q = p: every draft is kept
    assert terms.prefix_ratio[1, 1] == 0.0 and terms.threshold[1].tolist() == [0.0, 0.0]
    verdict = verify_round(BlockRule(), p, q, drafts, lens, False, torch.Generator().manual_seed(0))
    assert verdict.accepted.tolist() == [2, 0, 0]
    assert verdict.next_token[1] in (1, 2)  # never the zero-probability draft 0 nor token 3


# ---------------------------------------------------------------------------------------------------------
# Greedy: exactly sd's decisions
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("deterministic", [False, True])
def test_greedy_equals_sd_on_batches(deterministic):
    g = torch.Generator().manual_seed(31)
    batch, gamma, vocab = 256, 6, 7
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=g) * 3, -1)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=g) * 3, -1)
    drafts = torch.where(torch.rand(batch, gamma, generator=g) < 0.75, p[:, :gamma].argmax(-1),
                         torch.randint(0, vocab, (batch, gamma), generator=g))
    lens = torch.randint(0, gamma + 1, (batch,), generator=g)
    q_in = None if deterministic else q
    block = verify_round(BlockRule(), p, q_in, drafts, lens, True)
    sd = verify_round(VerificationRule(), p, q_in, drafts, lens, True)
    assert torch.equal(block.accepted, sd.accepted) and torch.equal(block.next_token, sd.next_token)
    assert len(set(block.accepted.tolist())) >= 4


# ---------------------------------------------------------------------------------------------------------
# End to end on a tiny model pair
# ---------------------------------------------------------------------------------------------------------

PROMPTS = [[65], [72, 101, 108], [1, 2, 3, 4, 5, 6], [200, 17, 99, 3, 45, 250, 11, 8, 77]]


@functools.cache
def tiny_verifier():
    return tiny_random_model("llama", seed=0)


@functools.cache
def tiny_drafter(kind: str):
    if kind == "independent":
        return tiny_random_model("llama", seed=1, num_layers=1)
    model = copy.deepcopy(tiny_verifier())
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=g) * 0.01)
    return model


def engine(kind: str, schedule: DraftSchedule, eos=(EOS_ID,), **settings) -> SpeculativeEngine:
    return SpeculativeEngine(
        tiny_verifier(),
        ModelDrafter(tiny_drafter(kind)),
        rule=BlockRule(),
        schedule=schedule,
        settings=GenerationSettings(**settings),
        eos_token_ids=eos,
        pad_token_id=PAD_ID,
    )


@pytest.mark.parametrize("schedule", [DraftSchedule("constant", gamma=4), DraftSchedule("dynamic", gamma=4,
                                                                                         max_gamma=6)],
                         ids=["constant", "dynamic"])
def test_engine_greedy_equals_the_verifier_greedy(schedule):
    model = tiny_verifier()
    results = engine("perturbed", schedule, max_new_tokens=20).generate(PROMPTS)
    drafted = accepted = 0
    for prompt, result in zip(PROMPTS, results):
        hf = model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=20,
            eos_token_id=[EOS_ID],
            pad_token_id=PAD_ID,
        )
        assert result.output_ids == hf[0, len(prompt):].tolist()
        drafted += sum(r.drafted for r in result.rounds)
        accepted += sum(r.accepted for r in result.rounds)
    assert 0 < accepted < drafted


@pytest.mark.parametrize("kind,schedule", [("perturbed", DraftSchedule("constant", gamma=4)),
                                           ("independent", DraftSchedule("constant", gamma=3)),
                                           ("perturbed", DraftSchedule("dynamic", gamma=4, max_gamma=5))],
                         ids=["perturbed-constant", "independent-constant", "perturbed-dynamic"])
def test_engine_sampling_matches_the_verifier_joint_of_the_first_tokens(kind, schedule):
    """Multi-round sampling (max_new_tokens = 3 spans rounds whenever a draft is rejected early)."""
    prompt, rows, top_k = PROMPTS[1], 4000, 10
    results = engine(
        kind, schedule, temperature=1.0, top_k=top_k, max_new_tokens=3, seed=1234, eos=()
    ).generate([prompt] * rows)
    outs = np.array([r.output_ids for r in results])
    drafted = sum(r.drafted for res in results for r in res.rounds)
    accepted = sum(r.accepted for res in results for r in res.rounds)
    assert 0 < accepted < drafted
    assert np.mean([len(res.rounds) for res in results]) > 1.2  # several rounds per sample
    _p1, joint = exact_first_tokens(tiny_verifier(), prompt, top_k)
    vocab = joint.shape[0]
    counts12 = np.bincount(outs[:, 0] * vocab + outs[:, 1], minlength=vocab * vocab).astype(np.float64)
    assert chi2_pvalue(counts12, joint.reshape(-1)) > P_VALUE
