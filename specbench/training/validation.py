"""Validation by real decoding: greedy speculative decoding of held-out prompts with the drafter being
trained, reported as τ (tokens per verification round). Every trainer's ``val/tau`` comes from here."""

from __future__ import annotations

from collections.abc import Sequence

import torch

VAL_MAX_NEW_TOKENS = 32


@torch.no_grad()
def greedy_tau(
    verifier: torch.nn.Module,
    drafter,
    prompts: Sequence[Sequence[int]],
    gamma: int,
    vocab_size: int,
    eos_token_ids: Sequence[int],
    pad_token_id: int,
    max_new_tokens: int = VAL_MAX_NEW_TOKENS,
) -> float:
    """Decode each prompt alone (batch 1) with the exact rule at T = 0 and constant γ: the mean tokens per
    round."""
    from specbench.decoding.engine import GenerationSettings, SpeculativeEngine
    from specbench.decoding.schedules import DraftSchedule

    engine = SpeculativeEngine(
        verifier,
        drafter,
        schedule=DraftSchedule("constant", int(gamma)),
        settings=GenerationSettings(max_new_tokens=max_new_tokens),
        vocab_size=vocab_size,
        eos_token_ids=list(eos_token_ids),
        pad_token_id=pad_token_id,
    )
    results = [engine.generate([list(p)])[0] for p in prompts]
    rounds = sum(len(r.rounds) for r in results)
    return sum(len(r.output_ids) for r in results) / max(rounds, 1)


def speculative_tau(module, trained: torch.nn.Module, drafter, gamma: int, vocab_size: int) -> float:
    """A trainer's ``val/tau``: :func:`greedy_tau` of ``module.val_prompts`` with ``drafter`` (built on
    ``trained``, the part being trained, which decodes in eval mode and goes back to its mode after)."""
    was_training = trained.training
    trained.eval()
    try:
        return greedy_tau(
            module.verifier, drafter, module.val_prompts, gamma, vocab_size, module.eos_token_ids,
            module.pad_token_id,
        )  # fmt: skip
    finally:
        trained.train(was_training)
