"""Torch-free checks of a model drafter's reduced draft vocabulary (``draft_vocab_size`` / ``draft_vocab``).

The vocabulary itself is built when the drafter loads (:func:`specbench.models.draft_vocab.load_draft_vocab`);
what can be told without torch or a model is checked here first: the kind of model, the size, whether the
source exists and is a ``task=synth`` output or a checkpoint that saved a vocabulary, and whether their sizes
agree. The tokenizer the source was made with is compared when the verifier's tokenizer has loaded.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from specbench import values
from specbench.errors import ConfigError
from specbench.models.checkpoints import read_checkpoint_metadata, resolve_project_path
from specbench.models.embedded import CACHE_SUBDIR, cache_root
from specbench.models.spec import MODEL_KINDS, ModelSpec

SOURCES = (
    "a task=synth output dir (its draft_vocab_size most frequent response tokens) or a trained.pt that saved "
    "one (EAGLE-3, or distill / sd2 trained over a draft vocabulary)"
)


def known_vocab_size(spec: ModelSpec) -> int | None:
    """The verifier's LM-head size when its config is readable without loading it (None: not known yet)."""
    if spec.kind == "tiny_random":
        return int(spec.vocab_size)
    config: Path | None = None
    if spec.kind == "embedded":
        config = cache_root() / CACHE_SUBDIR / "config.json"
    elif spec.kind == "local" and spec.path:
        config = Path(spec.path).expanduser() / "config.json"
    elif spec.kind == "hub" and spec.path:
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(spec.path, "config.json", revision=spec.revision)
        config = Path(cached) if isinstance(cached, str) else None
    try:
        size = json.loads(config.read_text(encoding="utf-8")).get("vocab_size") if config else None
    except (OSError, ValueError, AttributeError):
        return None
    return int(size) if isinstance(size, int) else None


def _is_synth_output(path: Path) -> bool:
    from specbench.data.synth_dataset import DATASET_DIR, METADATA_FILE

    if (path / METADATA_FILE).is_file():
        return True
    return any((part / METADATA_FILE).is_file() for part in path.glob(f"{DATASET_DIR}*"))


def check_draft_vocab(spec: ModelSpec, key: str, verifier: ModelSpec | None) -> None:
    """Raise ConfigError for a bad ``{key}.draft_vocab_size`` / ``{key}.draft_vocab``; ``verifier`` None
    means ``spec`` is the verifier (which drafts nothing)."""
    size, source = spec.draft_vocab_size, spec.draft_vocab
    if size is None and source is None:
        return
    if verifier is None:
        raise ConfigError(
            f"{key}.draft_vocab_size / {key}.draft_vocab: the verifier drafts nothing; set them on "
            "model.drafter (a model drafter's reduced draft vocabulary)"
        )
    if spec.kind not in MODEL_KINDS:
        raise ConfigError(
            f"{key}.draft_vocab_size / {key}.draft_vocab apply to model drafters (kind in "
            f"{list(MODEL_KINDS)}), not kind={spec.kind!r} (an EAGLE-3 head keeps the draft vocabulary of "
            "its checkpoint); drop them"
        )
    bound = known_vocab_size(verifier)
    try:
        values.check_draft_vocab_size(size, f"{key}.draft_vocab_size", bound)
    except ValueError as err:
        raise ConfigError(str(err)) from err
    if source is None:
        raise ConfigError(f"{key}.draft_vocab_size={size} needs {key}.draft_vocab=PATH: {SOURCES}")
    parts = [p.strip() for p in str(source).split(",") if p.strip()]
    paths = [Path(resolve_project_path(p)) for p in parts]
    missing = [p for p, path in zip(parts, paths) if not path.exists()]
    if missing or not paths:
        shown = missing[0] if missing else str(source)
        where = "" if Path(shown).expanduser().is_absolute() else f" (from {Path.cwd()} or the project root)"
        raise ConfigError(f"{key}.draft_vocab={shown!r}: no such file or directory{where}; pass {SOURCES}")
    if len(paths) == 1 and paths[0].is_file():
        _check_saved(paths[0], size, key, bound)
        return
    for part, path in zip(parts, paths):
        if not path.is_dir() or not _is_synth_output(path):
            raise ConfigError(
                f"{key}.draft_vocab={part!r} is neither a task=synth output dir nor a checkpoint file"
            )
    if size is None:
        raise ConfigError(
            f"{key}.draft_vocab names task=synth data: set {key}.draft_vocab_size (how many of its most "
            "frequent response tokens to keep, e.g. 8192)"
        )


def _check_saved(path: Path, size: int | None, key: str, bound: int | None) -> None:
    """A checkpoint that saved a draft vocabulary: its size must be the configured one (when set)."""
    try:
        metadata = read_checkpoint_metadata(path)
    except ValueError as err:
        raise ConfigError(f"{key}.draft_vocab: {err}") from err
    ids = metadata.get("draft_vocab_ids")
    if not isinstance(ids, list) or not ids:
        raise ConfigError(
            f"{key}.draft_vocab={str(path)!r} is a method={metadata.get('method')!r} checkpoint that saved "
            f"no draft vocabulary; pass {SOURCES}"
        )
    saved_vocab = metadata.get("vocab_size")
    if bound is not None and isinstance(saved_vocab, int) and saved_vocab > bound:
        raise ConfigError(
            f"{key}.draft_vocab={str(path)!r} was built for a vocabulary of {saved_vocab} tokens, but the "
            f"verifier has {bound}: another tokenizer; build one from this verifier's task=synth data"
        )
    if size is not None and size != len(ids):
        raise ConfigError(
            f"{key}.draft_vocab_size={size} but {key}.draft_vocab={str(path)!r} holds a vocabulary of "
            f"{len(ids)} tokens; set {key}.draft_vocab_size={len(ids)} or null"
        )


def trained_vocab_spec(spec: ModelSpec, checkpoint: str | None, key: str) -> ModelSpec:
    """``spec`` for decoding a distill / SD² ``checkpoint`` (set as ``key``): one trained over a draft
    vocabulary decodes with it, so ``{model.drafter}.draft_vocab_size`` must be null or its size (a size
    set alone is then dropped: the vocabulary comes from the checkpoint, not from a source)."""
    if not checkpoint:
        return spec
    try:
        ids = read_checkpoint_metadata(checkpoint).get("draft_vocab_ids")
    except (OSError, ValueError):  # the checkpoint check reports it
        return spec
    if not isinstance(ids, list) or spec.draft_vocab_size is None:
        return spec
    if spec.draft_vocab_size != len(ids):
        raise ConfigError(
            f"model.drafter.draft_vocab_size={spec.draft_vocab_size}, but {key}={checkpoint!r} was trained "
            f"over a draft vocabulary of {len(ids)} tokens, which it decodes with; set "
            f"model.drafter.draft_vocab_size={len(ids)} or null"
        )
    return spec if spec.draft_vocab is not None else replace(spec, draft_vocab_size=None)
