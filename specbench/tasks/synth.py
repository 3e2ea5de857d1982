"""``task=synth``: sample training data from the verifier (methods.md §6) into a ``datasets`` DatasetDict."""

from __future__ import annotations

import time
from pathlib import Path

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from specbench.config.validate import ConfigError, RunPlan, validate_synth
from specbench.data.datasets import dataset_settings
from specbench.data.synthetic import (
    METADATA_FILE,
    SynthDataError,
    SynthResult,
    SynthSettings,
    check_resumable,
    run_identity,
    synthesize,
)
from specbench.evaluation import shard_indices
from specbench.models.loading import load_verifier
from specbench.tasks.base import Task, load_task_prompts, output_dir


class SynthTask(Task):
    """validate → prompts → (resume check) → verifier → sample this shard in batches → DatasetDict
    (+ the MLflow run's tags, metrics and the metadata file as an artifact)."""

    plan: RunPlan | None = None

    def check(self) -> None:
        self.plan = validate_synth(self.cfg)
        self._check_existing(self._configured_dir(), self.plan)

    def run_dir(self) -> Path | None:
        """``synth.output_dir`` (else the Hydra run dir); with several shards the Hydra job dir, since the
        shards of an array may share one output dir but each keeps its own MLflow run record."""
        configured = self.cfg.synth.output_dir
        if configured and self.cfg.synth.num_shards == 1:
            return Path(configured).expanduser()
        return super().run_dir()

    def run(self) -> dict:
        cfg = self.cfg
        plan = self.plan or validate_synth(cfg)  # run_task validated already; direct calls validate here
        settings = SynthSettings.from_config(cfg.synth)
        data = dataset_settings(cfg.dataset)
        prompts = load_task_prompts(self.cfg.dataset)
        if not shard_indices(len(prompts), settings.num_shards, settings.shard_id):
            raise ConfigError(
                f"synth.shard_id={settings.shard_id} of synth.num_shards={settings.num_shards} selects no "
                f"prompt: the dataset has {len(prompts)}"
            )
        out = output_dir(cfg.synth.output_dir, "synth.output_dir")
        self._check_existing(out, plan)  # before the model loads
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        started = time.perf_counter()
        verifier = load_verifier(plan.verifier, plan.device, plan.dtype)
        load_s = time.perf_counter() - started
        self.tracker.set_tags(
            {
                "specbench.method": "auto",
                "specbench.verifier": verifier.name,
                "specbench.drafter": "none",
                "specbench.shard": f"{settings.shard_id}/{settings.num_shards}",
            }
        )
        try:
            result = synthesize(
                verifier,
                prompts,
                settings,
                out,
                dataset=data,
                prompt_format=cfg.dataset.prompt_format,
                resume=cfg.synth.resume,
                extra_metadata={
                    "config": OmegaConf.to_container(cfg, resolve=True),
                    "num_threads": torch.get_num_threads(),
                    "model_load_s": load_s,
                },
            )
        except SynthDataError as err:
            raise ConfigError(str(err)) from err
        self.tracker.set_tags({"specbench.synth.dataset": str(result.dataset_dir.resolve())})
        self.tracker.log_artifact(result.dataset_dir / METADATA_FILE)
        print(format_summary(result))
        return result.summary()

    def _configured_dir(self) -> Path | None:
        configured = self.cfg.synth.output_dir
        if configured:
            return Path(configured).expanduser()
        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None

    def _check_existing(self, out: Path | None, plan: RunPlan) -> None:
        """A rows file of this shard in ``out`` must come from the same settings (else ConfigError)."""
        if out is None or not self.cfg.synth.resume:
            return
        settings = SynthSettings.from_config(self.cfg.synth)
        identity = run_identity(plan.verifier, settings, dataset_settings(self.cfg.dataset))
        try:
            check_resumable(out, settings, identity)
        except SynthDataError as err:
            raise ConfigError(str(err)) from err


def format_summary(result: SynthResult) -> str:
    """Printed at the end of a run: rows, tokens, speed, skips, where the dataset is."""
    m = result.metadata
    resumed = m["rows"] - result.new_rows
    lines = [
        f"synth: {m['rows']} rows (train {m['train_rows']}, validation {m['validation_rows']}) from "
        f"{m['prompts_in_shard']} prompts of shard {m['shard_id']}/{m['num_shards']}"
        + (f", {resumed} resumed" if resumed else ""),
        (
            f"tokens: {m['tokens']} ({m['generated_tokens']} generated, {m['finished_by_eos']} rows ended "
            f"by EOS); this run sampled {result.new_generated_tokens} tokens in {result.wall_time_s:.2f} s "
            f"({result.tokens_per_s:.1f} tokens/s)"
        ),
        f"skipped: {m['skipped_prompts']} prompts longer than max_prompt_len={m['max_prompt_len']}",
        (
            f"verifier {m['verifier']} (tokenizer {m['tokenizer_hash']}), T={m['sampling']['temperature']}, "
            f"target_len={m['target_len']}, prompt format {m['prompt_format']}"
        ),
        f"dataset: {result.dataset_dir}",
    ]
    return "\n".join(lines)
