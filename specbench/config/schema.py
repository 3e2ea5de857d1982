"""Structured configs: the schema of every config group, so a typo'd key fails at compose time."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


@dataclass
class TaskConfig:
    """A task: ``_target_`` names the class that ``launch.py`` instantiates with ``cfg=<whole config>``."""

    _target_: str = MISSING


@dataclass
class ModelConfig:
    """Mirrors :class:`specbench.models.ModelSpec` (kinds hub, local, embedded, tiny_random, early_exit, none)."""

    kind: str = MISSING
    name: str = ""
    path: str | None = None
    revision: str | None = None
    arch: str = "llama"
    num_layers: int | None = None
    hidden_size: int = 64
    vocab_size: int = 320
    seed: int = 0
    trust_remote_code: bool = False


@dataclass
class ModelPairConfig:
    verifier: ModelConfig = field(default_factory=ModelConfig)
    drafter: ModelConfig = field(default_factory=ModelConfig)


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
    """Prompt set: ``demo`` (bundled) or ``jsonl`` (rows with ``prompt`` or ``turns``)."""

    name: str = MISSING
    path: str | None = None
    limit: int | None = None
    seed: int | None = None  # None: first ``limit`` rows; an int: a seeded random subset
    prompt_field: str | None = None  # None: ``prompt``, else the first of ``turns``


@dataclass
class EvalConfig:
    baseline: bool = True  # also run autoregressive decoding of the verifier, for the speedup
    warmup: bool = True
    output_dir: str | None = None  # None: the Hydra run dir


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
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    gen: GenConfig = field(default_factory=GenConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
