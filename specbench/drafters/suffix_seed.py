"""Seed a suffix drafter's global tree with the verifier's own responses from ``task=synth`` output.

SuffixDecoding's global tree holds earlier outputs of the model; a fresh run starts it empty. The
responses ``task=synth`` wrote are outputs of the same verifier, so they can fill it before the first
request. The file this writes is the one ``SuffixDrafter(cache_file=...)`` loads
(``model.drafter.params.cache_file=FILE``, or ``model.drafter.params.suffix.cache_file=FILE`` for the
suffix + EAGLE-3 fallback)::

    python -m specbench.drafters.suffix_seed /work/data/synth_t0 --out /work/data/suffix-seed.json

Only the response tokens (the loss-masked part of each row) are kept, never the prompts: a prompt is the
user's text, and the local tree indexes each request's own prompt already. Draw the synth data from
prompts the evaluation does not use (``dataset.subset=train``), or the seed holds the answers.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from specbench.data.synth_dataset import load_synthetic
from specbench.drafters.suffix import write_cache

SPLITS = ("train", "validation")


def synth_responses(
    paths: str | Sequence[str], splits: Sequence[str] = SPLITS
) -> tuple[list[list[int]], dict]:
    """(the response token ids of every row of ``splits``, in dataset order; the synth metadata)."""
    unknown = sorted(set(splits) - set(SPLITS))
    if unknown:
        raise ValueError(f"unknown synth split(s) {unknown}; choose from {list(SPLITS)}")
    data, metadata = load_synthetic(paths)
    responses = []
    for split in splits:
        for ids, mask in zip(data[split]["input_ids"], data[split]["loss_mask"]):
            response = [int(token) for token, counted in zip(ids, mask) if counted]
            if response:
                responses.append(response)
    return responses, metadata


def seed_cache(
    paths: str | Sequence[str], out: str | Path, max_tree_depth: int = 24, splits: Sequence[str] = SPLITS
) -> tuple[Path, int, int]:
    """Write the suffix cache of the synth responses at ``paths`` to ``out``: (path, responses, tokens)."""
    responses, metadata = synth_responses(paths, splits)
    if not responses:
        raise ValueError(f"{paths}: no response tokens in the synth split(s) {list(splits)}")
    source = {
        "synth": metadata.get("paths"),
        "splits": list(splits),
        "verifier": metadata.get("verifier"),
        "tokenizer_hash": metadata.get("tokenizer_hash"),
        "sampling": metadata.get("sampling"),
    }
    path = write_cache(out, responses, max_tree_depth, source)
    return path, len(responses), sum(len(r) for r in responses)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("synth", help="task=synth output dir(s), comma-separated (as train.data)")
    parser.add_argument("--out", required=True, help="the suffix cache file to write")
    parser.add_argument("--splits", default=",".join(SPLITS), help="comma list of synth splits to read")
    parser.add_argument(
        "--max-tree-depth",
        type=int,
        default=24,
        help="recorded in the file; a drafter that loads it indexes with its own max_tree_depth",
    )
    args = parser.parse_args(argv)
    try:
        splits = [s.strip() for s in args.splits.split(",") if s.strip()]
        path, count, tokens = seed_cache(args.synth, args.out, args.max_tree_depth, splits)
    except ValueError as err:  # SynthDataError included
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path}: {count} responses, {tokens} tokens")
    return 0


if __name__ == "__main__":
    sys.exit(main())
