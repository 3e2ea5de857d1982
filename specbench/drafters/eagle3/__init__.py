"""EAGLE-3: a one-layer draft head on verifier taps (docs/eagle3.md).

``head``: the head (layers, one step, the test-time-training mask); ``drafter``: the
:class:`~specbench.drafters.base.Drafter` around it; ``checkpoint``: specbench's own trained checkpoints;
``format``: the public EAGLE / SpecForge layout (export, load) and :func:`eagle3_drafter`, the factory a
``model/drafter`` yaml names. The names below are importable from the package, so a config's
``target: specbench.drafters.eagle3.Eagle3Drafter`` (or ``.eagle3_drafter``) keeps working.
"""

from specbench.drafters.eagle3.checkpoint import compact_checkpoint, load_trained_eagle3, verifier_identity
from specbench.drafters.eagle3.drafter import Eagle3Drafter
from specbench.drafters.eagle3.format import (
    Eagle3FormatError,
    eagle3_drafter,
    export_eagle3,
    load_eagle3_drafter,
    load_eagle3_pretrained,
)
from specbench.drafters.eagle3.head import Eagle3Head, default_taps, resolve_taps

__all__ = [
    "Eagle3Drafter",
    "Eagle3FormatError",
    "Eagle3Head",
    "compact_checkpoint",
    "default_taps",
    "eagle3_drafter",
    "export_eagle3",
    "load_eagle3_drafter",
    "load_eagle3_pretrained",
    "load_trained_eagle3",
    "resolve_taps",
    "verifier_identity",
]
