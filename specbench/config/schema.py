"""Structured configs: the schema of every config group, so a typo'd key fails at compose time."""

from __future__ import annotations

from dataclasses import dataclass, field, make_dataclass
from typing import Any, Optional

from omegaconf import MISSING

from specbench.method_names import all_params
from specbench.models.spec import ModelSpec
from specbench.values import DRAFT_SCHEDULE, GENERATION_DEFAULTS, SCHEDULE_DEFAULTS


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
    parent_run_id: str | None = None  # a sweep's MLflow parent run id; last: the experiment's newest sweep
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


def _method_config() -> type:
    """The ``method`` group's schema, derived from the method table (specbench/method_names.py): ``name``,
    ``alias``, every parameter of the table (``None``: the method's default), ``_target_`` + ``params``.

    ``None`` means "the method's default" (``conf/method/<name>.yaml``): validation fills it in, refuses a
    parameter set for a method that does not read it, clears the ones a renamed method left behind, and
    turns an alias into ``name`` + ``alias`` (specbench/config/methods.py), so ``method.name=static_en`` runs
    what ``method=static_ensemble`` runs.
    """
    fields: list[Any] = [
        ("name", str, MISSING),
        # Optional[...] rather than X | None: runtime types for OmegaConf (noqa: UP045 below).
        ("alias", Optional[str], None),  # noqa: UP045 (the alias the method was asked for: a tag)
    ]
    fields += [(param.name, Optional[param.kind], None) for param in all_params()]  # noqa: UP045
    fields += [
        # dotted path of a VerificationRule subclass: a built-in method's yaml names its class (read by the
        # method table, cleared by validation), a rule from outside the table is built from it
        # (specbench.targets)
        ("_target_", Optional[str], None),  # noqa: UP045
        ("params", dict[str, Any], field(default_factory=dict)),  # constructor arguments (with ``_target_``)
        ("target", Optional[str], None),  # noqa: UP045 (old spelling of ``_target_``: refused, new one named)
    ]
    config = make_dataclass("MethodConfig", fields)
    config.__doc__ = _method_config.__doc__
    config.__module__ = __name__
    return config


MethodConfig = _method_config()


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
    """Draft-length schedule (methods.md §3.1): ``_target_`` the class (built-in: DraftSchedule, built with
    the keys below; from outside: a class with DraftSchedule's methods, built with ``params``)."""

    _target_: str = DRAFT_SCHEDULE
    name: str = SCHEDULE_DEFAULTS["name"]
    gamma: int = SCHEDULE_DEFAULTS["gamma"]
    max_gamma: int = SCHEDULE_DEFAULTS["max_gamma"]
    confidence_threshold: float = SCHEDULE_DEFAULTS["confidence_threshold"]
    profile: str | None = None  # cost_aware: a task=profile file; null: the cached one; measure: measure now
    learn_costs: bool = SCHEDULE_DEFAULTS["learn_costs"]  # cost_aware: re-estimate them from the run's rounds
    params: dict[str, Any] = field(default_factory=dict)  # a schedule from outside: its constructor arguments


@dataclass
class GenConfig:
    max_new_tokens: int = GENERATION_DEFAULTS["max_new_tokens"]
    temperature: float = GENERATION_DEFAULTS["temperature"]
    top_k: int = GENERATION_DEFAULTS["top_k"]
    top_p: float = GENERATION_DEFAULTS["top_p"]
    seed: int = GENERATION_DEFAULTS["seed"]
    batch_size: int = 1


