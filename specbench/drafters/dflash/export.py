"""Export a specbench-trained DFlash drafter in the z-lab layout (config.json + model.safetensors), the
layout z-lab/dflash, SGLang and ``model/drafter=dflash`` read::

    python -m specbench.drafters.dflash.export RUN/trained.pt OUT_DIR [--dtype bfloat16]
    python -m specbench.drafters.dflash.export RUN/trained.pt OUT.pt --compact   # a bf16 trained.pt to commit

The export holds the draft network only: the verifier's embedding and LM head are shared, as in z-lab's
checkpoints. A drafter trained with a learned mask embedding (``train.dflash_mask_token_id=null``) exports
it as ``mask_embedding`` with ``dflash_config.mask_token_id: null``, which only specbench reads; give the
verifier's mask token id when training for a checkpoint other engines load.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from specbench.drafters.dflash.checkpoint import DFlashCheckpointError, export_dflash, read_trained
from specbench.drafters.dflash.model import DFlashDraftModel

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


def export_trained(source: str | Path, out: str | Path, dtype: torch.dtype = torch.bfloat16) -> Path:
    """Write the draft network of a ``task=train method=dflash`` checkpoint under ``out`` (z-lab layout)."""
    config, weights, metadata = read_trained(source)
    if metadata.get("draft_vocab_ids"):
        raise DFlashCheckpointError(
            f"{str(source)!r} drafts over a draft vocabulary of {len(metadata['draft_vocab_ids'])} tokens, "
            "which the "
            "z-lab layout cannot hold; train with train.draft_vocab_size=null for an export, or keep the "
            "trained.pt (--compact)"
        )
    model = DFlashDraftModel(config)
    expected = set(model.state_dict())
    if set(weights) != expected:
        raise DFlashCheckpointError(
            f"{str(source)!r} does not hold its draft network's weights: missing "
            f"{sorted(expected - set(weights))[:4]}, "
            f"unexpected {sorted(set(weights) - expected)[:4]}"
        )
    model.load_state_dict({k: v.float() for k, v in weights.items()})
    return export_dflash(model, out, dtype)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="trained.pt or last.ckpt of task=train method=dflash")
    parser.add_argument("out", help="the directory to write config.json and model.safetensors into")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    parser.add_argument(
        "--compact", action="store_true",
        help="write OUT as a trained.pt in --dtype without optimiser state (it keeps the verifier checks)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    try:
        if args.compact:
            from specbench.drafters.eagle3.checkpoint import compact_checkpoint

            read_trained(args.checkpoint)  # a DFlash checkpoint, or a named error
            print(f"wrote {compact_checkpoint(args.checkpoint, args.out, DTYPES[args.dtype], 'dflash')}")
            return 0
        path = export_trained(args.checkpoint, args.out, DTYPES[args.dtype])
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {path / 'config.json'} and {path / 'model.safetensors'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
