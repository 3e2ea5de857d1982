"""Training tokens/s of distillation / SD² on the embedded pair: on the fly, from the feature cache, and
from the cache over a reduced draft vocabulary.

The ``experiment=cpu-sd2`` recipe (SmolLM2-135M-Instruct verifier, early-exit drafter of its first 4 layers,
full fine-tuning, KL, batch 4, k = 4) trains ``--steps`` Lightning steps on the first ``--rows`` rows of
``--data`` (a task=synth dir of the verifier) three ways:

- ``on the fly``: every step runs the verifier (targets over the full vocabulary, SD²'s taps);
- ``cached``: ``train.feature_cache`` (built first, timed apart), full vocabulary;
- ``cached + draft vocab K``: ``model.drafter.draft_vocab=--data``, ``draft_vocab_size=K`` (the K most
  frequent response tokens of all of ``--data``): targets restricted to it and renormalised, and the drafter
  computes only those LM-head rows.

Tokens/s counts response tokens (positions that predict a generated token, i.e. the loss positions) per
second of wall time from the end of step ``--warmup`` to the end of the last step (data loading, forward,
backward and AdamW; no validation, no checkpoint in between).

    python benchmarks/drafter_training_speed.py --data /work/data/synth_t1_p150 --rows 24 --steps 12
    --threads 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import benchmark_parser

from specbench.results import record_run

ROOT = Path(__file__).resolve().parent.parent


def parse_args(argv=None) -> argparse.Namespace:
    parser = benchmark_parser(__doc__, threads=1)
    parser.add_argument("--data", default="/work/data/synth_t1_p150", help="a task=synth dir of the verifier")
    parser.add_argument(
        "--rows", type=int, default=24, help="training rows taken from --data (its first ones)"
    )
    parser.add_argument("--steps", type=int, default=12, help="optimiser steps per mode")
    parser.add_argument("--warmup", type=int, default=2, help="steps not timed")
    parser.add_argument("--method", default="sd2", choices=("sd2", "distill"))
    parser.add_argument("--draft-vocab-size", type=int, default=8192)
    parser.add_argument("--modes", default="fly,cached,vocab", help="comma separated: fly, cached, vocab")
    parser.add_argument("--out", default=str(ROOT / "runs" / "drafter-training-speed"))
    parser.add_argument(
        "--keep-cache", action="store_true", help="keep the feature caches (several hundred MB)"
    )
    return parser.parse_args(argv)


def subset(source: str, rows: int, out: Path) -> Path:
    """The first ``rows`` training rows of ``source`` as a task=synth dir (no validation rows)."""
    from specbench.data.synth_dataset import DATASET_DIR, METADATA_FILE, load_synthetic, save_dataset

    data, _ = load_synthetic(source)
    metadata = json.loads((Path(source) / DATASET_DIR / METADATA_FILE).read_text(encoding="utf-8"))
    kept = [dict(r) for r in data["train"].select(range(min(rows, len(data["train"]))))]
    metadata.update(rows=len(kept), subset_of=str(Path(source).resolve()), validation_fraction=0.0)
    save_dataset(kept, metadata, out / DATASET_DIR)
    return out


def overrides(args, data: Path, mode: str, out: Path) -> list[str]:
    method = ["method=sd2", "steering=sd2"] if args.method == "sd2" else ["method=distill", "steering=none"]
    values = [
        "experiment=cpu-sd2", "task=train", *method, f"train.data={data}", f"train.max_steps={args.steps}",
        f"train.val_every_steps={args.steps + 1000}", "train.val_prompts=0", "train.resume=false",
        f"train.checkpoint_every_steps={args.steps + 1000}", f"runtime.num_threads={args.threads}",
        "tracking=none",
    ]  # fmt: skip
    if mode != "fly":
        values.append(f"train.feature_cache={out / ('features-' + mode)}")
    if mode == "vocab":
        values += [
            f"model.drafter.draft_vocab={args.data}",
            f"model.drafter.draft_vocab_size={args.draft_vocab_size}",
        ]
    return values


def train_config(args, data: Path, mode: str, out: Path):
    from hydra import compose, initialize_config_dir

    import specbench.config  # noqa: F401  (registers the schemas)
    from specbench.config.train_checks import validate_train

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
        cfg = compose("config", overrides=overrides(args, data, mode, out))
    return cfg, validate_train(cfg)


def run_mode(args, data: Path, mode: str, out: Path, verifier) -> dict:
    import lightning as L
    import torch
    from lightning.pytorch.callbacks import Callback

    from specbench.evaluation import eos_token_ids, pad_token_id
    from specbench.models.loading import pair_vocab_size
    from specbench.pairs import load_drafter
    from specbench.tracking import NULL_TRACKER
    from specbench.training.drafter import build_drafter_training
    from specbench.training.trainer import build_trainer

    class Throughput(Callback):
        def __init__(self):
            self.ends, self.tokens = [], []

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.ends.append(time.perf_counter())
            self.tokens.append(int(batch["loss_mask"][:, 1:].sum()))

    cfg, plan = train_config(args, data, mode, out)
    L.seed_everything(cfg.train.seed, workers=True, verbose=False)
    drafter = load_drafter(plan.drafter, verifier, plan.device, plan.dtype)
    vocab = pair_vocab_size(verifier, drafter)
    eos = eos_token_ids(verifier.model, verifier.tokenizer)
    module, datamodule = build_drafter_training(
        cfg, plan.method, verifier, drafter, vocab, eos, pad_token_id(verifier.tokenizer, eos)
    )
    started = time.perf_counter()
    datamodule.prepare_data()  # builds the feature cache (fit's own call then opens it)
    build_seconds = time.perf_counter() - started
    meter = Throughput()
    trainer, _ = build_trainer(
        cfg.train, out / f"run-{mode}", NULL_TRACKER, torch.device("cpu"), callbacks=[meter]
    )
    trainer.fit(module, datamodule=datamodule)
    first = args.warmup
    seconds = meter.ends[-1] - meter.ends[first - 1]
    tokens = sum(meter.tokens[first:])
    cache = out / f"features-{mode}"
    size = sum(p.stat().st_size for p in cache.glob("*")) if cache.is_dir() else 0
    return {
        "mode": mode,
        "draft_vocab_size": drafter.draft_vocab.size if drafter.draft_vocab is not None else None,
        "timed_steps": len(meter.ends) - first,
        "tokens": tokens,
        "seconds": seconds,
        "tokens_per_s": tokens / seconds,
        "seconds_per_step": seconds / (len(meter.ends) - first),
        "cache_build_s": build_seconds,
        "cache_mb": size / 2**20,
        "final_loss": float(trainer.callback_metrics.get("train/loss", float("nan"))),
    }


def record_rows(results: list[dict], method: str, draft_vocab_size: int) -> list[dict]:
    """Result-record rows, one per mode: training tokens/s (response tokens), seconds per step, the speedup
    over on the fly (training throughput, not decoding), the cache's build time and size, the loss at the
    end. Training throughput: ``identical_outputs`` is null."""
    label = "SD²" if method == "sd2" else "distillation"
    names = {"fly": "on the fly", "cached": "cached, full vocabulary",
             "vocab": f"cached + draft vocabulary {draft_vocab_size}"}  # fmt: skip
    base = next((r["tokens_per_s"] for r in results if r["mode"] == "fly"), None)
    rows = []
    for r in results:
        figures = {"tokens_per_s_training": {"value": float(r["tokens_per_s"])},
                   "s_per_step": {"value": float(r["seconds_per_step"]), "unit": "s"}}  # fmt: skip
        if base:
            figures["speedup"] = {"value": float(r["tokens_per_s"] / base), "unit": "x"}
        if r["mode"] != "fly":
            figures["cache_build_s"] = {"value": float(r["cache_build_s"]), "unit": "s"}
            figures["cache_mib"] = {"value": float(r["cache_mb"])}
        if math.isfinite(r["final_loss"]):
            figures["final_loss"] = {"value": float(r["final_loss"])}
        rows.append({"setup": f"{label}, {names[r['mode']]}", "figures": figures, "identical_outputs": None})
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch

    from specbench.models.loading import load_verifier

    torch.set_num_threads(args.threads)
    out = Path(args.out).expanduser().resolve()
    shutil.rmtree(out, ignore_errors=True)
    data = subset(args.data, args.rows, out / "data")
    _, plan = train_config(args, data, "fly", out)
    verifier = load_verifier(plan.verifier, plan.device, plan.dtype)
    results = [run_mode(args, data, mode, out, verifier) for mode in args.modes.split(",")]
    if not args.keep_cache:
        for mode in ("cached", "vocab"):
            shutil.rmtree(out / f"features-{mode}", ignore_errors=True)
    names = {
        "fly": "on the fly",
        "cached": "cached",
        "vocab": f"cached + draft vocab {args.draft_vocab_size}",
    }
    base = next((r["tokens_per_s"] for r in results if r["mode"] == "fly"), None)
    print(f"\n{args.method}, {args.rows} rows of {args.data}, batch 4, {args.threads} thread(s), "
          f"steps {args.warmup + 1}..{args.steps} timed; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(
        "| training | response tokens/s | s/step | vs on the fly | cache build | cache size | loss at the "
        "end |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in results:
        ratio = f"{r['tokens_per_s'] / base:.2f}x" if base else "-"
        build = f"{r['cache_build_s']:.0f} s" if r["mode"] != "fly" else "-"
        size = f"{r['cache_mb']:.0f} MiB" if r["mode"] != "fly" else "-"
        print(f"| {names[r['mode']]} | {r['tokens_per_s']:.0f} | {r['seconds_per_step']:.2f} | {ratio} | "
              f"{build} | {size} | {r['final_loss']:.3f} |")  # fmt: skip
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    from specbench.data.synth_dataset import DATASET_DIR, METADATA_FILE

    rows = json.loads((data / DATASET_DIR / METADATA_FILE).read_text(encoding="utf-8"))["rows"]
    record_run(
        args,
        "drafter_training_speed",
        record_rows(results, args.method, args.draft_vocab_size),
        f"{Path(args.data).name} training rows",
        rows,
        device="cpu",
        dtype=str(plan.dtype).removeprefix("torch."),
        threads=args.threads,
        doc="docs/training.md#verifier-feature-cache-and-draft-vocabulary",
        notes=f"experiment=cpu-sd2, {args.method}, batch 4, steps {args.warmup + 1}..{args.steps} timed; "
        f"speedup: training throughput over on the fly (not decoding); load average {os.getloadavg()[0]:.2f}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
