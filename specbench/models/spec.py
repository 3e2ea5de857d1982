"""What model to load, as plain data: importable without torch, so configs are checked before torch loads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specbench.models.embedded import EMBEDDED_NAME

# ``drafter``: a drafter that is not (only) a transformers model — a class or factory named by ``_target_``
# (e.g. specbench.drafters.prompt_lookup.PromptLookupDrafter), built with ``params`` (specbench.targets).
KINDS = ("hub", "local", "embedded", "tiny_random", "early_exit", "drafter", "none")
# The kinds a drafter may be as a transformers model (a ModelDrafter), which a reduced draft vocabulary fits.
MODEL_KINDS = ("hub", "local", "embedded", "tiny_random", "early_exit")


@dataclass
class ModelSpec:
    """What model to load; mirrors the ``model/verifier`` and ``model/drafter`` config groups."""

    kind: str
    name: str = ""
    path: str | None = None
    revision: str | None = None
    arch: str = "llama"
    num_layers: int | None = None
    hidden_size: int = 64
    vocab_size: int = 320
    seed: int = 0
    trust_remote_code: bool = False
    # kind=drafter: the dotted path of a Drafter class (or a factory returning one) and its arguments, built
    # by Hydra's instantiate (specbench.targets.build_target). A factory that takes ``verifier`` /
    # ``vocab_size`` receives the loaded verifier and the shared vocabulary.
    _target_: str | None = None
    params: dict[str, Any] = field(default_factory=dict)
    target: str | None = None  # the old spelling of ``_target_``: refused with the new one named
    # Where the weights go (specbench.models.sharding): accelerate's device_map (auto, balanced, a dict),
    # its max_memory, and the folder for weights offloaded to disk.
    device_map: Any = None
    max_memory: Any = None
    offload_folder: str | None = None
    # A model drafter's reduced draft vocabulary (docs/draft-vocab.md): ``draft_vocab`` is a task=synth output
    # dir to count the most frequent response tokens from, or a checkpoint that saved one (an EAGLE-3
    # trained.pt); ``draft_vocab_size`` how many tokens (null: the full vocabulary, or the saved one's size).
    draft_vocab_size: int | None = None
    draft_vocab: str | None = None
    # A model drafter drafting trees (docs/eagle3.md, tree drafts): > 1 adds its next tree_width - 1 tokens as
    # leaves at each depth of its chain; verified by the exact sd rule only.
    tree_width: int = 1
    # A drafter's own draft length: what schedule=constant drafts per round unless schedule.gamma is given
    # (a lookup drafter's long chains want 10, a small model 3).
    default_gamma: int = 3

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"Unknown model kind {self.kind!r}: expected one of {KINDS}.")


def model_name(spec: ModelSpec, verifier_name: str | None = None) -> str:
    """The name the loader gives a model of ``spec`` (``LoadedModel.name``), known before it loads.

    An early-exit drafter is named after its verifier (``verifier_name``). Trained checkpoints store these
    names, so a checkpoint made for another pair can be refused before any weights are read.
    """
    if spec.name:
        return spec.name
    if spec.kind == "embedded":
        return EMBEDDED_NAME
    if spec.kind == "early_exit":
        return f"{verifier_name}[:{spec.num_layers}] (early exit)"
    return spec.path or spec.kind
