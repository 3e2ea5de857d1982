"""Rollouts of the DIVERSED policy: autoregressive sampling from π_t = pool(p_t, q_t, w_t).

The rollout decodes through the same objects the engine uses: the verifier's :class:`CachedModel` and any
:class:`~specbench.decoding.protocol.Drafter` that exposes hidden states (a model drafter, an SD²-steered
drafter, an EAGLE-3 head). Each step is one engine round with a one-token cap: the drafter proposes (its q_t
and hidden state at the position), the verifier scores the last token (p_t, its hidden state, and the taps the
drafter reads), the head gives w_t, the next token is drawn from π_t, and the drafter is told that its draft
was not kept and that the new token follows (``accepted = 0``; the drafted token itself is never used). Both
LMs run without grad; the head's graph reaches ``log_probs``, ``agreement`` and ``weights``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specbench.decoding.cache import CachedModel
from specbench.decoding.diversed import WeightHead
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, VerifierView
from specbench.decoding.rules import pool_distributions
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping, sample

_TINY = 1e-30


@dataclass
class Rollout:
    """R rollouts of at most T tokens from the pooled policy.

    ``log_probs``, ``agreement`` and ``weights`` carry the head's graph; positions past a row's end
    (after its EOS or the token budget) are False in ``mask``.
    """

    tokens: torch.Tensor  # (R, T) long, pad after the end
    mask: torch.Tensor  # (R, T) bool
    log_probs: torch.Tensor  # (R, T) log π_t(y_t)
    agreement: torch.Tensor  # (R, T) 1 − TV(q_t, π_t): acceptance probability of a drafted token vs π_t
    weights: torch.Tensor  # (R, T) w_draft,t
    verifier_agreement: torch.Tensor  # (R, T) 1 − TV(p_t, q_t) (no grad): sd's acceptance at the same step
    verifier_log_probs: torch.Tensor  # (R, T) log p_t(y_t) under the untempered verifier (no grad)
    expected_verifier_log_probs: torch.Tensor  # (R, T) E_{y ~ π_t} log p_t(y), with the head's graph
    drafting_cost: torch.Tensor  # (R, T) Σ (p_t − q_t) log p_t: likelihood lost per unit of w_t (no grad)

    def mean_verifier_log_prob(self) -> list[float]:
        """Per rollout, the verifier's mean log-likelihood per token of what was sampled."""
        mask = self.mask.to(self.verifier_log_probs.dtype)
        return ((self.verifier_log_probs * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1.0)).tolist()

    def outputs(self) -> list[list[int]]:
        return [row[: int(n)] for row, n in zip(self.tokens.tolist(), self.mask.sum(dim=1).tolist())]


