"""Prompts as training data (DIVERSED rollouts): encoded as eval encodes them, with what the reward needs,
in a Lightning DataModule with a seeded held-out validation split."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader

from specbench.data.datasets import encode_sample
from specbench.data.prompts import Prompt


def prompt_items(tokenizer: Any, prompts: Sequence[Prompt], prompt_format: str = "auto") -> list[dict]:
    """Encoded prompts (as eval encodes them) with what the reward needs."""
    items = []
    for prompt in prompts:
        ids, fmt = encode_sample(tokenizer, prompt, prompt_format)
        items.append({
            "id": prompt.id, "ids": ids, "format": fmt, "reference": prompt.reference,
            "category": prompt.category, "meta": dict(getattr(prompt, "meta", {}) or {}),
        })  # fmt: skip
    return items


def _as_list(batch: list[dict]) -> list[dict]:
    return batch


class PromptDataModule(L.LightningDataModule):
    """Training prompts (shuffled, seeded, repeated over epochs) and a few held-out validation prompts."""

    def __init__(self, train_items: list[dict], val_items: list[dict], batch_size: int, seed: int = 0,
                 num_workers: int = 0) -> None:  # fmt: skip
        super().__init__()
        if not train_items:
            raise ValueError("DIVERSED training needs at least one training prompt")
        self.train_items = train_items
        self.val_items = val_items
        self.batch_size = batch_size
        self.seed = seed
        self.num_workers = num_workers

    def train_dataloader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.train_items, batch_size=self.batch_size, shuffle=True, generator=generator,
            collate_fn=_as_list, num_workers=self.num_workers,
        )  # fmt: skip

    def val_dataloader(self) -> DataLoader | list:
        if not self.val_items:
            return []
        return DataLoader(self.val_items, batch_size=self.batch_size, shuffle=False, collate_fn=_as_list)


def split_validation(
    prompts: Sequence[Prompt], count: int, seed: int = 0
) -> tuple[list[Prompt], list[Prompt]]:
    """(training, validation): ``count`` prompts picked with ``seed`` (kept out of training); training keeps ≥
    1."""
    prompts = list(prompts)
    count = max(0, min(count, len(prompts) - 1))
    if count == 0:
        return prompts, []
    order = torch.randperm(len(prompts), generator=torch.Generator().manual_seed(seed)).tolist()
    held = set(order[:count])
    return [p for i, p in enumerate(prompts) if i not in held], [
        p for i, p in enumerate(prompts) if i in held
    ]
