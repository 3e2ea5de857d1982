"""The decoding loop shared by every method (methods.md §2–3).

A method is a drafter (or none) + a verification rule + a draft schedule. Each round the drafter proposes up
to γ' tokens per row (:mod:`specbench.decoding.protocol`), the verifier runs once over [last token, drafts],
the rule accepts a prefix and one correction or bonus token is emitted. With no drafter the same loop is
autoregressive decoding. The engine knows drafters only through their interface: which verifier outputs they
read (taken from the forwards that run anyway), what they propose, and what was kept.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specbench.decoding.cache import CachedModel, ForwardOutput
from specbench.decoding.drafting import BatchState, DraftSampler
from specbench.decoding.protocol import Drafter, Proposal, VerifierNeeds, VerifierView
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.tree import check_parents, verify_tree
from specbench.decoding.verification import verify_round
from specbench.decoding.warping import Warping
from specbench.models.devices import synchronize
from specbench.values import GENERATION_DEFAULTS, check_generation


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = GENERATION_DEFAULTS["max_new_tokens"]
    temperature: float = GENERATION_DEFAULTS["temperature"]
    top_k: int = GENERATION_DEFAULTS["top_k"]
    top_p: float = GENERATION_DEFAULTS["top_p"]
    seed: int = GENERATION_DEFAULTS["seed"]

    def __post_init__(self):
        check_generation(self.max_new_tokens, self.temperature, self.top_k, self.top_p, self.seed)

    @property
    def warping(self) -> Warping:
        return Warping(self.temperature, self.top_k, self.top_p)


@dataclass
class RoundRecord:
    drafted: int
    accepted: int
    emitted: int
    draft_time: float  # seconds of the whole batch's drafting in this round
    verify_time: float  # seconds of the whole batch's verification forward in this round
    draft_forwards: int
    mean_draft_weight: float | None = None
    draft_weights: list[float] | None = None  # per drafted position (ensemble rules with learned weights)
    verifier_logp: float | None = None  # Σ log p_verifier(y) over the emitted tokens (untempered p)


@dataclass
class SampleResult:
    prompt_ids: list[int]
    output_ids: list[int] = field(default_factory=list)
    rounds: list[RoundRecord] = field(default_factory=list)
    wall_time: float = 0.0  # decoding wall time of the batch this sample ran in (incl. prefill)
    finished_by_eos: bool = False

    @property
    def verifier_forwards(self) -> int:
        return len(self.rounds)

    @property
    def tokens_per_s(self) -> float:
        return len(self.output_ids) / self.wall_time if self.wall_time > 0 else 0.0

    @property
    def verifier_logp(self) -> float | None:
        """Mean log-likelihood per output token under the verifier's own (untempered) distribution."""
        if not self.output_ids or any(r.verifier_logp is None for r in self.rounds):
            return None
        return sum(r.verifier_logp for r in self.rounds) / len(self.output_ids)


class _Clock:
    def __init__(self, device: torch.device):
        self.device = device

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()


def _lm_head_rows(model: PreTrainedModel) -> int:
    return int(model.get_output_embeddings().weight.shape[0])


def check_drafter(drafter: object) -> Drafter | None:
    """``drafter`` itself when it is a :class:`Drafter` (or None); a TypeError naming the wrapper
    otherwise."""
    if drafter is None or isinstance(drafter, Drafter):
        return drafter
    raise TypeError(
        f"the engine takes a Drafter (specbench.decoding.protocol) or None, not {type(drafter).__name__}; "
        "wrap a transformers model in specbench.decoding.model_drafter.ModelDrafter(model, vocab_size), as "
        "specbench.evaluation.build_engines does"
    )


