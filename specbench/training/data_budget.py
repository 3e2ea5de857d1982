"""Which training rows a run reads: ``train.data_tokens`` (a token budget) and ``train.drop_heldout_overlap``.

A data-scaling curve trains on nested parts of one corpus. The training split's rows are put in one order,
a permutation seeded by ``train.data_seed``, and a budget of N tokens takes the first rows whose generated
tokens add up to N (the row that crosses N is kept). Every budget uses the same order, so the rows of 64 k
tokens are among those of 250 k, and those among 1 M. The validation split stays whole at every budget, so
the snapshots of every size are chosen on the same rows, and the feature cache, which covers every row, is
built once for all sizes. The draft vocabulary is counted on the whole training split, as without a budget:
the cache's targets are over it, so one vocabulary is what lets every size share one cache.

``drop_heldout_overlap`` leaves out the rows whose prompt equals, or shares an 8-gram with, a Spec-Bench
question outside the train part or a demo prompt (the check the prompt manifest applies,
:mod:`specbench.data.prompt_corpus`): corpus pieces sampled before the manifest existed hold one such prompt.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from specbench.training.trainer import train_option


@dataclass
class TrainingRows:
    """``rows``: indices into the training split (None: all of them); ``info``: what the run's metadata
    records about the choice."""

    rows: list[int] | None
    info: dict[str, Any] = field(default_factory=dict)


def heldout_overlap(split: Any, tokenizer: Any) -> list[int]:
    """Indices of the rows whose decoded prompt overlaps a held-out question or a demo prompt."""
    from specbench.data.prompt_corpus import Overlap, excluded_texts

    overlap = Overlap(excluded_texts())
    prompts = [ids[:length] for ids, length in zip(split["input_ids"], split["prompt_len"])]
    texts = tokenizer.batch_decode(prompts, skip_special_tokens=True)
    return [index for index, text in enumerate(texts) if overlap.hits(text)]


def budget_order(split: Any, seed: int) -> list[int]:
    return torch.randperm(len(split), generator=torch.Generator().manual_seed(int(seed))).tolist()


def training_rows(split: Any, tokenizer: Any, train: Any) -> TrainingRows:
    """The rows of ``split`` (the training split) that ``train.data_tokens`` and
    ``train.drop_heldout_overlap`` keep."""
    tokens = train_option(train, "data_tokens", None)
    drop = bool(train_option(train, "drop_heldout_overlap", False))
    if tokens is None and not drop:
        return TrainingRows(None)
    info: dict[str, Any] = {}
    dropped = set(heldout_overlap(split, tokenizer)) if drop else set()
    if drop:
        info["heldout_overlap_rows_dropped"] = len(dropped)
    generated = [int(sum(mask)) for mask in split["loss_mask"]]
    if tokens is None:
        chosen = [i for i in range(len(split)) if i not in dropped]
    else:
        if int(tokens) < 1:
            raise ValueError(f"train.data_tokens must be >= 1 or null (every row), got {tokens}")
        chosen, total = [], 0
        for index in budget_order(split, train_option(train, "data_seed", 0)):
            if total >= int(tokens):
                break
            if index not in dropped:
                chosen.append(index)
                total += generated[index]
        if total < int(tokens):
            print(f"train.data_tokens={tokens}: the training split has only {total} generated tokens; all "
                  "of them are used")  # fmt: skip
        chosen.sort()
        info["data_tokens"] = int(tokens)
    info["train_rows_used"] = len(chosen)
    info["train_generated_tokens"] = sum(generated[i] for i in chosen)
    return TrainingRows(chosen, info)
