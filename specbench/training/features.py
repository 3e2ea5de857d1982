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
:mod:`specbench.training.feature_build` writes the rows a run asks for and extends the cache when a later
run needs more. :func:`open_feature_cache` reuses a directory only when it was made by the same verifier
(name, weights fingerprint, tokenizer hash) from the same data, with the requested taps (a superset is fine:
an SD² run may read other layers of one cache, a distillation run none) and the same targets (draft
vocabulary and top-k); otherwise it stops with a message naming the difference.

Layout of DIR: ``features.json`` (identity + sizes, written last: a directory without it is rebuilt),
per split ``{split}-offsets.npy`` (row offsets into tokens and targets), ``{split}-tap{i}.bf16`` (tokens,
H), ``{split}-target-values.bf16`` (targets, K), ``{split}-target-index.i32`` (top-k only),
``{split}-target-in-vocab.u8`` and ``{split}-covered.npy`` (the rows written; absent: every row). bf16 is
stored as its 16 raw bits and read with ``numpy.memmap``, so DataLoader workers share the pages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from specbench.training.batches import TargetSpec

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


def covered_path(directory: Path, split: str) -> Path:
    """The split's bool mask of the rows whose features are written (absent: every row, as in a cache built
    whole)."""
    return Path(directory) / f"{split}-covered.npy"


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
        covered = covered_path(self.directory, split)
        self.covered = np.load(covered) if covered.is_file() else np.ones(len(offsets[0]) - 1, dtype=bool)
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
        if not self.covered[index]:
            raise FeatureCacheMismatch(
                f"feature cache {str(self.directory)!r}: {self.split} row {index} is not cached (the cache "
                "was built for a smaller train.data_tokens); build_feature_cache with these rows extends it"
            )
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


# --- rows and batches that carry the cache -------------------------------------------------------------


