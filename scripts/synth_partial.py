"""Save the rows an unfinished ``task=synth`` run has written so far as a loadable synth dataset.

A synth run appends its rows to ``<out>/rows-shard{i}-of-{n}.jsonl`` and saves the dataset only at the
end. Long runs (hours on a CPU) are often useful before they finish: this keeps the rows of the first
``--prompts`` prompts whose responses are all written (the run sorts prompts by length, so these are
the shortest), checks them like ``load_synthetic`` does, and saves them under ``--out`` with the run's
identity and ``"partial": true`` in the metadata. The run itself is not touched and can still resume.

    python scripts/synth_partial.py /work/data/synth_t1 --prompts 150 --out /work/data/synth_t1_p150
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from specbench.data.synth_dataset import load_synthetic, save_dataset
from specbench.data.synth_rows import FORMAT, FORMAT_VERSION, rows_path, settings_path


def complete_rows(run_dir: Path, prompts: int | None) -> tuple[list[dict], dict]:
    settings_file = settings_path(run_dir)
    if not settings_file.exists():
        raise SystemExit(f"{run_dir}: no {settings_file.name}; pass the synth.output_dir of a synth run")
    settings = json.loads(settings_file.read_text(encoding="utf-8"))
    identity = settings["identity"]
    per_prompt = int(identity.get("synth.responses_per_prompt", 1))
    rows = [json.loads(line) for line in rows_path(run_dir).read_text(encoding="utf-8").splitlines() if line]
    counts = Counter(r["source_index"] for r in rows)
    order: list[int] = []
    for row in rows:  # prompts in the order the run finished them
        index = row["source_index"]
        if counts[index] == per_prompt and index not in order:
            order.append(index)
    chosen = set(order[:prompts] if prompts else order)
    if not chosen:
        raise SystemExit(f"{run_dir}: no prompt has all its {per_prompt} responses written yet")
    return [r for r in rows if r["source_index"] in chosen], identity


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, help="synth.output_dir of the (unfinished) run")
    parser.add_argument("--prompts", type=int, default=None, help="keep the first N complete prompts")
    parser.add_argument("--out", type=Path, required=True, help="where to save the dataset")
    parser.add_argument("--validation-fraction", type=float, default=0.05)
    args = parser.parse_args(argv)
    if args.out.resolve() == args.run_dir.resolve():
        raise SystemExit("--out must differ from the run dir (the run may still resume there)")
    rows, identity = complete_rows(args.run_dir, args.prompts)
    tokens = sum(len(r["input_ids"]) for r in rows)
    metadata = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "partial": True,
        "partial_of": str(args.run_dir.resolve()),
        "verifier": identity["verifier"],
        "tokenizer_hash": identity["tokenizer_hash"],
        "sampling": {k: identity[f"synth.{k}"] for k in ("temperature", "top_k", "top_p")},
        "target_len": identity["synth.target_len"],
        "max_prompt_len": identity["synth.max_prompt_len"],
        "responses_per_prompt": identity["synth.responses_per_prompt"],
        "max_new_tokens": identity.get("synth.max_new_tokens"),
        "seed": identity["synth.seed"],
        "validation_fraction": args.validation_fraction,
        "rows": len(rows),
        "prompts_in_shard": len({r["source_index"] for r in rows}),
        "tokens": tokens,
        "generated_tokens": tokens - sum(r["prompt_len"] for r in rows),
        "identity": identity,
    }
    save_dataset(rows, metadata, args.out / "dataset")
    _, loaded = load_synthetic(str(args.out))  # the same checks as task=train
    print(
        f"saved {loaded['rows']} rows of {metadata['prompts_in_shard']} prompts "
        f"({metadata['generated_tokens']} generated tokens) to {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