def verified_vocab_size(verifier: PreTrainedModel, drafter: Drafter | None, vocab_size: int | None) -> int:
    """The vocabulary size p and q are compared over; raises ValueError for a drafter that does not fit."""
    verifier_rows = _lm_head_rows(verifier)
    vocab = int(vocab_size or verifier.config.vocab_size)
    if vocab > verifier_rows:
        raise ValueError(f"vocab_size={vocab} exceeds the verifier's LM head ({verifier_rows} rows)")
    drafter_rows = drafter.lm_head_rows if drafter is not None else None
    if drafter_rows is not None and (
        drafter_rows < vocab or (vocab_size is None and drafter_rows != verifier_rows)
    ):
        raise ValueError(
            f"the drafter's LM head has {drafter_rows} rows and the verifier's {verifier_rows}: p and q must "
            f"cover the same vocabulary; pass vocab_size=<the shared tokenizer's size> (see "
            f"specbench.models.pair.shared_vocab_size) or use a drafter with the verifier's tokenizer"
        )
    return vocab


def emitted_log_likelihoods(
    logits: torch.Tensor, drafts: torch.Tensor, accepted: torch.Tensor, next_token: torch.Tensor
) -> torch.Tensor:
    """(B, γ+1) log p(y_j) of the tokens a round emits, under the verifier's untempered distribution: column
    j < accepted[b] is draft j, column accepted[b] the correction/bonus token (later columns: unused)."""
    columns = torch.arange(logits.shape[1], device=logits.device).unsqueeze(0)
    padded = torch.cat([drafts, torch.zeros_like(next_token).unsqueeze(1)], dim=1)
    emitted = torch.where(columns == accepted.unsqueeze(1), next_token.unsqueeze(1), padded)
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, emitted.unsqueeze(-1)).squeeze(-1)