def pooled_log_prob_and_agreement(
    p: torch.Tensor, q: torch.Tensor, w: torch.Tensor, tokens: torch.Tensor, pool: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """log π(y) and 1 − TV(q, π) for π = pool(p, q, w), differentiable in ``w`` (shape (...,)); p, q (..., V).

    The linear pool uses closed forms (π(y) = (1−w)p(y) + wq(y); 1 − TV(q, π) = 1 − (1−w)·TV(p, q)), so
    its graph holds scalars per token, not vocabulary-sized tensors.
    """
    p_y = p.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    if pool == "linear":
        q_y = q.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        tv = 0.5 * (p - q).abs().sum(dim=-1)
        pi_y = (1.0 - w) * p_y + w * q_y
        return torch.log(pi_y.clamp(min=_TINY)), 1.0 - (1.0 - w) * tv
    pi = pool_distributions(p, q, w.unsqueeze(-1), pool)
    pi_y = pi.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return torch.log(pi_y.clamp(min=_TINY)), 1.0 - 0.5 * (q - pi).abs().sum(dim=-1)


def expected_log_likelihood(
    log_p: torch.Tensor, p: torch.Tensor, q: torch.Tensor, w: torch.Tensor, pool: str
) -> torch.Tensor:
    """E_{y ~ π} log p(y) for π = pool(p, q, w) (log_p: the untempered verifier's log-probabilities; p, q the
    warped distributions the policy pools), differentiable in ``w`` (...,). Linear pool:
    (1 − w)·Σ p log p + w·Σ q log p, so the graph holds scalars per token."""
    log_p = log_p.clamp(min=-1e4)  # a token with p = 0 under top-k warping carries no weight in p anyway
    if pool == "linear":
        return (1.0 - w) * (p * log_p).sum(dim=-1) + w * (q * log_p).sum(dim=-1)
    return (pool_distributions(p, q, w.unsqueeze(-1), pool) * log_p).sum(dim=-1)


def _verifier_step(
    verifier: CachedModel, drafter: Drafter, tokens, valid
) -> tuple[torch.Tensor, VerifierView]:
    """One verifier forward with its final-normed hidden state and the taps the drafter reads."""
    out = verifier.forward(tokens, valid, output_hidden=True, output_taps=drafter.needs.taps)
    return out.logits, VerifierView(tokens, valid, out.hidden, out.taps)


def _prefilled(
    verifier: CachedModel, drafter: Drafter, prompts: Sequence[Sequence[int]], max_new_tokens: int,
    eos_ids: Sequence[int], pad_id: int,
) -> BatchState:
    """The prompts' batch state, with the verifier and the drafter reset and prefilled on all but each
    prompt's last token."""
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    if drafter.hidden_size is None:
        raise ValueError(
            f"DIVERSED reads the drafter's hidden states, which drafter {drafter.name!r} does not have"
        )
    state = BatchState.create(prompts, 1, max_new_tokens, eos_ids, pad_id, verifier.device)
    verifier.reset(state.size)
    drafter.reset(state.size)
    view = None
    if state.tokens.shape[1] > 1:
        _, view = _verifier_step(verifier, drafter, state.tokens[:, :-1], state.token_valid[:, :-1])
    drafter.prefill(state, view)
    return state


def rollout(
    head: WeightHead,
    verifier: CachedModel,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    warping: Warping,
    pool: str = "linear",
    eos_ids: Sequence[int] = (),
    pad_id: int = 0,
    generator: torch.Generator | None = None,
) -> Rollout:
    """Decode ``prompts`` (a batch of token id lists) autoregressively from π_t = pool(p_t, q_t, w_t).

    Tokens are sampled from π with ``generator`` (``warping.greedy``: argmax π). The drafter's own draws
    use a generator of their own, so the policy's random stream is the same for every drafter.
    """
    device = verifier.device
    state = _prefilled(verifier, drafter, prompts, max_new_tokens, eos_ids, pad_id)
    rows = state.size
    sampler = DraftSampler(
        warping, torch.Generator(device=device).manual_seed(0), DraftSchedule("constant", gamma=1)
    )
    caps = torch.ones(rows, dtype=torch.long, device=device)
    never_kept = torch.zeros(rows, dtype=torch.long, device=device)
    alive = torch.ones(rows, dtype=torch.bool, device=device)
    out_tokens, masks, log_probs, agreements, weights, sd_agreements, verifier_lps = (
        [], [], [], [], [], [], []
    )  # fmt: skip
    expected_lps, costs = [], []
    for step in range(max_new_tokens):
        proposal = drafter.propose(state, caps, sampler, want_hidden=True)
        if proposal.q is None or not bool((proposal.lengths == 1).all()):
            raise ValueError(
                f"drafter {drafter.name!r} gave no distribution for every row (DIVERSED rollouts need q and "
                "the drafter's hidden state at every position; an EAGLE-3 head needs prompts of at least 2 "
                "tokens)"
            )
        last = state.last_tokens().unsqueeze(1)
        logits, view = _verifier_step(verifier, drafter, last, torch.ones_like(last, dtype=torch.bool))
        with torch.no_grad():
            p = warping.probs(logits[:, 0])
            q = proposal.q[:, 0].to(p.device)
        w = head(proposal.hidden[:, 0], view.hidden[:, 0]).to(device)
        with torch.no_grad():
            pi = pool_distributions(p, q, w.detach().unsqueeze(-1), pool)
            token = pi.argmax(dim=-1) if warping.greedy else sample(pi, generator)
            token = torch.where(alive, token, torch.full_like(token, pad_id))
            sd_agreements.append(1.0 - 0.5 * (p - q).abs().sum(dim=-1))
            verifier_lps.append(
                torch.log_softmax(logits[:, 0], dim=-1).gather(-1, token.unsqueeze(-1)).squeeze(-1)
            )
        log_prob, agreement = pooled_log_prob_and_agreement(p, q, w, token, pool)
        log_p = torch.log_softmax(logits[:, 0], dim=-1)
        expected_lps.append(expected_log_likelihood(log_p, p, q, w, pool))
        costs.append(((p - q) * log_p.clamp(min=-1e4)).sum(dim=-1).detach())
        out_tokens.append(token)
        masks.append(alive.clone())
        log_probs.append(log_prob)
        agreements.append(agreement)
        weights.append(w)
        alive = alive & ~state.is_eos(token)
        if step == max_new_tokens - 1 or not bool(alive.any()):
            break
        state.append([[t] for t in token.tolist()])
        verifier.keep(state.lengths() - 1)
        drafter.commit(state, view, never_kept)
    return Rollout(
        tokens=torch.stack(out_tokens, dim=1),
        mask=torch.stack(masks, dim=1),
        log_probs=torch.stack(log_probs, dim=1),
        agreement=torch.stack(agreements, dim=1),
        weights=torch.stack(weights, dim=1),
        verifier_agreement=torch.stack(sd_agreements, dim=1),
        verifier_log_probs=torch.stack(verifier_lps, dim=1),
        expected_verifier_log_probs=torch.stack(expected_lps, dim=1),
        drafting_cost=torch.stack(costs, dim=1),
    )
