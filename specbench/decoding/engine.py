"""The decoding loop shared by every method (methods.md §2–3).

A method is a drafter (or none) + a verification rule + a draft schedule. Each round drafts up to
γ' tokens per row, runs the verifier once over [last token, drafts], accepts a prefix by the rule and
emits one correction or bonus token. With no drafter the same loop is autoregressive decoding.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel

from specbench.decoding.cache import CachedModel
from specbench.decoding.rules import VerificationRule
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.verification import verify_round
from specbench.decoding.warping import Warping, sample
from specbench.drafters.steering import SteeredDrafter, verifier_features
from specbench.models.devices import synchronize


@dataclass(frozen=True)
class GenerationSettings:
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"gen.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"gen.temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"gen.top_k must be >= 0 (0 = off), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"gen.top_p must be in (0, 1], got {self.top_p}")

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


class _Clock:
    def __init__(self, device: torch.device):
        self.device = device

    def now(self) -> float:
        synchronize(self.device)
        return time.perf_counter()


class SpeculativeEngine:
    """Generate with a verifier, an optional drafter, a verification rule and a draft schedule."""

    def __init__(
        self,
        verifier: PreTrainedModel,
        drafter: PreTrainedModel | None = None,
        rule: VerificationRule | None = None,
        schedule: DraftSchedule | None = None,
        settings: GenerationSettings | None = None,
        vocab_size: int | None = None,
        eos_token_ids: tuple[int, ...] | list[int] = (),
        pad_token_id: int = 0,
        steering: SteeredDrafter | None = None,
    ):
        if steering is not None and drafter is None:
            raise ValueError("SD² steering needs a drafter")
        self.steering = steering
        vocab_size = vocab_size or verifier.config.vocab_size
        self.verifier = CachedModel(verifier, vocab_size)
        self.drafter = CachedModel(drafter, vocab_size) if drafter is not None else None
        self.rule = rule or VerificationRule()
        self.schedule = schedule or DraftSchedule()
        self.settings = settings or GenerationSettings()
        self.warping = self.settings.warping
        self.eos_token_ids = tuple(int(t) for t in eos_token_ids)
        self.pad_token_id = int(pad_token_id)
        self.device = self.verifier.device
        self.clock = _Clock(self.device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(self.settings.seed)

    def reseed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]]) -> list[SampleResult]:
        """Decode one batch of prompts (token id lists) to completion."""
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        start = self.clock.now()
        results = [SampleResult(prompt_ids=list(p)) for p in prompts]
        state = _BatchState.create(
            prompts, self.schedule.initial_gamma(), self.settings.max_new_tokens, self.eos_token_ids,
            self.pad_token_id, self.device,
        )
        self._prefill(state)
        while state.size > 0:
            self._round(state, results)
        elapsed = self.clock.now() - start
        for result in results:
            result.wall_time = elapsed
        return results

    def _models(self) -> list[CachedModel]:
        return [self.verifier] + ([self.drafter] if self.drafter is not None else [])

    def _prefill(self, state: _BatchState) -> None:
        context, context_valid = state.tokens[:, :-1], state.token_valid[:, :-1]
        for model in self._models():
            model.reset(state.size)
        if context.shape[1] == 0:
            return
        out = self.verifier.forward(context, context_valid, output_all_hidden=self.steering is not None)
        if self.steering is not None:
            # Round 1 drafts from the last prompt token; its steering source is the state just before it.
            features = verifier_features(out.hidden_states, self.steering.spec.v_layers)
            state.steer_source, state.steer_valid = features[:, -1], context_valid[:, -1].clone()
        if self.drafter is not None:
            self.drafter.forward(context, context_valid)

    def _round(self, state: _BatchState, results: list[SampleResult]) -> None:
        budget = state.remaining() - 1
        caps = torch.clamp(torch.minimum(state.gammas, budget), min=0) if self.drafter else torch.zeros_like(budget)
        t0 = self.clock.now()
        drafts, q, draft_lens, draft_forwards, drafter_hidden = self._draft(state, caps)
        t1 = self.clock.now()
        verifier_input = torch.cat([state.last_tokens().unsqueeze(1), drafts], dim=1)
        gamma = drafts.shape[1]
        columns = torch.arange(gamma + 1, device=self.device).unsqueeze(0)
        verifier_valid = columns <= draft_lens.unsqueeze(1)
        needs_hidden = self.rule.requires_hidden_states and gamma > 0
        out = self.verifier.forward(
            verifier_input, verifier_valid, output_hidden=needs_hidden, output_all_hidden=self.steering is not None
        )
        p = self.warping.probs(out.logits)
        weights = None
        if needs_hidden:
            weights = self.rule.position_weights(drafter_hidden, out.hidden[:, :gamma])
        verdict = verify_round(self.rule, p, q, drafts, draft_lens, self.warping.greedy, self.generator, weights)
        if self.steering is not None:
            # The next round is steered by the state whose input is the last accepted token (methods.md §4.5).
            features = verifier_features(out.hidden_states, self.steering.spec.v_layers)
            rows = torch.arange(state.size, device=self.device)
            state.steer_source = features[rows, verdict.accepted]
            state.steer_valid = torch.ones(state.size, dtype=torch.bool, device=self.device)
        t2 = self.clock.now()
        self._commit(state, results, drafts, draft_lens, verdict.accepted, verdict.next_token, weights,
                     draft_time=t1 - t0, verify_time=t2 - t1, draft_forwards=draft_forwards)

    def _draft(self, state: _BatchState, caps: torch.Tensor):
        batch = state.size
        vocab = self.verifier.vocab_size
        max_len = int(caps.max()) if batch else 0
        if self.drafter is None or max_len == 0:
            empty = torch.zeros(batch, 0, dtype=torch.long, device=self.device)
            return empty, torch.zeros(batch, 0, vocab, device=self.device), caps * 0, 0, None
        want_hidden = self.rule.requires_hidden_states
        step_input, step_valid = state.pending_for(self.drafter.num_valid)
        steer = contextlib.nullcontext()
        if self.steering is not None and state.steer_source is not None:
            # One steering vector per row for the whole round, from the verifier feature (no extra pass).
            steer = self.steering.steer(self.steering.deltas(state.steer_source, state.steer_valid))
        with steer:
            return self._draft_steps(state, caps, step_input, step_valid, max_len, want_hidden)

    def _draft_steps(self, state, caps, step_input, step_valid, max_len, want_hidden):
        batch = state.size
        drafts, probs, hiddens = [], [], []
        drafting = caps > 0
        lengths = torch.zeros(batch, dtype=torch.long, device=self.device)
        forwards = 0
        for _ in range(max_len):
            out = self.drafter.forward(step_input, step_valid, output_hidden=want_hidden)
            forwards += 1
            q = self.warping.probs(out.logits[:, -1])
            token = q.argmax(dim=-1) if self.warping.greedy else sample(q, self.generator)
            token = torch.where(drafting, token, torch.full_like(token, self.pad_token_id))
            drafts.append(token)
            probs.append(q)
            if want_hidden:
                hiddens.append(out.hidden[:, -1])
            lengths = lengths + drafting.long()
            token_prob = q.gather(1, token.unsqueeze(1)).squeeze(1)
            keep_going = drafting & (lengths < caps) & ~state.is_eos(token)
            if self.schedule.name == "dynamic":
                keep_going &= token_prob >= self.schedule.confidence_threshold
            if not bool(keep_going.any()):
                break
            step_input, step_valid = token.unsqueeze(1), keep_going.unsqueeze(1)
            drafting = keep_going
        drafter_hidden = torch.stack(hiddens, dim=1) if want_hidden else None
        return torch.stack(drafts, dim=1), torch.stack(probs, dim=1), lengths, forwards, drafter_hidden

    def _commit(self, state, results, drafts, draft_lens, accepted, next_token, weights, **timing) -> None:
        max_new = self.settings.max_new_tokens
        finished = torch.zeros(state.size, dtype=torch.bool)
        new_rows = []
        accepted_list, lens_list = accepted.tolist(), draft_lens.tolist()
        drafts_list, next_list = drafts.tolist(), next_token.tolist()
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
                mean_draft_weight=mean_weight, draft_weights=row_weights, **timing,
            ))
            result.output_ids.extend(emitted)
            finished[row] = eos_at is not None or len(result.output_ids) >= max_new
            new_rows.append(emitted)
            state.gammas[row] = self.schedule.next_gamma(int(state.gammas[row]), lens_list[row], kept_drafts)
        state.append(new_rows)
        committed = state.lengths() - 1
        self.verifier.keep(committed)
        if self.drafter is not None:
            self.drafter.keep(torch.minimum(self.drafter.num_valid, committed))
        if bool(finished.any()):
            alive = (~finished).nonzero().squeeze(1).to(self.device)
            state.select(alive)
            for model in self._models():
                model.select_rows(alive)


class _BatchState:
    """Tokens of the rows still decoding: left-padded prompt + generated tokens, with a validity mask."""

    def __init__(self, tokens, token_valid, gammas, generated, max_new, eos, pad_id):
        self.tokens = tokens
        self.token_valid = token_valid
        self.gammas = gammas
        self.sample_index = list(range(tokens.shape[0]))
        self.generated = generated
        self.steer_source: torch.Tensor | None = None  # (B, 3·H_V) SD² steering source of the next round
        self.steer_valid: torch.Tensor | None = None  # (B,) False: no source yet (one-token prompt)
        self._max_new = max_new
        self._eos = eos
        self.pad_id = pad_id

    @classmethod
    def create(cls, prompts, gamma, max_new, eos_ids, pad_id, device) -> _BatchState:
        width = max(len(p) for p in prompts)
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        valid = torch.zeros((len(prompts), width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            valid[row, width - len(prompt):] = True
        gammas = torch.full((len(prompts),), gamma, dtype=torch.long)
        generated = torch.zeros(len(prompts), dtype=torch.long)
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
        return cls(tokens.to(device), valid.to(device), gammas.to(device), generated.to(device), max_new, eos, pad_id)

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    def lengths(self) -> torch.Tensor:
        return self.token_valid.sum(dim=1)

    def remaining(self) -> torch.Tensor:
        return self._max_new - self.generated

    def last_tokens(self) -> torch.Tensor:
        return self.tokens[:, -1]

    def is_eos(self, tokens: torch.Tensor) -> torch.Tensor:
        if not self._eos.numel():
            return torch.zeros_like(tokens, dtype=torch.bool)
        return torch.isin(tokens, self._eos)

    def pending_for(self, cached: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Right-aligned tokens each row has that a model with ``cached`` tokens has not processed."""
        count = self.lengths() - cached
        width = int(count.max())
        columns = torch.arange(width, device=self.tokens.device).unsqueeze(0)
        valid = columns >= (width - count).unsqueeze(1)
        return self.tokens[:, -width:], valid

    def append(self, new_rows: list[list[int]]) -> None:
        width = max(len(r) for r in new_rows)
        block = torch.full((self.size, width), self.pad_id, dtype=torch.long)
        block_valid = torch.zeros((self.size, width), dtype=torch.bool)
        for row, tokens in enumerate(new_rows):
            block[row, width - len(tokens):] = torch.tensor(tokens, dtype=torch.long)
            block_valid[row, width - len(tokens):] = True
        # Right-align each row so its newest token sits in the last column.
        self.tokens, self.token_valid = _right_align(
            torch.cat([self.tokens, block.to(self.tokens.device)], dim=1),
            torch.cat([self.token_valid, block_valid.to(self.tokens.device)], dim=1),
        )
        self.generated = self.generated + torch.tensor([len(r) for r in new_rows], device=self.generated.device)

    def select(self, rows: torch.Tensor) -> None:
        self.tokens, self.token_valid = _right_align(self.tokens[rows], self.token_valid[rows])
        self.gammas = self.gammas[rows]
        self.generated = self.generated[rows]
        if self.steer_source is not None:
            self.steer_source, self.steer_valid = self.steer_source[rows], self.steer_valid[rows]
        self.sample_index = [self.sample_index[i] for i in rows.tolist()]


def _right_align(tokens: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(valid.long(), dim=1, stable=True).indices
    tokens, valid = torch.gather(tokens, 1, order), torch.gather(valid, 1, order)
    first = int(valid.any(dim=0).long().argmax())
    return tokens[:, first:], valid[:, first:]
