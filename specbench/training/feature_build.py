"""Writing a feature cache (:mod:`specbench.training.features` describes its layout and reading): one verifier
pass over the rows a run needs, written once, extended when a later run needs more.

A data-scaling curve trains on nested token budgets of one corpus (``train.data_tokens``,
:mod:`specbench.training.data_budget`), and the whole corpus' pass is its dearest step (about 1.9 M tokens:
over an hour on two CPU cores). So a build writes only the rows asked for (``rows``: the run's training
rows, every validation row) into files sized for every row, and marks them in ``{split}-covered.npy``. A
run that needs rows the cache lacks computes just those into the same files: the small budgets of a curve
train before the whole corpus has been passed, and no row is passed twice. A cache without the mask (built
whole) covers every row.

Crash safety: a first build writes under ``DIR/.partial`` and moves into place, ``features.json`` last; an
extension writes rows no reader uses yet (not covered), flushes them, and only then replaces the mask and
``features.json`` (each by an atomic rename), so a killed extension leaves the cache as it was.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.training.batches import TargetSpec, pad_batch, verifier_targets
from specbench.training.features import (
    FORMAT,
    META_FILE,
    SPLITS,
    VERSION,
    FeatureCache,
    FeatureCacheMismatch,
    _bf16_bits,
    _row_sizes,
    cache_identity,
    covered_path,
    open_feature_cache,
)


def needed_rows(data: Any, rows: Mapping[str, Sequence[int] | None] | None) -> dict[str, np.ndarray]:
    """Per split of ``data``, a bool mask of the rows to cache: ``rows[split]`` (None or absent: all)."""
    needed = {}
    for split in SPLITS:
        if split not in data:
            continue
        chosen = (rows or {}).get(split)
        mask = np.zeros(len(data[split]), dtype=bool)
        mask[list(chosen) if chosen is not None else slice(None)] = True
        needed[split] = mask
    return needed


def build_feature_cache(
    directory: str | Path,
    verifier: Any,
    data: Any,
    taps: Sequence[int],
    targets: TargetSpec | None,
    pad_id: int,
    batch_size: int = 8,
    log: Callable[[str], None] = print,
    read: Sequence[int] | None = None,
    rows: Mapping[str, Sequence[int] | None] | None = None,
) -> FeatureCache:
    """Run the verifier once over the ``rows`` of ``data`` (per split; None: every row) and write the cache;
    an existing cache that serves these ``taps`` and ``targets`` is opened instead, after computing the
    asked-for rows it lacks. ``read``: the taps the returned cache's rows hold, in this order (default:
    ``taps``; a subset, e.g. none for a distillation run that stores SD²'s taps for a later run).

    Rows are batched by length (little padding)."""
    directory = Path(directory).expanduser()
    requested = tuple(int(t) for t in taps)
    reading = requested if read is None else tuple(int(t) for t in read)
    wanted = cache_identity(verifier, data, requested, targets)
    needed = needed_rows(data, rows)
    existing = open_feature_cache(directory, wanted, reading)
    if existing is not None:
        missing = {split: mask & ~existing[split].covered for split, mask in needed.items()}
        if not any(mask.any() for mask in missing.values()):
            return existing
        _extend(directory, existing.meta, verifier, data, missing, targets, pad_id, batch_size, log)
        return open_feature_cache(directory, wanted, reading)
    partial = directory / ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model = verifier.model
    hidden = int(model.config.hidden_size)
    counts, started = {}, time.perf_counter()
    for split, mask in needed.items():
        writer = _SplitWriter(partial, split, data[split], hidden, wanted.taps, targets, fresh=True)
        counts[split] = writer.write(model, pad_id, batch_size, log, started, mask)
        np.save(covered_path(partial, split), mask)
    for path in partial.iterdir():
        os.replace(path, directory / path.name)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "identity": wanted.to_dict(),
        "rows": counts,
        "hidden_size": hidden,
        "target_width": targets.width if targets is not None else 0,
        "targets": targets.identity() if targets else None,
        "dtype": "bfloat16",
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    partial.rmdir()
    log(f"feature cache written to {directory} ({meta['build_seconds']} s)")
    return FeatureCache(directory, meta, reading)


def _extend(directory: Path, meta: dict, verifier: Any, data: Any, missing: dict[str, np.ndarray],
            targets: TargetSpec | None, pad_id: int, batch_size: int,
            log: Callable[[str], None]) -> None:  # fmt: skip
    """Compute the ``missing`` rows into the cache's files, then mark them covered."""
    started = time.perf_counter()
    log(f"feature cache {directory}: computing {sum(int(m.sum()) for m in missing.values())} rows it lacks")
    if meta.get("targets") and targets is None:
        raise FeatureCacheMismatch(
            f"feature cache {str(directory)!r} lacks rows this run needs, and its targets (the EAGLE-3 draft "
            "vocabulary's) cannot be computed here: extend it with the run that built it (a larger "
            "train.data_tokens), or point train.feature_cache at another directory"
        )
    taps = tuple(meta["identity"]["taps"])
    for split, mask in missing.items():
        if not mask.any():
            continue
        hidden = int(meta["hidden_size"])
        writer = _SplitWriter(directory, split, data[split], hidden, taps, targets, fresh=False)
        counts = writer.write(verifier.model, pad_id, batch_size, log, started, mask)
        covered = np.load(covered_path(directory, split)) | mask
        _replace(covered_path(directory, split), lambda f, mask=covered: np.save(f, mask))
        meta["rows"][split] = {**counts, "covered": int(covered.sum())}
    meta["build_seconds"] = round(float(meta.get("build_seconds", 0)) + time.perf_counter() - started, 1)
    _replace(directory / META_FILE, lambda f: f.write(json.dumps(meta, indent=2).encode() + b"\n"))


