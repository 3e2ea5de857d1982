"""Finished synth shards, compressed to be committed: ``rows-shard{i}-of-{n}.jsonl.gz`` and its metadata.

A corpus too large to sample in one session is sampled shard by shard (``synth.num_shards``); with
``synth.compress=true`` each finished shard's rows file becomes a gzip archive (byte-for-byte the same lines,
written atomically, with no timestamp in it so that a rebuild gives the same bytes) next to
``rows-shard{i}-of-{n}.metadata.json`` (the saved dataset's metadata). The archive and the two small JSON
files are what a repository keeps; the Arrow dataset dirs are rebuilt from them without the verifier
(:func:`specbench.data.synth_dataset.materialise`), so ``load_synthetic`` and ``task=train`` read a fresh
clone's corpus as they read a finished run. A rerun of a shard whose archive exists samples nothing.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path
from typing import Any

from specbench.data.synth_rows import SynthDataError, _write_json

ARCHIVE_GLOB = "rows-shard*-of-*.jsonl.gz"


def archive_path(out_dir: str | Path, shard_id: int = 0, num_shards: int = 1) -> Path:
    """``<out>/rows-shard{i}-of-{n}.jsonl.gz``: the compressed rows of a finished shard."""
    return Path(out_dir) / f"rows-shard{shard_id}-of-{num_shards}.jsonl.gz"


def archive_metadata_path(archive: Path) -> Path:
    """``rows-shard{i}-of-{n}.metadata.json`` beside ``archive``: the finished dataset's metadata."""
    return archive.with_name(archive.name.removesuffix(".jsonl.gz") + ".metadata.json")


def write_archive(rows_file: Path, archive: Path, metadata: dict[str, Any]) -> Path:
    """Compress ``rows_file`` into ``archive`` (atomically), write its metadata, then remove ``rows_file``."""
    tmp = archive.with_name(f".{archive.name}.tmp-{os.getpid()}")
    with open(rows_file, "rb") as source, open(tmp, "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, compresslevel=9, mtime=0) as packed:
            shutil.copyfileobj(source, packed)
        raw.flush()
        os.fsync(raw.fileno())
    _write_json(archive_metadata_path(archive), metadata)
    tmp.replace(archive)
    rows_file.unlink()
    return archive


def archive_metadata(archive: Path) -> dict[str, Any]:
    """The metadata written beside ``archive``; SynthDataError naming the file when it is missing or bad."""
    path = archive_metadata_path(archive)
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise SynthDataError(
            f"{path}: the metadata of {archive.name} is missing or unreadable ({type(err).__name__}); "
            f"restore both files (e.g. git checkout -- {archive.parent}) or delete the archive and rerun "
            "its shard"
        ) from err
    if not isinstance(metadata, dict) or "identity" not in metadata:
        raise SynthDataError(f"{path}: not the metadata of a synth shard (no identity)")
    return metadata