@dataclass
class DatasetConfig:
    """Prompt set and its quality metric (specbench/data/dataset_specs.py; conf/dataset/*.yaml).

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
    subset: str = "all"  # all | train | heldout: a fixed split by prompt id (train on one, test on the other)
    heldout_fraction: float = 0.2  # share of prompts in the heldout part (subset=train|heldout)


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
class SynthConfig:
    """``task=synth`` (methods.md §6): verifier samples for distillation / SD² training."""

    output_dir: str | None = None  # None: the Hydra run dir; the dataset is saved under <output_dir>/dataset
    target_len: int = 256  # total tokens per sequence (prompt + generated)
    max_prompt_len: int = 192  # longer prompts are skipped (counted in the metadata), never truncated
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    batch_size: int = 16
    validation_fraction: float = 0.05  # rows (by source row id) that go to the validation split
    num_shards: int = 1  # a SLURM array: job shard_id samples prompts i with i % num_shards == shard_id
    shard_id: int = 0
    resume: bool = True  # a rerun into the same output dir samples only the prompts not done yet
    compress: bool = False  # a finished shard's rows file becomes rows-shard{i}-of-{n}.jsonl.gz (to commit)
    responses_per_prompt: int = 1  # sampled responses per prompt (T > 0 gives different ones)
    max_new_tokens: int | None = None  # cap on generated tokens per row (None: up to target_len in all)
    # Who samples the responses (specbench/serving, docs/scaling.md): hf (this process) | openai | vllm
    backend: str = "hf"
    server_url: str | None = None  # openai / vllm: http://HOST:PORT of an OpenAI-compatible server
    server_model: str | None = None  # None: the one model the server lists
    concurrency: int = 64  # requests in flight
    request_timeout_s: float = 600.0
    max_retries: int = 3
    token_ids: str = "server"  # server: exact ids from the server | retokenize: re-encode its text (checked)


@dataclass
class TrainConfig:
    """``task=train``: SD² / distillation (methods.md §4) and the DIVERSED head (§5), with Lightning."""

    data: str | None = None  # sd2 / distill: task=synth output dir(s), comma separated (shards are merged)
    output_dir: str | None = None  # None: the Hydra run dir; checkpoints under <output_dir>/checkpoints
    max_steps: int = 1000  # optimiser steps
    batch_size: int = 8
    accumulate_grad_batches: int = 1
    lr_start: float = 1e-5
    lr_end: float = 1e-6
    warmup_steps: int = 100  # linear warm-up to lr_start, then cosine decay to lr_end
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    loss: str = "kl"  # kl = KL(p_V || q_D) | rkl = KL(q_D || p_V) | tvd
    offset: str = "random"  # random: one steering offset in [1, k] per batch | blocked: per-round blocks
    max_offset: int = 8  # k: the largest distance from the steering source (the decoding gamma)
    lora_rank: int = 16  # steering.finetune_drafter=lora
    lora_alpha: int = 32
    val_every_steps: int = 100  # validation (loss, TVD, speculative tau) every this many steps
    val_batches: int = 4  # validation batches for loss / TVD (0: all)
    val_prompts: int = 4  # validation prompts decoded with speculative decoding for tau (0: skip)
    checkpoint_every_steps: int = 100  # last.ckpt every this many steps (requeue / resume)
    # trained.pt = the validation step with the best value of this val/ metric (e.g. val/tau_estimate); the
    # last step's weights go to final.pt. null: trained.pt is the last step. select_mode: max | min.
    select_by: str | None = None
    select_mode: str = "max"
    # eagle3 / dflash (specbench/training/data_budget.py): train on the first rows of a permutation seeded by
    # data_seed whose generated tokens reach data_tokens (null: every row; the same order for every budget,
    # so budgets nest; validation stays whole); drop_heldout_overlap leaves out rows whose prompt overlaps a
    # held-out Spec-Bench question or a demo prompt (exactly or by an 8-gram).
    data_tokens: int | None = None
    data_seed: int = 0
    drop_heldout_overlap: bool = False
    resume: bool = True  # continue from <output_dir>/checkpoints/last.ckpt when it exists
    devices: Any = 1  # Lightning devices ("auto", an int, or a list of GPU ids)
    strategy: str = "auto"  # Lightning strategy: auto | ddp | ...
    precision: str | None = None  # None: bf16-mixed on GPU, 32-true on CPU
    num_workers: int = 0
    seed: int = 0
    # DIVERSED head (method=diversed)
    rollout_temperature: float = 1.0  # > 0: on-policy sampled rollouts (unbiased REINFORCE); 0: greedy
    rollouts_per_prompt: int = 1
    baseline_ema: float = 0.9  # EMA of the reward baseline b
    regularizer: str = "tv"  # tv: -lambda * mean(1 - TV(q, pi)) | l2: (mean w_draft - target_weight)^2
    regularizer_weight: float = 0.1
    # task: the dataset's per-sample scorer | verifier_logp: verifier's mean log-likelihood per rollout token
    # (REINFORCE) | expected_verifier_logp: its exact per-token expectation under the pool (differentiable)
    # | per_token_gate: cross-entropy to that objective's per-token optimum at lambda = regularizer_weight
    reward: str = "auto"  # auto: task where the dataset has a metric, else per_token_gate (validate_train)
    reward_weight: float = 1.0  # scale of the REINFORCE term (0: the regulariser alone)
    target_weight: float = 0.5  # l2 regulariser target draft weight
    # EAGLE-3 head (method=eagle3; docs/eagle3.md)
    draft_vocab_size: int | None = 8192  # most frequent response tokens of train.data (None: full vocabulary)
    taps: list[int] | None = None  # verifier taps (None: EAGLE-3's (2, N//2, N-3))
    ttt_steps: int = 7  # training-time test: steps unrolled on the head's own outputs
    loss_decay: float = 0.8  # weight of step i: loss_decay^i
    ttt_chain_fraction: float = 1.0  # share of chains unrolled past step 0 (anchored TTT; 1: all)
    freeze_lm_head: bool = False  # keep the head's LM head at the verifier's rows
    init_layer: str = "random"  # random | verifier_last: the decoder layer starts as the verifier's last one
    init_head: str | None = None  # a trained head (trained.pt / last.ckpt) to start from, e.g. on more data
    # DFlash draft network (method=dflash; docs/dflash.md). init_layer (above) also applies.
    dflash_layers: int = 1  # draft decoder layers (z-lab's Qwen3-8B drafter: 5)
    dflash_taps: list[int] | None = None  # z-lab target_layer_ids: the verifier layers tapped (None: spread)
    dflash_block_size: int = 16  # block slots: the last token + block_size - 1 masks (drafts per forward)
    dflash_mask_token_id: int | None = None  # the verifier's mask token row (None: a learned mask embedding)
    dflash_anchors: int = 32  # blocks (random anchors) per sequence and step (SpecForge: 512)
    dflash_loss_gamma: float | None = 7.0  # slot k weighted exp(-(k-1)/gamma) (paper: 7/5/4 for W 16/10/8)
    dflash_draft_vocab_size: int | None = None  # LM head: most frequent response tokens (None: all; z-lab)
    # The verifier-feature cache (eagle3, dflash, distill, sd2;
    # docs/training.md#verifier-feature-cache-and-draft-vocabulary)
    feature_cache: str | None = None  # DIR: verifier taps + targets computed once, shared by trainings
    feature_top_k: int | None = None  # targets: top-k of the verifier's draft-vocab distribution (None: all)
    feature_batch_size: int = 8  # rows per verifier forward when the cache is built


@dataclass
class ProfileConfig:
    """``task=profile``: the verifier's time v(n) for n new tokens and the drafter's cost per drafted
    token."""

    output: str | None = None  # the profile file (None: <run dir>/profile.json)
    max_n: int | None = None  # n = 1..max_n (None: schedule.max_gamma + 1)
    context_len: int = 256  # tokens already cached when v(n) is timed
    repeats: int = 7  # timings per n (median)
    draft_prompts: int = 2  # demo prompts decoded to time the drafter


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
    tp_plan: str | None = None  # auto: transformers tensor parallel under torchrun (docs/scaling.md)


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
    synth: SynthConfig = field(default_factory=SynthConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    runtime: RuntimeConfig = field(default_factory=RuntimeConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
