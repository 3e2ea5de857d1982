"""Defaults, allowed values and range checks of settings, torch-free and import-light: the one owner of each.

The config schema (``specbench/config/schema.py``) and the library classes (``DraftSchedule``,
``GenerationSettings``) take their defaults and checks from here, so a bad value reads the same from
``launch.py`` (before torch is imported) and from Python; the verification rules, ``resolve_device`` /
``resolve_dtype`` check their own values and tests/test_startup.py holds both to the same verdicts.
"""

from __future__ import annotations

import re
from typing import Any

SCHEDULES = ("constant", "heuristic", "dynamic", "cost_aware")
# The defaults of the schedule and generation settings, for the config schema and the library classes alike.
# The built-in schedules' class (schedule._target_); another _target_ is a schedule from outside, built with
# schedule.params.
DRAFT_SCHEDULE = "specbench.decoding.schedules.DraftSchedule"
SCHEDULE_DEFAULTS = {
    "name": "constant", "gamma": 3, "max_gamma": 16, "confidence_threshold": 0.4, "learn_costs": True,
}  # fmt: skip
GENERATION_DEFAULTS = {"max_new_tokens": 64, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0}
POOLS = ("linear", "log_linear")
EAGLE3_INIT_LAYERS = ("random", "verifier_last")  # train.init_layer
TRAIN_LOSSES = ("kl", "rkl", "tvd")  # train.loss (distill / sd2)
TOP_K_RKL = (  # train.loss=rkl with top-k targets (p is 0 outside the top-k)
    "train.loss=rkl needs the verifier's full distribution: with train.feature_top_k it is 0 outside the "
    "top-k and KL(q||p) is infinite; use train.loss=kl or tvd, or train.feature_top_k=null"
)
TRAIN_OFFSETS = ("random", "blocked")  # train.offset
DIVERSED_REGULARIZERS = ("tv", "l2")  # train.regularizer
# train.reward (DIVERSED): the dataset's scorer or the verifier's mean rollout log-likelihood (REINFORCE),
# or its exact per-token expectation under the pool (expected_verifier_logp: no sampling variance)
# per_token_gate: supervised, the head learns that objective's per-token optimum w_t = 1[Δ_t < λ·TV_t]
# auto (config default): task where the dataset has a metric, else per_token_gate (resolved before training)
DIVERSED_REWARDS = ("task", "verifier_logp", "expected_verifier_logp", "per_token_gate")
TRAIN_REWARDS = ("auto", *DIVERSED_REWARDS)
DEFERRALS = ("chow", "diff", "opt", "token")
DTYPES = ("auto", "float32", "fp32", "bfloat16", "bf16", "float16", "fp16")
_DEVICE = re.compile(r"^(auto|cpu|cuda|cuda:\d+)$")


def check_schedule(
    name: str, gamma: int, max_gamma: int, confidence_threshold: float, profile: str | None = None,
    learn_costs: bool = True,
) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"schedule.name must be one of {list(SCHEDULES)}, got {name!r}")
    if gamma < 1:
        raise ValueError(f"schedule.gamma must be >= 1, got {gamma}")
    if max_gamma < gamma:
        raise ValueError(f"schedule.max_gamma ({max_gamma}) must be >= schedule.gamma ({gamma})")
    if not 0.0 <= confidence_threshold <= 1.0:
        raise ValueError(f"schedule.confidence_threshold must be in [0, 1], got {confidence_threshold}")
    if not isinstance(learn_costs, bool):
        raise ValueError(f"schedule.learn_costs must be true or false, got {learn_costs!r}")  # noqa: TRY004


def check_generation(
    max_new_tokens: int, temperature: float, top_k: int, top_p: float, seed: int = 0
) -> None:
    if max_new_tokens < 1:
        raise ValueError(f"gen.max_new_tokens must be >= 1, got {max_new_tokens}")
    if temperature < 0:
        raise ValueError(f"gen.temperature must be >= 0 (0 = greedy), got {temperature}")
    if top_k < 0:
        raise ValueError(f"gen.top_k must be >= 0 (0 = off), got {top_k}")
    if not 0.0 < top_p <= 1.0:
        raise ValueError(f"gen.top_p must be in (0, 1], got {top_p}")


def check_draft_vocab_size(size: Any, key: str, vocab_size: int | None = None) -> None:
    """A reduced draft vocabulary's size (null: the full vocabulary); ``vocab_size``: the verifier's, when
    known."""
    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"{key} must be an integer >= 1 or null (the full vocabulary), got {size!r}")
    if vocab_size is not None and size > vocab_size:
        raise ValueError(
            f"{key}={size} exceeds the verifier's vocabulary of {vocab_size} tokens; use at most "
            f"{vocab_size} or null (the full vocabulary)"
        )


def check_tree_width(width: Any, key: str = "tree_width") -> None:
    """How many tokens a tree-drafting drafter proposes per depth (1: a chain of drafts)."""
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise ValueError(f"{key}={width!r}: an integer >= 1 (1: a chain of drafts)")


def check_pool(pool: Any) -> None:
    if pool not in POOLS:
        raise ValueError(f"method.pool: unknown pool {pool!r}; allowed: {list(POOLS)}")


def check_device(name: str) -> None:
    """The format of ``runtime.device``; whether CUDA is there is known once torch is imported."""
    if not _DEVICE.match(str(name).strip().lower()):
        raise ValueError(f"Unknown device {name!r}: expected one of 'auto', 'cpu', 'cuda', 'cuda:N'.")


def check_dtype(name: str) -> None:
    if str(name).strip().lower().removeprefix("torch.") not in DTYPES:
        raise ValueError(f"Unknown dtype {name!r}: expected one of {', '.join(map(repr, DTYPES))}.")
