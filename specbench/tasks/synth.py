"""``task=synth``: sample training data from the verifier (methods.md §6) into a ``datasets`` DatasetDict."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from specbench.config.plans import RunPlan
from specbench.config.validate import validate_synth
from specbench.data.dataset_config import dataset_settings
from specbench.errors import ConfigError
from specbench.tasks.base import Task, check_writable, load_task_prompts, output_dir, verifier_placement

if TYPE_CHECKING:
    from specbench.pipelines.synthesize import SynthResult


class SynthTask(Task):
    """check: validate → prompts → shard → output dir (resume check); run: verifier → sample this shard
    in batches → DatasetDict (+ the MLflow run's tags, metrics and the metadata file as an artifact)."""

    plan: RunPlan | None = None
    server = None  # ServerSettings, set by check()
    config_groups = ("task", "model", "dataset", "synth", "runtime", "tracking")

    def check(self) -> None:
        from specbench.evaluation import shard_indices
        from specbench.pipelines.synth_plan import SynthSettings
        from specbench.serving.openai_backend import ServerSettings

        self.plan = validate_synth(self.cfg)
        settings = SynthSettings.from_config(self.cfg.synth)
        try:
            self.server = ServerSettings.from_config(self.cfg.synth)
        except ValueError as err:
            raise ConfigError(str(err)) from err
        self.prompts = load_task_prompts(self.cfg.dataset)
        if not shard_indices(len(self.prompts), settings.num_shards, settings.shard_id):
            raise ConfigError(
                f"synth.shard_id={settings.shard_id} of synth.num_shards={settings.num_shards} selects no "
                f"prompt: the dataset has {len(self.prompts)}"
            )
        check_writable(self._configured_dir(), "synth.output_dir")
        self.plan.resolve()
        self._check_existing(self._configured_dir(), self.plan)

    def run_dir(self) -> Path | None:
        """``synth.output_dir`` (else the Hydra run dir); with several shards the Hydra job dir, since the
        shards of an array may share one output dir but each keeps its own MLflow run record."""
        configured = self.cfg.synth.output_dir
        if configured and self.cfg.synth.num_shards == 1:
            return Path(configured).expanduser()
        return super().run_dir()

    def run_name(self) -> str:
        from specbench.models.spec import model_name

        verifier = self.plan.verifier if self.plan else None
        return f"synth {model_name(verifier) if verifier else ''} {self.cfg.dataset.name}".replace("  ", " ")

    def run(self) -> dict:
        import torch

        from specbench.data.synth_dataset import METADATA_FILE
        from specbench.data.synth_rows import SynthDataError
        from specbench.models.loading import load_verifier
        from specbench.pipelines.synth_plan import SynthSettings
        from specbench.pipelines.synthesize import synthesize
        from specbench.serving.openai_backend import backend_for, verifier_without_weights

        if self.plan is None:  # called directly (not through run_task)
            self.check()
        cfg, plan, prompts = self.cfg, self.plan, self.prompts
        settings = SynthSettings.from_config(cfg.synth)
        data = dataset_settings(cfg.dataset)
        out = output_dir(cfg.synth.output_dir, "synth.output_dir")
        self._check_existing(out, plan)  # before the model loads
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        started = time.perf_counter()
        if self.server.remote:  # a server generates: the tokenizer and config are enough here
            verifier = verifier_without_weights(plan.verifier)
        else:
            verifier = load_verifier(
                plan.verifier, plan.device, plan.dtype, placement=verifier_placement(cfg, plan)
            )
        backend = backend_for(self.server, verifier, settings)
        load_s = time.perf_counter() - started
        self.tracker.set_tags(
            {
                "specbench.method": "auto",
                "specbench.verifier": verifier.name,
                "specbench.drafter": "none",
                "specbench.shard": f"{settings.shard_id}/{settings.num_shards}",
                "specbench.synth.backend": self.server.backend,
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
                compress=cfg.synth.compress,
                backend=backend,
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
        from specbench.data.synth_rows import SynthDataError
        from specbench.pipelines.synth_plan import SynthSettings, check_resumable, run_identity

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