class SpeculativeEngine:
    """Generate with a verifier, an optional drafter, a verification rule and a draft schedule.

    ``drafter``: a :class:`~specbench.decoding.protocol.Drafter` (a transformers causal LM is wrapped in a
    :class:`~specbench.decoding.model_drafter.ModelDrafter` where the pair is built), or None for
    autoregressive decoding.
    """

    def __init__(
        self,
        verifier: PreTrainedModel,
        drafter: Drafter | None = None,
        rule: VerificationRule | None = None,
        schedule: DraftSchedule | None = None,
        settings: GenerationSettings | None = None,
        vocab_size: int | None = None,
        eos_token_ids: tuple[int, ...] | list[int] = (),
        pad_token_id: int = 0,
    ):
        drafter = check_drafter(drafter)
        vocab_size = verified_vocab_size(verifier, drafter, vocab_size)
        self.verifier = CachedModel(verifier, vocab_size)
        self.drafter = drafter
        self.rule = rule or VerificationRule()
        self._check_rule()
        self.schedule = schedule or DraftSchedule()
        self.schedule.bind(self.drafter)
        self.settings = settings or GenerationSettings()
        self.warping = self.settings.warping
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.device = self.verifier.device
        self.clock = _Clock(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.settings.seed)

    def _check_rule(self) -> None:
        if self.drafter is None:
            return
        if self.drafter.deterministic and not self.rule.accepts_deterministic:
            raise ValueError(
                f"the {self.rule.name!r} rule needs the drafter's distribution q, but drafter "
                f"{self.drafter.name!r} proposes tokens without one; use a rule that verifies deterministic "
                "proposals (sd, lossy, typical, block) or a model drafter"
            )
        if self.drafter.proposes_trees:
            self._check_tree_rule()
        if self.rule.requires_hidden_states and self.drafter.hidden_size is None:
            raise ValueError(
                f"the {self.rule.name!r} rule reads the drafter's hidden states, which drafter "
                f"{self.drafter.name!r} does not have"
            )

    def _check_tree_rule(self) -> None:
        if type(self.rule) is not VerificationRule:
            raise ValueError(
                f"drafter {self.drafter.name!r} proposes trees of drafts, which only the exact 'sd' rule "
                f"verifies; use method=sd, or the drafter's chain mode (tree_width=1) with the "
                f"{self.rule.name!r} rule"
            )

    @property
    def drafter_needs(self) -> VerifierNeeds:
        return self.drafter.needs if self.drafter is not None else VerifierNeeds()

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> list[SampleResult]:
        """Decode one batch of prompts (token id lists) to completion."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        start = self.clock.now()
        results = [SampleResult(prompt_ids=list(p)) for p in prompts]
        state = BatchState.create(
            prompts, self.schedule.initial_gamma(), self.settings.max_new_tokens, self.eos_token_ids,
            self.pad_token_id, self.device,
        )
        sampler = DraftSampler(self.warping, self.generator, self.schedule)
        self._prefill(state)
        while state.size > 0:
            self._round(state, results, sampler)
        elapsed = self.clock.now() - start
        for result in results:
            result.wall_time = elapsed
        return results

    def _verifier_forward(
        self, tokens, valid, hidden: bool, taps, logits: bool = True
    ) -> tuple[ForwardOutput, VerifierView]:
        out = self.verifier.forward(tokens, valid, output_hidden=hidden, output_taps=taps, logits=logits)
        return out, VerifierView(tokens, valid, out.hidden, out.taps)

    def _prefill(self, state: BatchState) -> None:
        context, context_valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        self.verifier.reset(state.size)
        if self.drafter is not None:
            self.drafter.reset(state.size)
        view = None
        if context.shape[1] > 0:
            needs = self.drafter_needs
            # Nobody reads the prefill's logits (the last prompt token goes into the first round): no LM head.
            _, view = self._verifier_forward(context, context_valid, needs.hidden, needs.taps, logits=False)
            if not needs.any:
                view = None
        if self.drafter is not None:
            self.drafter.prefill(state, view)

    def _round(self, state: BatchState, results: list[SampleResult], sampler: DraftSampler) -> None:
        budget = state.remaining() - 1
        t0 = self.clock.now()
        proposal = Proposal.empty(state.size, self.device)
        if self.drafter is not None:
            caps = torch.clamp(torch.minimum(self.schedule.caps(state.gammas), budget), min=0)
            if int(caps.max()) > 0:
                proposal = self.drafter.propose(
                    state, caps, sampler, want_hidden=self.rule.requires_hidden_states
                )
                proposal = self.schedule.trim(proposal)
        t1 = self.clock.now()
        if proposal.is_tree:
            self._tree_round(state, results, proposal, t0, t1)
        else:
            self._chain_round(state, results, proposal, t0, t1)
        if self.drafter is not None and self.schedule.learns_costs:
            columns = proposal.tokens.shape[1] + 1
            self.schedule.observe_round(columns, self.clock.now() - t1, proposal.forwards, t1 - t0)

    def _chain_round(self, state, results, proposal: Proposal, t0: float, t1: float) -> None:
        drafts, draft_lens = proposal.tokens, proposal.lengths
        verifier_input = torch.cat([state.last_tokens().unsqueeze(1), drafts], dim=1)
        gamma = drafts.shape[1]
        columns = torch.arange(gamma + 1, device=self.device).unsqueeze(0)
        verifier_valid = columns <= draft_lens.unsqueeze(1)
        needs_hidden = self.rule.requires_hidden_states and gamma > 0
        needs = self.drafter_needs
        out, view = self._verifier_forward(
            verifier_input, verifier_valid, needs.hidden or needs_hidden, needs.taps
        )
        p = self.warping.probs(out.logits)
        weights = None
        if needs_hidden:
            weights = self.rule.position_weights(proposal.hidden, out.hidden[:, :gamma])
        verdict = verify_round(
            self.rule, p, proposal.q, drafts, draft_lens, self.warping.greedy, self.generator, weights
        )
        logp = emitted_log_likelihoods(out.logits, drafts, verdict.accepted, verdict.next_token)
        t2 = self.clock.now()
        if self.drafter is not None:
            self.schedule.observe(proposal, verdict.accepted)
        self._commit(state, results, proposal, verdict.accepted, verdict.next_token, weights, view, logp,
                     draft_time=t1 - t0, verify_time=t2 - t1, draft_forwards=proposal.forwards)

    def _tree_round(self, state, results, proposal: Proposal, t0: float, t1: float) -> None:
        """Verify a tree of drafts in one forward, then hand the accepted path on as if it were a chain:
        the path's columns go first in the verifier's cache, in the view the drafter commits from and in
        the drafts ``_commit`` emits."""
        self._check_tree_rule()
        parents = proposal.parents
        check_parents(parents, proposal.tokens)
        verifier_input = torch.cat([state.last_tokens().unsqueeze(1), proposal.tokens], dim=1)
        root = torch.ones(state.size, 1, dtype=torch.bool, device=self.device)
        verifier_valid = torch.cat([root, parents >= 0], dim=1)
        needs = self.drafter_needs
        out = self.verifier.forward(
            verifier_input,
            verifier_valid,
            output_hidden=needs.hidden,
            output_taps=needs.taps,
            tree_parents=parents,
        )
        verdict = verify_tree(self.warping.probs(out.logits), proposal.tokens, parents, self.warping.greedy,
                              self.generator, proposal.q)  # fmt: skip
        order = verdict.column_order(verifier_input.shape[1], self.device)
        self.verifier.reorder_last(order)

        def by_path(x: torch.Tensor | None) -> torch.Tensor | None:
            if x is None:
                return None
            index = order.to(x.device)
            if x.dim() == 3:
                index = index.unsqueeze(-1).expand(-1, -1, x.shape[-1])
            return torch.gather(x, 1, index)

        path_input = by_path(verifier_input)
        view = VerifierView(path_input, by_path(verifier_valid), by_path(out.hidden),
                            {i: by_path(t) for i, t in out.taps.items()})  # fmt: skip
        path = Proposal(path_input[:, 1:], proposal.lengths, forwards=proposal.forwards, parents=parents)
        logp = emitted_log_likelihoods(by_path(out.logits), path.tokens, verdict.accepted, verdict.next_token)
        t2 = self.clock.now()
        self.schedule.observe(path, verdict.accepted)
        self._commit(state, results, path, verdict.accepted, verdict.next_token, None, view, logp,
                     draft_time=t1 - t0, verify_time=t2 - t1, draft_forwards=proposal.forwards)

    def _commit(self, state, results, proposal, accepted, next_token, weights, view, logp, **timing) -> None:
        max_new = self.settings.max_new_tokens
        finished = torch.zeros(state.size, dtype=torch.bool)
        new_rows = []
        accepted_list, lens_list = accepted.tolist(), proposal.lengths.tolist()
        logp_list = logp.tolist()
        drafts_list, next_list = proposal.tokens.tolist(), next_token.tolist()
        for row in range(state.size):
            n = accepted_list[row]
            emitted = drafts_list[row][:n] + [next_list[row]]
            result = results[state.sample_index[row]]
            room = max_new - len(result.output_ids)
            emitted = emitted[:room]
            eos_at = next((i for i, t in enumerate(emitted) if t in self.eos_token_ids), None)
            if eos_at is not None:
                emitted = emitted[: eos_at + 1]
                result.finished_by_eos = True
            kept_drafts = min(n, len(emitted))
            mean_weight, row_weights = None, None
            if weights is not None and lens_list[row] > 0:
                row_weights = [float(w) for w in weights[row, : lens_list[row]].tolist()]
                mean_weight = sum(row_weights) / len(row_weights)
            result.rounds.append(RoundRecord(
                drafted=lens_list[row], accepted=kept_drafts, emitted=len(emitted),
                mean_draft_weight=mean_weight, draft_weights=row_weights,
                verifier_logp=sum(logp_list[row][: len(emitted)]), **timing,
            ))
            result.output_ids.extend(emitted)
            finished[row] = eos_at is not None or len(result.output_ids) >= max_new
            new_rows.append(emitted)
            state.gammas[row] = self.schedule.next_gamma(int(state.gammas[row]), lens_list[row], kept_drafts)
        state.append(new_rows)
        self.verifier.keep(state.lengths() - 1)
        if self.drafter is not None:
            self.drafter.commit(state, view, accepted)
        if bool(finished.any()):
            alive = (~finished).nonzero().squeeze(1).to(self.device)
            state.select(alive)
            self.verifier.select_rows(alive)
            if self.drafter is not None:
                self.drafter.select_rows(alive)
