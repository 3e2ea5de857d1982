"""What the engine hands a drafter each round: the batch's tokens and a sampler for drafted tokens."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.warping import Warping, sample


@dataclass
class DraftSampler:
    """Draws drafted tokens exactly as every drafter must: from the warped distribution q (argmax when
    greedy), with the engine's generator; and asks the schedule whether a row keeps drafting."""

    warping: Warping
    generator: torch.Generator
    schedule: DraftSchedule

    @property
    def greedy(self) -> bool:
        return self.warping.greedy

    def draw(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(token (B,), q (B, V)) from drafter logits (B, V): q is the distribution the token came from."""
        q = self.warping.probs(logits)
        token = q.argmax(dim=-1) if self.greedy else sample(q, self.generator)
        return token, q

    def continues(self, q: torch.Tensor | None, token: torch.Tensor) -> torch.Tensor:
        """(B,) whether the schedule lets each row draft another token after ``token`` (drawn from q;
        None for a deterministic proposal, whose probability counts as 1)."""
        if q is None:
            prob = torch.ones(token.shape, dtype=torch.float32, device=token.device)
        else:
            prob = q.gather(-1, token.unsqueeze(-1)).squeeze(-1)
        return self.schedule.continues(prob)


class BatchState:
    """Tokens of the rows still decoding: left-padded prompt + generated tokens, with a validity mask.

    Rows are right-aligned: each row's newest token sits in the last column. ``tokens[:, -1]`` is the token
    the verifier processes first in the next round.
    """

    def __init__(self, tokens, token_valid, gammas, generated, max_new, eos, pad_id):
        self.tokens = tokens
        self.token_valid = token_valid
        self.gammas = gammas
        self.sample_index = list(range(tokens.shape[0]))
        self.generated = generated
        self._max_new = max_new
        self._eos = eos
        self.pad_id = pad_id

    @classmethod
    def create(cls, prompts, gamma, max_new, eos_ids, pad_id, device) -> BatchState:
        width = max(len(p) for p in prompts)
        tokens = torch.full((len(prompts), width), pad_id, dtype=torch.long)
        valid = torch.zeros((len(prompts), width), dtype=torch.bool)
        for row, prompt in enumerate(prompts):
            tokens[row, width - len(prompt):] = torch.tensor(prompt, dtype=torch.long)
            valid[row, width - len(prompt):] = True
        gammas = torch.full((len(prompts),), gamma, dtype=torch.long)
        generated = torch.zeros(len(prompts), dtype=torch.long)
        eos = torch.tensor(list(eos_ids), dtype=torch.long, device=device)
        return cls(
            tokens.to(device), valid.to(device), gammas.to(device), generated.to(device), max_new, eos, pad_id
        )

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def lengths(self) -> torch.Tensor:
        """(B,) tokens per row (prompt + generated)."""
        return self.token_valid.sum(dim=1)

    def remaining(self) -> torch.Tensor:
        return self._max_new - self.generated

    def last_tokens(self) -> torch.Tensor:
        return self.tokens[:, -1]

    def row_tokens(self, row: int, start: int = 0) -> list[int]:
        """Row ``row``'s valid tokens from position ``start`` on, as a list."""
        length = int(self.token_valid[row].sum())
        return self.tokens[row, self.tokens.shape[1] - length + start:].tolist()

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
        self.tokens, self.token_valid = _right_align(
            torch.cat([self.tokens, block.to(self.tokens.device)], dim=1),
            torch.cat([self.token_valid, block_valid.to(self.tokens.device)], dim=1),
        )
        self.generated = self.generated + torch.tensor(
            [len(r) for r in new_rows], device=self.generated.device
        )

    def select(self, rows: torch.Tensor) -> None:
        self.tokens, self.token_valid = _right_align(self.tokens[rows], self.token_valid[rows])
        self.gammas = self.gammas[rows]
        self.generated = self.generated[rows]
        self.sample_index = [self.sample_index[i] for i in rows.tolist()]


def _right_align(tokens: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    order = torch.sort(valid.long(), dim=1, stable=True).indices
    tokens, valid = torch.gather(tokens, 1, order), torch.gather(valid, 1, order)
    first = int(valid.any(dim=0).long().argmax())
    return tokens[:, first:], valid[:, first:]
