"""The Lightning data module over a task=synth dataset: shuffled training rows and in-order validation rows,
each with its cached verifier features and targets when a feature cache is given."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset, Subset

from specbench.training.batches import PACKED_TARGETS, pad_batch, predict_positions
from specbench.training.features import FeatureCache, FeatureSplit


class CachedRows(Dataset):
    """task=synth rows of one split, each with its cached verifier features and targets when given."""

    def __init__(self, table: Any, cached: FeatureSplit | None = None):
        self.table = table.select_columns(["input_ids", "loss_mask", "prompt_len"])
        self.cached = cached
        if cached is not None and len(cached) != len(self.table):
            raise ValueError(
                f"the feature cache has {len(cached)} rows of this split, the data {len(self.table)}"
            )

    def __len__(self) -> int:
        return len(self.table)

    def __getitem__(self, index: int) -> dict:
        row = dict(self.table[int(index)])
        if self.cached is not None:
            row.update(self.cached.row(int(index)))
        return row


def collate_cached(rows: list[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch of :class:`CachedRows` rows, packed as :func:`verifier_targets` packs the live
    pass: ``features`` (B, T, ·) zero-padded; ``predict`` (B, T) and the rows' targets concatenated in row
    order (N, ·). Rows without cached tensors give the plain padded batch."""
    batch = pad_batch(rows, pad_id)
    first = rows[0]
    if "features" in first:
        size, length = batch["input_ids"].shape
        features = first["features"].new_zeros((size, length, first["features"].shape[-1]))
        for i, row in enumerate(rows):
            features[i, : row["features"].shape[0]] = row["features"]
        batch["features"] = features
    if "target_values" in first:
        batch["predict"] = predict_positions(batch["attention_mask"], batch["loss_mask"])
        batch.update({key: torch.cat([row[key] for row in rows]) for key in PACKED_TARGETS if key in first})
    return batch


class SyntheticDataModule(L.LightningDataModule):
    """Shuffled (seeded) training rows and in-order validation rows of a task=synth dataset.

    ``cache``: builds (once, in ``prepare_data``, i.e. on rank 0) or opens the verifier-feature cache
    (:mod:`specbench.training.features`); its rows then carry their cached features and targets."""

    def __init__(
        self,
        data: Any,
        batch_size: int,
        pad_id: int,
        seed: int = 0,
        num_workers: int = 0,
        cache: Callable[[], FeatureCache] | None = None,
        train_rows: Sequence[int] | None = None,
    ):
        super().__init__()
        self.data, self.batch_size, self.pad_id = data, batch_size, pad_id
        self.seed, self.num_workers = seed, num_workers
        self._cache = cache
        self.features: FeatureCache | None = None
        self.train_rows = list(train_rows) if train_rows is not None else None  # data_budget.training_rows

    def prepare_data(self) -> None:
        if self._cache is not None:
            self._cache()

    def setup(self, stage: str | None = None) -> None:
        if self._cache is not None and self.features is None:
            self.features = self._cache()

    def rows(self, split: str) -> Any:
        """The dataset one split's loader reads (the training split cut to ``train_rows`` when given; the
        feature cache is indexed by the full split's rows)."""
        if self.features is not None:
            rows = CachedRows(self.data[split], self.features[split])
        else:
            rows = self.data[split].select_columns(["input_ids", "loss_mask", "prompt_len"])
        if split == "train" and self.train_rows is not None:
            return Subset(rows, self.train_rows)
        return rows

    def collate(self, batch: list[dict]) -> dict[str, torch.Tensor]:
        return collate_cached(batch, self.pad_id)

    def _loader(self, split: str, shuffle: bool) -> DataLoader:
        generator = torch.Generator().manual_seed(self.seed)
        return DataLoader(
            self.rows(split), batch_size=self.batch_size, shuffle=shuffle, generator=generator,
            num_workers=self.num_workers, collate_fn=self.collate,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader("validation", shuffle=False)
