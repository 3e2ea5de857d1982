"""``task=eval``: decode a prompt set with one method and measure it against autoregressive decoding.

Importing this module imports neither torch nor transformers: ``check()`` validates the config and the
prompt file first, and ``run()`` imports the decoding library.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import OmegaConf

from specbench.config.plans import RunPlan
from specbench.config.validate import validate
from specbench.data.dataset_config import dataset_settings
from specbench.data.prompts import Prompt
from specbench.errors import ConfigError
from specbench.tasks.base import (
    Task,
    check_writable,
    configured_dir,
    load_task_prompts,
    output_dir,
    verifier_placement,
)
from specbench.tasks.eval_files import (
    CONFIG_FILE,
    METRICS_FILE,
    SAMPLES_FILE,
    SampleWriter,
    check_same_config,
    read_samples,
    sample_key_function,
)
from specbench.tasks.results import format_table

if TYPE_CHECKING:
    from specbench.models.loading import LoadedModel

# Library functions the task calls, imported on first use (PEP 562) so importing this module stays cheap;
# they are still module attributes (tests wrap ``compare`` to count what is decoded).
_LIBRARY = {"build_engines": "specbench.evaluation", "compare": "specbench.evaluation"}


def __getattr__(name: str) -> Any:
    if name not in _LIBRARY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(_LIBRARY[name]), name)
    globals()[name] = value
    return value


def _library(name: str) -> Any:
    """``name`` from :data:`_LIBRARY` as this module sees it (a test may have replaced it)."""
    return globals()[name] if name in globals() else __getattr__(name)


# Entries of metrics.json that describe the config rather than measure the run: MLflow params, not metrics.
DESCRIBED = (
    "gamma", "max_gamma", "max_new_tokens", "temperature", "top_k", "top_p", "seed", "batch_size",
    "num_threads", "num_shards", "shard_id",
)  # fmt: skip
UNTRAINED = {
    "diversed": (
        "method.head_checkpoint", "the DIVERSED weight head is untrained (draft weight w = 0.5 everywhere)"
    ),
    "sd2": ("steering.checkpoint", "the SD² steering is untrained (W_s = 0: the pretrained drafter)"),
}


class EvalTask(Task):
    """check: validate → prompts → output dir → shard → resume; run: models → pair check → encode → decode
    (+ baseline) → table, metrics.json, samples.jsonl (and the MLflow run's tags, metrics, artifacts)."""

    plan: RunPlan | None = None
    config_groups = (
        "task", "model", "method", "steering", "schedule", "dataset", "scoring", "gen", "eval", "runtime",
        "tracking",
    )  # fmt: skip

    def check(self) -> None:
        """Everything that needs no model, before an MLflow run opens: a bad value, a prompt file that
        cannot be read, an output dir that cannot be written or holds another config's samples."""
        cfg = self.cfg
        self.plan = validate(cfg)
        self.prompts = load_task_prompts(cfg.dataset)
        self.out = configured_dir(cfg.eval.output_dir)
        check_writable(self.out, "eval.output_dir")
        self.plan.resolve()  # imports torch: a device that is not there
        from specbench.evaluation import shard_indices

        self.selected = shard_indices(len(self.prompts), cfg.eval.num_shards, cfg.eval.shard_id)
        if not self.selected:
            raise ConfigError(
                f"eval.shard_id={cfg.eval.shard_id} of eval.num_shards={cfg.eval.num_shards} selects no "
                f"prompt: the dataset has {len(self.prompts)}"
            )
        self.done = self._resume(self.out, self.prompts, self.selected) if self.out else []

    def run_dir(self) -> Path | None:
        configured = self.cfg.eval.output_dir
        return Path(configured).expanduser() if configured else super().run_dir()

    def run_name(self) -> str | None:
        return None  # the method

    def tracked_metrics(self, result: dict) -> dict:
        return {k: v for k, v in result.items() if k not in DESCRIBED and not k.startswith("method_")}

    def run(self) -> dict:
        if self.plan is None:  # called directly (not through run_task)
            self.check()
        import torch

        from specbench.data.datasets import encode_sample
        from specbench.evaluation import summarize_samples

        cfg, plan, prompts, selected = self.cfg, self.plan, self.prompts, self.selected
        out = output_dir(cfg.eval.output_dir, "eval.output_dir")
        done = self.done if out == self.out else self._resume(out, prompts, selected)
        key = sample_key_function(prompts)
        finished = {key(row) for row in done}
        todo = [i for i in selected if key({"id": prompts[i].id, "index": i}) not in finished]
        if done:
            print(
                f"resuming {out / SAMPLES_FILE}: {len(done)} of {len(selected)} samples done, "
                f"{len(todo)} to decode"
            )
        if cfg.runtime.num_threads is not None:
            torch.set_num_threads(cfg.runtime.num_threads)
        print(f"device {plan.device}, dtype {str(plan.dtype).removeprefix('torch.')} "
              f"(runtime.dtype={cfg.runtime.dtype}"
              f"{dtype_reason(plan) if cfg.runtime.dtype == 'auto' else ''})")
        started = time.perf_counter()
        verifier, drafter, engine, baseline = self._build_engines(plan)
        load_s = time.perf_counter() - started
        untrained = self._untrained(plan)
        self._tag_run(plan, verifier, drafter, untrained)
        prompt_format = cfg.dataset.prompt_format
        encoded = {i: encode_sample(verifier.tokenizer, prompts[i], prompt_format) for i in selected}
        formats = sorted({fmt for _, fmt in encoded.values()})
        OmegaConf.save(cfg, out / CONFIG_FILE, resolve=True)
        writer_rows: list[dict] = []
        if todo:
            with open(out / SAMPLES_FILE, "a" if done else "w", encoding="utf-8") as handle:
                writer = SampleWriter(handle, [prompts[i] for i in todo], verifier.tokenizer, todo)
                _library("compare")(
                    engine,
                    [encoded[i][0] for i in todo],
                    baseline,
                    batch_size=plan.batch_size,
                    warmup=cfg.eval.warmup,
                    on_batch=writer,
                )
                writer_rows = writer.rows
        saved = engine.drafter.save_memory() if engine.drafter is not None else None
        if saved is not None:  # a suffix drafter's global tree
            print(f"saved the drafter's cache: {saved}")
        rows = done + writer_rows
        summary = summarize_samples(rows, greedy=engine.warping.greedy, autoregressive=drafter is None,
                                    profile=getattr(engine.schedule, "profile", None))  # fmt: skip
        quality = self._score(out, prompts, formats)
        metrics = {**summary, **quality, **self._describe(plan, verifier, drafter, formats, load_s)}
        metrics.update(num_shards=cfg.eval.num_shards, shard_id=cfg.eval.shard_id, resumed_samples=len(done))
        if untrained:
            metrics["untrained"] = untrained
        (out / METRICS_FILE).write_text(json.dumps(metrics, indent=2) + "\n")
        self._track(out, metrics)
        print(format_table(metrics))
        print(f"outputs: {out}")
        return metrics

    def _build_engines(self, plan: RunPlan):
        """The loaded verifier, the method's drafter (None: autoregressive), its engine and the AR
        baseline."""
        from specbench.models.pair import PairMismatchError
        from specbench.tasks.method_parts import load_method_parts

        verifier, drafter = self._load_models(plan)
        try:
            parts = load_method_parts(plan, verifier, drafter)
            engine, baseline = _library("build_engines")(
                verifier, parts.drafter, parts.rule, plan.schedule, plan.settings,
                baseline=self.cfg.eval.baseline, steering=parts.steering,
                profile=_cost_profile(self.cfg.schedule),
            )
        except PairMismatchError as err:
            raise ConfigError(f"model.drafter does not fit model.verifier: {err}") from err
        return verifier, parts.drafter, engine, baseline

    def _tag_run(self, plan: RunPlan, verifier, drafter, untrained: str | None) -> None:
        import torch

        cfg = self.cfg
        tags = {
            "specbench.method": plan.method,
            "specbench.verifier": verifier.name,
            "specbench.drafter": drafter.name if drafter else "none",
            "specbench.shard": f"{cfg.eval.shard_id}/{cfg.eval.num_shards}",
            "specbench.device": str(plan.device),
            "specbench.dtype": str(plan.dtype).removeprefix("torch."),
            "specbench.num_threads": str(torch.get_num_threads()),
        }
        if untrained:
            tags["specbench.untrained"] = untrained
        self.tracker.set_tags(tags)

    @staticmethod
    def _untrained(plan: RunPlan) -> str | None:
        """What runs untrained (a trained method without its checkpoint), as one line; None: nothing."""
        unsteered = plan.method == "sd2" and plan.steering is None
        if plan.method not in UNTRAINED or plan.checkpoint or unsteered:
            return None
        key, what = UNTRAINED[plan.method]
        return f"{key} is null, so {what}"

    def _resume(self, out: Path, prompts: list[Prompt], selected: list[int]) -> list[dict]:
        """Complete samples an earlier run of this config left in ``out`` (none unless ``eval.resume``)."""
        path = out / SAMPLES_FILE
        if not self.cfg.eval.resume or not path.exists():
            return []
        check_same_config(out / CONFIG_FILE, self.cfg)
        rows = read_samples(path, repair=True)
        key = sample_key_function(prompts)
        wanted = {key({"id": prompts[i].id, "index": i}) for i in selected}
        seen: set = set()
        for number, row in enumerate(rows, start=1):
            row_key = key(row)
            if row_key not in wanted or row_key in seen:
                problem = "is not in this shard of the dataset" if row_key not in wanted else "is a duplicate"
                raise ConfigError(
                    f"eval.output_dir: {path}:{number}: sample {row.get('id')!r} {problem}; pass "
                    "eval.resume=false to start over or choose another eval.output_dir"
                )
            seen.add(row_key)
        from specbench.evaluation import summarize_samples

        try:
            if rows:
                summarize_samples(rows, greedy=True)
        except (KeyError, ValueError) as err:
            raise ConfigError(
                f"eval.output_dir: cannot resume from {path}: {err}; pass eval.resume=false"
            ) from err
        return rows

    def _track(self, out: Path, metrics: dict) -> None:
        """Step-wise acceptance per position and the output files, into the task's MLflow run."""
        positions = sorted(
            (int(k.removeprefix("acceptance_pos_")), v)
            for k, v in metrics.items()
            if k.startswith("acceptance_pos_")
        )
        if positions:
            self.tracker.log_metric_steps("acceptance_by_position", [v for _, v in positions])
        for name in (CONFIG_FILE, SAMPLES_FILE, METRICS_FILE):
            self.tracker.log_artifact(out / name)

    def _score(self, out: Path, prompts: list[Prompt], formats: list[str]) -> dict:
        """Task quality (``quality_*``) of the samples in ``out``; samples.jsonl gains reference and score."""
        from specbench.scoring import ScoringOptions, score_run

        data = dataset_settings(self.cfg.dataset)
        if not self.cfg.scoring.enabled:
            return data.describe()
        metric, stops = data.scorer(formats[0] if len(formats) == 1 else "mixed")
        options = ScoringOptions.from_config(self.cfg.scoring)
        return {**data.describe(), **score_run(out / SAMPLES_FILE, prompts, metric, stops, options)}

    def _load_models(self, plan: RunPlan) -> tuple[LoadedModel, LoadedModel | None]:
        from specbench.models.loading import load_verifier
        from specbench.pairs import load_drafter

        verifier = load_verifier(
            plan.verifier, plan.device, plan.dtype, placement=verifier_placement(self.cfg, plan)
        )
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
        import torch

        cfg = self.cfg
        described = {
            "method": plan.method,
            "verifier": verifier.name,
            "drafter": drafter.name if drafter else "none",
            "draft_vocab_size": getattr(getattr(drafter, "draft_vocab", None), "size", None),  # None: full
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
        if plan.method in ("sd2", "distill", "diversed"):
            described["method_checkpoint"] = plan.checkpoint or "none (untrained)"
        return described


def dtype_reason(plan: RunPlan) -> str:
    """Why runtime.dtype=auto chose what it did, for the line eval prints before decoding."""
    if plan.device.type != "cpu":
        return ": bf16 off the CPU"
    from specbench.models.devices import cpu_has_native_bf16

    return (
        ": this CPU has native bf16 dot products" if cpu_has_native_bf16() else ": no native bf16 on this CPU"
    )



def _cost_profile(schedule):
    """The measured cost profile ``schedule=cost_aware`` reads: a file, or None (this machine's cached one) or
    ``"measure"`` (measured now, refreshing the cache), which build_engines resolves once the models load."""
    if schedule.name != "cost_aware" or not schedule.get("profile"):
        return None
    from specbench.decoding.cost import CostProfile
    from specbench.decoding.cost_cache import MEASURE

    if schedule.profile == MEASURE:
        return MEASURE

    try:
        return CostProfile.load(schedule.profile)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"schedule.profile: {err}") from err
