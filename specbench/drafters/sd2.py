"""The SD²-steered drafter (methods.md §4) behind the drafter interface.

It is a :class:`ModelDrafter` whose forwards run inside the steering hooks of a
:class:`~specbench.drafters.steering.SteeredDrafter`. The steering source of a round is the verifier's
feature (taps ``v_layers``) at the position whose input is the last accepted token — the state that produced
the correction/bonus token — read from the verification forward that already ran (round 1: from the
prefill, the state just before the last prompt token). One offset per row steers every draft step of the
round.
"""

from __future__ import annotations

import torch

from specbench.decoding.cache import ForwardOutput
from specbench.decoding.drafting import BatchState
from specbench.decoding.model_drafter import ModelDrafter
from specbench.decoding.protocol import VerifierNeeds, VerifierView
from specbench.drafters.steering import SteeredDrafter
from specbench.models.draft_vocab import DraftVocab


class SD2Drafter(ModelDrafter):
    def __init__(
        self,
        steering: SteeredDrafter,
        vocab_size: int | None = None,
        name: str | None = None,
        draft_vocab: DraftVocab | None = None,
        tree_width: int = 1,
    ):
        super().__init__(steering.drafter, vocab_size, name, draft_vocab, tree_width)
        self.steering = steering
        self.needs = VerifierNeeds(taps=tuple(steering.spec.v_layers))
        self._source: torch.Tensor | None = None  # (B, 3·H_V) the next round's steering source
        self._source_valid: torch.Tensor | None = None  # (B,) False: no source yet (one-token prompt)
        self._deltas: torch.Tensor | None = None

    def reset(self, batch_size: int) -> None:
        super().reset(batch_size)
        self._source = self._source_valid = self._deltas = None

    def prefill(self, state: BatchState, view: VerifierView | None) -> None:
        if view is not None and view.input_ids.shape[1]:
            self._source = view.tap_features(self.needs.taps)[:, -1]
            self._source_valid = view.valid[:, -1].clone()
        super().prefill(state, view)

    def propose(self, state, caps, sampler, want_hidden=False):
        # One steering vector per row for the whole round, from the verifier feature (no extra pass).
        self._deltas = None
        if self._source is not None:
            self._deltas = self.steering.deltas(self._source, self._source_valid)
        try:
            return super().propose(state, caps, sampler, want_hidden)
        finally:
            self._deltas = None

    def _forward(
        self, tokens: torch.Tensor, valid: torch.Tensor, output_hidden: bool = False
    ) -> ForwardOutput:
        with self.steering.steer(self._deltas):
            return super()._forward(tokens, valid, output_hidden)

    def commit(self, state: BatchState, view: VerifierView, accepted: torch.Tensor) -> None:
        rows = torch.arange(state.size, device=accepted.device)
        self._source = view.tap_features(self.needs.taps)[rows, accepted]
        self._source_valid = torch.ones(state.size, dtype=torch.bool, device=accepted.device)
        super().commit(state, view, accepted)

    def select_rows(self, rows: torch.Tensor) -> None:
        super().select_rows(rows)
        if self._source is not None:
            self._source, self._source_valid = self._source[rows], self._source_valid[rows]

    def describe(self) -> dict:
        return {**super().describe(), "steering": self.steering.spec.guide_method}
