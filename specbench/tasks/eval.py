"""``task=eval``: decode a prompt set with one method and measure it against autoregressive decoding."""

from __future__ import annotations

import json
import time
from typing import IO, Any

import torch
from omegaconf import OmegaConf

from specbench.config.validate import ConfigError, RunPlan, validate
from specbench.data.prompts import Prompt, load_prompts
from specbench.data.templates import encode_prompt
from specbench.decoding.engine import SampleResult
from specbench.evaluation import build_engines, compare
from specbench.models.loading import LoadedModel, load_drafter, load_verifier
from specbench.models.pair import PairMismatchError
from specbench.tasks.base import Task, output_dir

METRICS_FILE = "metrics.json"
SAMPLES_FILE = "samples.jsonl"
CONFIG_FILE = "config.yaml"


class SampleWriter:
    """Appends one JSON line per sample to ``samples.jsonl`` and flushes after every batch."""

    def __init__(self, handle: IO[str], prompts: list[Prompt], tokenizer: Any) -> None:
        self.handle = handle
        self.prompts = prompts
        self.tokenizer = tokenizer

    def __call__(
        self, indices: list[int], results: list[SampleResult], baseline: list[SampleResult] | None
    ) -> None:
        for position, (index, result) in enumerate(zip(indices, results)):
            prompt = self.prompts[index]
            row = {
                "id": prompt.id,
                "category": prompt.category,
                "prompt": prompt.text,
                "output_ids": result.output_ids,
                "output_text": self.tokenizer.decode(result.output_ids, skip_special_tokens=True),
                "rounds": [[r.drafted, r.accepted] for r in result.rounds],
                "tokens_per_s": result.tokens_per_s,
                "finished_by_eos": result.finished_by_eos,
            }
            if prompt.reference is not None:
                row["reference"] = prompt.reference
            if baseline is not None:
                row["baseline_tokens_per_s"] = baseline[position].tokens_per_s
                row["matches_baseline"] = baseline[position].output_ids == result.output_ids
            self.handle.write(json.dumps(row, ensure_ascii=False) + "\n")
        self.handle.flush()


class EvalTask(Task):
    """validate → prompts → models → pair check → encode → run (+ baseline) → table, metrics.json, samples.jsonl."""

    def run(self) -> dict:
        cfg = self.cfg
        plan = validate(cfg)
        out = output_dir(cfg.eval.output_dir, "eval.output_dir")
        prompts = self._load_prompts()
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        started = time.perf_counter()
        verifier, drafter = self._load_models(plan)
        load_s = time.perf_counter() - started
        try:
            engine, baseline = build_engines(
                verifier, drafter, plan.rule, plan.schedule, plan.settings, baseline=cfg.eval.baseline
            )
        except PairMismatchError as err:
            raise ConfigError(f"model.drafter does not fit model.verifier: {err}") from err
        encoded = [encode_prompt(verifier.tokenizer, prompt.text) for prompt in prompts]
        formats = sorted({fmt for _, fmt in encoded})
        OmegaConf.save(cfg, out / CONFIG_FILE, resolve=True)
        with open(out / SAMPLES_FILE, "w", encoding="utf-8") as handle:
            comparison = compare(
                engine,
                [ids for ids, _ in encoded],
                baseline,
                batch_size=plan.batch_size,
                warmup=cfg.eval.warmup,
                on_batch=SampleWriter(handle, prompts, verifier.tokenizer),
            )
        metrics = {**comparison.metrics, **self._describe(plan, verifier, drafter, formats, load_s)}
        (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        print(format_table(metrics))
        print(f"outputs: {out}")
        return metrics

    def _load_prompts(self) -> list[Prompt]:
        data = self.cfg.dataset
        try:
            return load_prompts(data.name, data.path, data.limit, data.seed, data.prompt_field)
        except ValueError as err:  # a corrupt row: the message names file and line
            raise ConfigError(f"dataset.path: {err}") from err

    def _load_models(self, plan: RunPlan) -> tuple[LoadedModel, LoadedModel | None]:
        verifier = load_verifier(plan.verifier, plan.device, plan.dtype)
        drafter = load_drafter(plan.drafter, verifier, plan.device, plan.dtype) if plan.drafter else None
        return verifier, drafter

    def _describe(
        self,
        plan: RunPlan,
        verifier: LoadedModel,
        drafter: LoadedModel | None,
        formats: list[str],
        load_s: float,
    ) -> dict:
        """Flat run description stored next to the numbers in metrics.json."""
        cfg = self.cfg
        described = {
            "method": plan.method,
            "verifier": verifier.name,
            "drafter": drafter.name if drafter else "none",
            "schedule": plan.schedule.name,
            "gamma": plan.schedule.initial_gamma() if drafter else 0,
            "max_gamma": plan.schedule.max_gamma,
            "prompt_format": formats[0] if len(formats) == 1 else "mixed",
            "dataset": cfg.dataset.name,
            "dataset_path": cfg.dataset.path if cfg.dataset.name != "demo" else None,
            "max_new_tokens": plan.settings.max_new_tokens,
            "temperature": plan.settings.temperature,
            "top_k": plan.settings.top_k,
            "top_p": plan.settings.top_p,
            "seed": plan.settings.seed,
            "batch_size": plan.batch_size,
            "device": str(plan.device),
            "dtype": str(plan.dtype).removeprefix("torch."),
            "num_threads": torch.get_num_threads(),
            "model_load_s": load_s,
        }
        if plan.rule is not None:
            described.update({f"method_{k}": v for k, v in plan.rule.describe().items() if k != "rule"})
        return described


def format_table(metrics: dict) -> str:
    """The method row and, when the baseline ran, the autoregressive row."""
    header = f"{'method':<28} {'tau':>6} {'acceptance':>11} {'tokens/s':>10} {'speedup':>8}"
    label = (
        metrics["method"]
        if metrics["method"] == "auto"
        else f"{metrics['method']} ({metrics['schedule']}, gamma={metrics['gamma']})"
    )
    speedup = f"{metrics['speedup']:.2f}x" if "speedup" in metrics else "-"
    acceptance = f"{metrics['acceptance_rate']:.3f}" if metrics["method"] != "auto" else "-"
    rows = [header, "-" * len(header)]
    rows.append(
        f"{label:<28} {metrics['tau']:>6.2f} {acceptance:>11} {metrics['tokens_per_s']:>10.1f} {speedup:>8}"
    )
    if "baseline_new_tokens" in metrics:
        rows.append(
            f"{'autoregressive':<28} {1.0:>6.2f} {'-':>11} {metrics['baseline_tokens_per_s']:>10.1f} {'1.00x':>8}"
        )
    rows.append("-" * len(header))
    rows.append(
        f"verifier {metrics['verifier']} | drafter {metrics['drafter']} | {metrics['num_samples']} prompts "
        f"({metrics['prompt_format']}), {metrics['new_tokens']} new tokens in {metrics['wall_time_s']:.2f} s"
        + (
            f" (+ baseline {metrics['baseline_wall_time_s']:.2f} s)"
            if "baseline_wall_time_s" in metrics
            else ""
        )
    )
    return "\n".join(rows)
