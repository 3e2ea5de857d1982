"""Structured configs: the schema of every config group, so a typo'd key fails at compose time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from specbench.models.loading import ModelSpec


@dataclass
class TaskConfig:
    """A task: ``_target_`` names the class that ``launch.py`` instantiates with ``cfg=<whole config>``."""

    _target_: str = MISSING


@dataclass
class ReportTaskConfig(TaskConfig):
    """``task=report``: which runs to compare and where the table and plots go.

    Runs come from a Hydra sweep dir (files only, no MLflow) when ``sweep_dir`` is set, else from
    MLflow: ``experiment``, narrowed by ``parent_run_id``, ``tags`` (equalities) and ``filter``.
    Under ``launch.py`` the report files are also logged as artifacts of the report's own MLflow run.
    """

    sweep_dir: str | None = None
    experiment: str = "specbench-eval"
    parent_run_id: str | None = None
    tags: Any = None  # {specbench.method: sd, ...} (or ["key=value", ...]): every tag must match
    filter: str | None = None  # extra MLflow filter string, ANDed with the above
    max_runs: int = 1000
    output_dir: str | None = None  # None: the Hydra run dir


# The library's model description is the schema of the model/verifier and model/drafter groups.
ModelConfig = ModelSpec


@dataclass
class ModelPairConfig:
    verifier: ModelConfig = MISSING
    drafter: ModelConfig = MISSING


@dataclass
class MethodConfig:
    """A verification rule and its parameters; each method reads only its own (methods.md §2)."""

    name: str = MISSING
    lenience: float = 1.0  # lossy
    draft_weight: float = 0.0  # static_ensemble
    pool: str = "linear"  # static_ensemble: linear | log_linear
    deferral: str = "chow"  # cascade: chow | diff | opt | token
    alpha: float = 0.0  # cascade
    epsilon: float = 0.09  # typical
    delta: float = 0.3  # typical
    head_checkpoint: str | None = None  # diversed: the trained weight head (issue 6)
    drafter_checkpoint: str | None = None  # distill: the distilled drafter (issue 5)


@dataclass
class SteeringConfig:
    """Drafter steering (methods.md §4): ``none``, or ``sd2`` (verifier features steer the drafter's MLPs)."""

    name: str = "none"
    v_layers: list[int] = field(default_factory=lambda: [3, 16, 29])  # verifier layers low, mid, high
    guide_method: str = "merged"  # merged (delta on up-projection) | simple (delta on the residual)
    d_layers: Any = "all"  # "all" or a list of drafter layer indices to steer
    rank: int | None = None  # None: full W_s; r: low-rank H_V -> r -> L_D * out_size
    finetune_drafter: str = "full"  # full | none | lora
    checkpoint: str | None = None  # trained fusion + W_s (+ drafter) weights


@dataclass
class ScheduleConfig:
    """Draft-length schedule (methods.md §3.1)."""

    name: str = "constant"
    gamma: int = 3
    max_gamma: int = 16
    confidence_threshold: float = 0.4


@dataclass
class GenConfig:
    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 1


@dataclass
class DatasetConfig:
    """Prompt set and its quality metric (specbench/data/datasets.py; conf/dataset/*.yaml).

    ``None`` values take the dataset's own (HF id, config, split, reference field, metric, few-shot).
    """

    name: str = MISSING
    path: str | None = None  # a local file in the hub schema instead of the hub (required: jsonl, parquet)
    limit: int | None = None
    seed: int | None = None  # None: first ``limit`` rows; an int: a seeded random subset
    prompt_field: str | None = None  # None: ``prompt``, else the first of ``turns``
    hf_id: str | None = None
    hf_config: str | None = None
    split: str | None = None
    prompt_format: str = "auto"  # auto (chat template, else the base prompt) | chat | plain | fewshot
    num_fewshot: int | None = None  # gsm8k 8, mbpp 3
    reference_field: str | None = None
    metric: str | None = None  # none | rouge | bleu | exact_match | pass@1 | spec_bench
    categories: list[str] | None = None  # spec_bench / mt_bench: keep only these categories


@dataclass
class ScoringConfig:
    """Quality scoring after decoding; code (pass@1) runs in specbench/scoring/sandbox.py."""

    enabled: bool = True
    timeout_s: float = 10.0  # per program, wall clock
    memory_mb: int = 1024  # RLIMIT_AS per program
    workers: int = 1  # programs run in parallel
    isolation: str = "auto"  # auto | namespaces (root: kernel-enforced) | preamble (fallback guard)


@dataclass
class EvalConfig:
    baseline: bool = True  # also run autoregressive decoding of the verifier, for the speedup
    warmup: bool = True
    output_dir: str | None = None  # None: the Hydra run dir
    num_shards: int = 1  # data-parallel evaluation: split the prompts into this many shards ...
    shard_id: int = 0  # ... and decode shard shard_id (0 <= shard_id < num_shards)
    resume: bool = True  # a rerun into an output dir with samples.jsonl decodes only the missing prompts


@dataclass
class TrackingConfig:
    """MLflow tracking (specbench/tracking): one run per task, a parent run per multirun."""

    enabled: bool = True
    uri: str | None = None  # None: $MLFLOW_TRACKING_URI, else sqlite:///<project root>/mlruns/mlflow.db
    experiment: str | None = None  # None: specbench-<task kind> (specbench-eval, ...)
    run_name: str | None = None  # None: "<method> <overrides>"
    tags: dict[str, str] = field(default_factory=dict)  # extra tags on every run


@dataclass
class RuntimeConfig:
    device: str = "auto"
    dtype: str = "float32"
    num_threads: int | None = None  # torch CPU threads (torch.set_num_threads); None: torch's default


@dataclass
class Config:
    """The whole composed config (``conf/config.yaml``)."""

    task: Any = MISSING
    model: ModelPairConfig = field(default_factory=ModelPairConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    steering: SteeringConfig = field(default_factory=SteeringConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    scoring: ScoringConfig = field(default_factory=ScoringConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
