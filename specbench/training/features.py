"""Verifier features for drafter training, computed on the fly or once into a disk cache.

One frozen-verifier pass over a synthetic dataset (``task=synth`` rows) gives, per row,

- ``taps``: the residual stream at chosen verifier layers for every position (the tap convention of
  ``specbench/decoding/protocol.py``: tap ``i`` = after ``i`` decoder layers, before the final norm; tap ``L``
  is the last layer's output before the final norm), and
- ``targets``: at every position whose next token is a response token, the verifier's next-token logits
  restricted to a draft vocabulary (all of them, or the top-k), plus whether the verifier's argmax over
  the *full* vocabulary lies in the draft vocabulary (EAGLE-3 / SpecForge count only those positions).

:func:`~specbench.training.batches.verifier_targets` computes them for a padded batch (the on-the-fly path),
the targets packed as the cache stores them (one row per response-predicting position);
:func:`~specbench.training.batches.verifier_batch` scatters them to (B, T, ·) as the EAGLE-3 loss reads them.
``train.feature_cache=DIR`` stores them once (bf16) so that a training step runs only the drafter (EAGLE-3
heads, and distill / SD² drafters: :mod:`specbench.training.synth_data` gives the batches);
:func:`open_feature_cache` reuses a directory only when it was made by the same verifier (name, weights
fingerprint, tokenizer hash) from the same data, with the requested taps (a superset is fine: an SD² run may
read other layers of one cache, a distillation run none) and the same targets (draft vocabulary and top-k);
otherwise it stops with a message naming the difference.

Layout of DIR: ``features.json`` (identity + sizes, written last: a directory without it is rebuilt),
per split ``{split}-offsets.npy`` (row offsets into tokens and targets), ``{split}-tap{i}.bf16`` (tokens,
H), ``{split}-target-values.bf16`` (targets, K), ``{split}-target-index.i32`` (top-k only) and
``{split}-target-in-vocab.u8``. bf16 is stored as its 16 raw bits and read with ``numpy.memmap``, so
DataLoader workers share the pages.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.training.batches import TargetSpec, pad_batch, verifier_targets

FORMAT = "specbench-features"
VERSION = 1
META_FILE = "features.json"
SPLITS = ("train", "validation")


class FeatureCacheMismatch(ValueError):
    """A feature cache directory made by another verifier, from other data, or with other settings."""


# --- the verifier pass ---------------------------------------------------------------------------------


# --- identity ------------------------------------------------------------------------------------------


def data_fingerprint(data: Any) -> str:
    """A hash of every row (input_ids, loss_mask, prompt_len) of every split, in order."""
    digest = hashlib.sha256()
    for split in SPLITS:
        if split not in data:
            continue
        digest.update(split.encode())
        table = data[split]
        for ids, mask, prompt_len in zip(table["input_ids"], table["loss_mask"], table["prompt_len"]):
            digest.update(np.asarray(ids, dtype=np.int64).tobytes())
            digest.update(np.asarray(mask, dtype=np.int8).tobytes())
            digest.update(int(prompt_len).to_bytes(8, "little"))
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class CacheIdentity:
    """What a feature cache must match to be reused."""

    verifier: str
    verifier_weights: str
    tokenizer_hash: str
    data: str
    hidden_size: int
    taps: tuple[int, ...]
    targets: dict | None

    def to_dict(self) -> dict:
        return {
            "verifier": self.verifier,
            "verifier_weights": self.verifier_weights,
            "tokenizer_hash": self.tokenizer_hash,
            "data": self.data,
            "hidden_size": self.hidden_size,
            "taps": list(self.taps),
            "targets": self.targets,
        }


def cache_identity(
    verifier: Any, data: Any, taps: Sequence[int], targets: TargetSpec | None
) -> CacheIdentity:
    """The identity of a cache of ``verifier`` (a LoadedModel) features over ``data``."""
    from specbench.drafters.trained import weights_fingerprint
    from specbench.models.pair import tokenizer_hash

    return CacheIdentity(
        verifier=verifier.name,
        verifier_weights=weights_fingerprint(verifier.model),
        tokenizer_hash=tokenizer_hash(verifier.tokenizer),
        data=data_fingerprint(data),
        hidden_size=int(verifier.model.config.hidden_size),
        taps=tuple(sorted({int(t) for t in taps})),
        targets=targets.identity() if targets is not None else None,
    )


def check_identity(saved: dict, wanted: CacheIdentity, directory: Path) -> None:
    """Raise FeatureCacheMismatch unless the cache at ``directory`` (identity ``saved``) serves ``wanted``."""
    fix = f"point train.feature_cache at another directory (or delete {str(directory)!r} to rebuild it)"
    for key, what in (
        ("verifier", "verifier"),
        ("verifier_weights", "verifier weights"),
        ("tokenizer_hash", "tokenizer"),
        ("hidden_size", "verifier hidden size"),
    ):
        if saved.get(key) != getattr(wanted, key):
            raise FeatureCacheMismatch(
                f"train.feature_cache={str(directory)!r} holds features of another {what} ({key}: cache "
                f"{saved.get(key)!r} vs now {getattr(wanted, key)!r}); {fix}"
            )
    if saved.get("data") != wanted.data:
        raise FeatureCacheMismatch(
            f"train.feature_cache={str(directory)!r} was computed from other data (fingerprint "
            f"{saved.get('data')} vs train.data now {wanted.data}); {fix}"
        )
    missing = sorted(set(wanted.taps) - set(saved.get("taps", [])))
    if missing:
        raise FeatureCacheMismatch(
            f"train.feature_cache={str(directory)!r} has taps {saved.get('taps')}, not {missing}; {fix}"
        )
    if wanted.targets is not None and saved.get("targets") != wanted.targets:
        raise FeatureCacheMismatch(
            f"train.feature_cache={str(directory)!r} holds other targets ({saved.get('targets')} vs now "
            f"{wanted.targets}: draft vocabulary or train.feature_top_k changed); {fix}"
        )


# --- the cache -----------------------------------------------------------------------------------------


def _bf16_bits(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().to("cpu", torch.bfloat16).contiguous().view(torch.int16).numpy()


def _from_bits(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(array, dtype=np.int16)).view(torch.bfloat16)


def _row_sizes(table: Any) -> tuple[np.ndarray, np.ndarray]:
    """Tokens and target positions (response-predicting positions) of each row."""
    tokens = np.array([len(ids) for ids in table["input_ids"]], dtype=np.int64)
    targets = np.array([int(sum(mask[1:])) for mask in table["loss_mask"]], dtype=np.int64)
    return tokens, targets


class FeatureSplit:
    """Read access to one split of a feature cache: ``row(i)`` gives the cached tensors of row ``i``."""

    def __init__(self, directory: Path, split: str, meta: dict, taps: Sequence[int]):
        self.directory, self.split, self.meta = Path(directory), split, meta
        self.taps = tuple(taps)
        offsets = np.load(self.directory / f"{split}-offsets.npy")
        self.token_offsets, self.target_offsets = offsets[0], offsets[1]
        self._maps: dict[str, np.ndarray] | None = None

    def __len__(self) -> int:
        return len(self.token_offsets) - 1

    def __getstate__(self) -> dict:  # memmaps are reopened in each DataLoader worker
        state = dict(self.__dict__)
        state["_maps"] = None
        return state

    def _open(self) -> dict[str, np.ndarray]:
        if self._maps is None:
            hidden, width = self.meta["hidden_size"], self.meta["target_width"]
            n_tokens, n_targets = int(self.token_offsets[-1]), int(self.target_offsets[-1])
            maps = {
                f"tap{t}": np.memmap(
                    self.directory / f"{self.split}-tap{t}.bf16", np.int16, "r", shape=(n_tokens, hidden)
                )
                for t in self.taps
            }
            if self.meta.get("targets"):
                maps["values"] = np.memmap(
                    self.directory / f"{self.split}-target-values.bf16",
                    np.int16,
                    "r",
                    shape=(n_targets, width),
                )
                maps["in_vocab"] = np.memmap(
                    self.directory / f"{self.split}-target-in-vocab.u8", np.uint8, "r", shape=(n_targets,)
                )
                if self.meta["targets"].get("top_k"):
                    maps["index"] = np.memmap(
                        self.directory / f"{self.split}-target-index.i32",
                        np.int32,
                        "r",
                        shape=(n_targets, width),
                    )
            self._maps = maps
        return self._maps

    def row(self, index: int) -> dict[str, torch.Tensor]:
        maps = self._open()
        start, end = int(self.token_offsets[index]), int(self.token_offsets[index + 1])
        out = {}
        if self.taps:
            out["features"] = torch.cat([_from_bits(maps[f"tap{t}"][start:end]) for t in self.taps], dim=-1)
        if "values" in maps:
            start, end = int(self.target_offsets[index]), int(self.target_offsets[index + 1])
            out["target_values"] = _from_bits(maps["values"][start:end])
            out["in_vocab"] = torch.from_numpy(np.array(maps["in_vocab"][start:end], dtype=bool))
            if "index" in maps:
                out["target_index"] = torch.from_numpy(np.array(maps["index"][start:end], dtype=np.int64))
        return out


class FeatureCache:
    """An opened, checked feature cache: one :class:`FeatureSplit` per split."""

    def __init__(self, directory: Path, meta: dict, taps: Sequence[int]):
        self.directory, self.meta = Path(directory), meta
        self.splits = {split: FeatureSplit(directory, split, meta, taps) for split in meta["rows"]}

    def __getitem__(self, split: str) -> FeatureSplit:
        return self.splits[split]


def open_feature_cache(
    directory: str | Path, wanted: CacheIdentity, taps: Sequence[int] | None = None
) -> FeatureCache | None:
    """The cache at ``directory`` if it is complete and serves ``wanted``; None if there is none yet.
    ``taps``: the order rows concatenate their taps in (default: ascending)."""
    directory = Path(directory).expanduser()
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        return None
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise FeatureCacheMismatch(
            f"{meta_path}: unreadable feature cache metadata ({err}); delete it to rebuild"
        ) from err
    if meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise FeatureCacheMismatch(
            f"{meta_path} is not a {FORMAT} v{VERSION} cache; use another train.feature_cache"
        )
    check_identity(meta["identity"], wanted, directory)
    return FeatureCache(directory, meta, taps if taps is not None else wanted.taps)


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
) -> FeatureCache:
    """Run the verifier once over every row of ``data`` and write the cache (see the module docstring);
    an existing cache that serves these ``taps`` and ``targets`` is opened instead. ``read``: the taps the
    returned cache's rows hold, in this order (default: ``taps``; a subset, e.g. none for a distillation
    run that stores SD²'s taps for a later run).

    Rows are batched by length (little padding); files are written under ``DIR/.partial`` and moved into
    place, ``features.json`` last, so an interrupted build leaves no cache that looks complete."""
    directory = Path(directory).expanduser()
    requested = tuple(int(t) for t in taps)
    reading = requested if read is None else tuple(int(t) for t in read)
    wanted = cache_identity(verifier, data, requested, targets)
    existing = open_feature_cache(directory, wanted, reading)
    if existing is not None:
        return existing
    partial = directory / ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    model = verifier.model
    hidden = int(model.config.hidden_size)
    width = targets.width if targets is not None else 0
    rows, started = {}, time.perf_counter()
    for split in SPLITS:
        if split in data:
            writer = _SplitWriter(partial, split, data[split], hidden, wanted.taps, targets)
            rows[split] = writer.write(model, pad_id, batch_size, log, started)
    for path in partial.iterdir():
        os.replace(path, directory / path.name)
    meta = {
        "format": FORMAT,
        "version": VERSION,
        "identity": wanted.to_dict(),
        "rows": rows,
        "hidden_size": hidden,
        "target_width": width,
        "targets": targets.identity() if targets else None,
        "dtype": "bfloat16",
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (directory / META_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    partial.rmdir()
    log(f"feature cache written to {directory} ({meta['build_seconds']} s)")
    return FeatureCache(directory, meta, reading)


class _SplitWriter:
    """One split's cache files under ``partial``: the offsets, a memmap per tap and, with ``targets``, the
    packed target values, in-vocabulary flags and (top-k) indices."""

    def __init__(self, partial: Path, split: str, table: Any, hidden: int, taps: Sequence[int], targets):
        self.split, self.table, self.hidden, self.taps, self.targets = (
            split, table, hidden, tuple(taps), targets
        )  # fmt: skip
        self.tokens, self.n_targets = _row_sizes(table)
        self.offsets = np.stack(
            [np.concatenate([[0], np.cumsum(self.tokens)]), np.concatenate([[0], np.cumsum(self.n_targets)])]
        )
        np.save(partial / f"{split}-offsets.npy", self.offsets)
        self.total_tokens, self.total_targets = int(self.offsets[0, -1]), int(self.offsets[1, -1])
        self.tap_maps = {
            t: np.memmap(
                partial / f"{split}-tap{t}.bf16", np.int16, "w+", shape=(max(self.total_tokens, 1), hidden)
            )
            for t in self.taps
        }
        self.values = self.in_vocab = self.index = None
        if targets is not None:
            shape = (max(self.total_targets, 1), targets.width)
            self.values = np.memmap(partial / f"{split}-target-values.bf16", np.int16, "w+", shape=shape)
            self.in_vocab = np.memmap(
                partial / f"{split}-target-in-vocab.u8", np.uint8, "w+", shape=(shape[0],)
            )
            if targets.top_k:
                self.index = np.memmap(partial / f"{split}-target-index.i32", np.int32, "w+", shape=shape)

    def write(
        self, model: Any, pad_id: int, batch_size: int, log: Callable[[str], None], started: float
    ) -> dict:
        """Run the verifier over the split's rows, batched by length; the split's row/token/target counts."""
        order = np.argsort(self.tokens, kind="stable")
        for first in range(0, len(order), batch_size):
            chosen = [int(i) for i in order[first : first + batch_size]]
            batch = _pad_rows([self.table[i] for i in chosen], pad_id, model.device)
            self._store(chosen, verifier_targets(model, batch, self.taps, self.targets))
            done = min(first + batch_size, len(order))
            if done == len(order) or (first // batch_size) % 50 == 0:
                log(f"feature cache {self.split}: {done}/{len(order)} rows "
                    f"({time.perf_counter() - started:.0f} s)")
        for array in [*self.tap_maps.values(), self.values, self.in_vocab, self.index]:
            if array is not None:
                array.flush()
        return {"rows": len(order), "tokens": self.total_tokens, "targets": self.total_targets}

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


# --- rows and batches that carry the cache -------------------------------------------------------------


