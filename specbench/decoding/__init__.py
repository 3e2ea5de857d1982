"""Decoding: one engine loop, pure verification rules, draft schedules, the KV-cache adapter, and the
drafter protocol the engine talks to (protocol.py; model_drafter.py: the drafter a plain causal LM
becomes)."""

from specbench.decoding.block import BlockRule
from specbench.decoding.engine import GenerationSettings, RoundRecord, SampleResult, SpeculativeEngine
from specbench.decoding.fly import FlyRule
from specbench.decoding.rules import (
    CascadeRule,
    EnsembleRule,
    LenientRule,
    TypicalRule,
    VerificationRule,
    one_step_distribution,
    pool_distributions,
)
from specbench.decoding.schedules import DraftSchedule
from specbench.decoding.verification import Verdict, verify_round
from specbench.decoding.warping import Warping

__all__ = [
    "BlockRule",
    "CascadeRule",
    "DraftSchedule",
    "EnsembleRule",
    "FlyRule",
    "GenerationSettings",
    "LenientRule",
    "RoundRecord",
    "SampleResult",
    "SpeculativeEngine",
    "TypicalRule",
    "Verdict",
    "VerificationRule",
    "Warping",
    "one_step_distribution",
    "pool_distributions",
    "verify_round",
]