def _replace(path: Path, write: Callable[[Any], None]) -> None:
    """Write ``path`` through a temporary file and an atomic rename: a reader sees the old or the new file."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        write(handle)
    os.replace(temporary, path)


class _SplitWriter:
    """One split's cache files under ``folder``: the offsets, a memmap per tap and, with ``targets``, the
    packed target values, in-vocabulary flags and (top-k) indices. ``fresh``: create them (sized for every
    row of the split); else open the existing ones to fill rows in."""

    def __init__(self, folder: Path, split: str, table: Any, hidden: int, taps: Sequence[int], targets,
                 fresh: bool):  # fmt: skip
        self.split, self.table, self.hidden, self.taps, self.targets = (
            split, table, hidden, tuple(taps), targets
        )  # fmt: skip
        self.tokens, self.n_targets = _row_sizes(table)
        self.offsets = np.stack(
            [np.concatenate([[0], np.cumsum(self.tokens)]), np.concatenate([[0], np.cumsum(self.n_targets)])]
        )
        if fresh:
            np.save(folder / f"{split}-offsets.npy", self.offsets)
        elif not np.array_equal(np.load(folder / f"{split}-offsets.npy"), self.offsets):
            raise RuntimeError(f"{folder}: {split} row offsets differ from the data's (same fingerprint?)")
        mode = "w+" if fresh else "r+"
        self.total_tokens, self.total_targets = int(self.offsets[0, -1]), int(self.offsets[1, -1])
        self.tap_maps = {
            t: np.memmap(
                folder / f"{split}-tap{t}.bf16", np.int16, mode, shape=(max(self.total_tokens, 1), hidden)
            )
            for t in self.taps
        }
        self.values = self.in_vocab = self.index = None
        if targets is not None:
            shape = (max(self.total_targets, 1), targets.width)
            self.values = np.memmap(folder / f"{split}-target-values.bf16", np.int16, mode, shape=shape)
            self.in_vocab = np.memmap(
                folder / f"{split}-target-in-vocab.u8", np.uint8, mode, shape=(shape[0],)
            )
            if targets.top_k:
                self.index = np.memmap(folder / f"{split}-target-index.i32", np.int32, mode, shape=shape)

    def write(self, model: Any, pad_id: int, batch_size: int, log: Callable[[str], None], started: float,
              chosen: np.ndarray) -> dict:  # fmt: skip
        """Run the verifier over the ``chosen`` rows (a bool mask), batched by length; the split's
        row/token/target counts (of every row: the layout's) and how many rows are covered."""
        order = np.flatnonzero(chosen)[np.argsort(self.tokens[chosen], kind="stable")]
        for first in range(0, len(order), batch_size):
            batch_rows = [int(i) for i in order[first : first + batch_size]]
            batch = _pad_rows([self.table[i] for i in batch_rows], pad_id, model.device)
            self._store(batch_rows, verifier_targets(model, batch, self.taps, self.targets))
            done = min(first + batch_size, len(order))
            if done == len(order) or (first // batch_size) % 50 == 0:
                log(f"feature cache {self.split}: {done}/{len(order)} rows "
                    f"({time.perf_counter() - started:.0f} s)")
        for array in [*self.tap_maps.values(), self.values, self.in_vocab, self.index]:
            if array is not None:
                array.flush()
        return {"rows": len(self.tokens), "tokens": self.total_tokens, "targets": self.total_targets,
                "covered": int(chosen.sum())}

    def _store(self, chosen: list[int], out: dict) -> None:
        hidden = self.hidden
        if self.targets is not None:  # where each row's targets start in the packed (N, K) tensors
            found = out["predict"].sum(dim=1).tolist()
            begins = np.concatenate([[0], np.cumsum(found)]).astype(np.int64)
        for slot, row in enumerate(chosen):
            length = int(self.tokens[row])
            start = int(self.offsets[0, row])
            for k, t in enumerate(self.taps):
                tap = out["features"][slot, :length, k * hidden : (k + 1) * hidden]
                self.tap_maps[t][start : start + length] = _bf16_bits(tap)
            if self.targets is None:
                continue
            start, count = int(self.offsets[1, row]), int(self.n_targets[row])
            if int(found[slot]) != count:
                raise RuntimeError(
                    f"{self.split} row {row}: {int(found[slot])} target positions, expected {count}"
                )
            packed = slice(int(begins[slot]), int(begins[slot]) + count)
            self.values[start : start + count] = _bf16_bits(out["target_values"][packed])
            self.in_vocab[start : start + count] = out["in_vocab"][packed].cpu().numpy().astype(np.uint8)
            if self.index is not None:
                self.index[start : start + count] = out["target_index"][packed].cpu().numpy().astype(np.int32)


def _pad_rows(rows: Iterable[dict], pad_id: int, device: torch.device) -> dict[str, torch.Tensor]:
    batch = pad_batch(list(rows), pad_id)
    return {k: v.to(device) for k, v in batch.items()}
