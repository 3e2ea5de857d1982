"""DIVERSED: learned dynamic ensemble verification (methods.md §5).

A small head reads the drafter's and the verifier's last hidden states (after the final norm) at the
position that predicts each drafted token and gives a per-token draft weight w; the token is then
verified against the pool π = pool(p, q, w) exactly as the static ensemble does (methods.md §2.1). The
bonus token stays pure verifier. Both hidden states come from the forwards the engine runs anyway.

- :class:`WeightHead`: Linear(H_D + H_V → 2) → softmax → (w_draft, w_verifier), equal rows at init
  (w = 0.5 exactly), kept in float32.
- :class:`DiversedRule`: the verification rule (``requires_hidden_states``, ``position_weights``).
- :func:`fresh_diversed_rule` / :func:`load_diversed_rule`: an untrained rule for a pair, or a trained
  head from a ``task=train method=diversed`` checkpoint, refused for another pair
  (:class:`CheckpointMismatchError`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from specbench.decoding.protocol import Drafter
from specbench.decoding.rules import EnsembleRule
from specbench.models.loading import LoadedModel
from specbench.models.pair import CheckpointMismatchError, metadata_differences, tokenizer_hash

METHOD = "diversed"
# Metadata keys that identify the pair a head was trained for (all must match to load it).
PAIR_KEYS = ("verifier", "drafter", "tokenizer_hash", "verifier_hidden_size", "drafter_hidden_size")
# What the head reads. 2: each model's LM-head input (the final-normed last hidden state). Heads written
# before carry no version: they were trained on the final norm applied twice, and are refused.
INPUT_FORMAT_KEY = "head_input_format"
INPUT_FORMAT = 2


class WeightHead(nn.Module):
    """Linear(H_D + H_V → 2) over concat[h_draft ; h_verifier]; softmax gives (w_draft, w_verifier).

    Both output rows start equal, so every input gets w_draft = w_verifier = 0.5 exactly at init.
    Parameters stay float32 whatever the models' dtype; inputs are cast.
    """

    def __init__(self, drafter_hidden_size: int, verifier_hidden_size: int, seed: int = 0) -> None:
        super().__init__()
        self.drafter_hidden_size = int(drafter_hidden_size)
        self.verifier_hidden_size = int(verifier_hidden_size)
        features = self.drafter_hidden_size + self.verifier_hidden_size
        with torch.no_grad(), torch.random.fork_rng(devices=[]):  # seeded; the global RNG is left alone
            torch.manual_seed(seed)
            self.linear = nn.Linear(features, 2, dtype=torch.float32)
            row = nn.Linear(features, 1, dtype=torch.float32)
            self.linear.weight.copy_(row.weight.expand(2, -1))
            self.linear.bias.copy_(row.bias.expand(2))

    def _apply(self, fn, recurse=True):
        # Module.to(dtype) / .half() / .bfloat16() would cast the head: keep it float32.
        result = super()._apply(fn, recurse)
        for param in self.parameters():
            if param.dtype != torch.float32:
                param.data = param.data.float()
        return result

    def logits(self, drafter_hidden: torch.Tensor, verifier_hidden: torch.Tensor) -> torch.Tensor:
        """(..., 2) float32 logits of (draft, verifier)."""
        if (
            drafter_hidden.shape[-1] != self.drafter_hidden_size
            or verifier_hidden.shape[-1] != self.verifier_hidden_size
        ):
            raise ValueError(
                f"WeightHead expects drafter/verifier hidden sizes {self.drafter_hidden_size}/"
                f"{self.verifier_hidden_size}, got {drafter_hidden.shape[-1]}/{verifier_hidden.shape[-1]}"
            )
        device = self.linear.weight.device
        features = torch.cat(
            [drafter_hidden.to(device, torch.float32), verifier_hidden.to(device, torch.float32)], -1
        )
        with torch.autocast(device_type=device.type, enabled=False):  # fp32 also under mixed precision
            return self.linear(features)

    def log_weights(self, drafter_hidden: torch.Tensor, verifier_hidden: torch.Tensor) -> torch.Tensor:
        """(..., 2) log (w_draft, w_verifier)."""
        return torch.log_softmax(self.logits(drafter_hidden, verifier_hidden), dim=-1)

    def forward(self, drafter_hidden: torch.Tensor, verifier_hidden: torch.Tensor) -> torch.Tensor:
        """w_draft (...,) in [0, 1]."""
        return torch.softmax(self.logits(drafter_hidden, verifier_hidden), dim=-1)[..., 0]


class DiversedRule(EnsembleRule):
    """Dynamic ensemble: π_i = pool(p_i, q_i, w_i) with w_i from a :class:`WeightHead` per drafted token.

    ``pool``: ``linear`` (default, π = (1−w)p + wq) or ``log_linear`` (π ∝ q^w p^(1−w), what the DIVERSED
    code ran). w = 0 everywhere is exact SD. ``metadata`` (the checkpoint's) is kept for ``describe``.
    """

    name = METHOD
    requires_hidden_states = True

    def __init__(
        self, head: WeightHead, pool: str = "linear", metadata: Mapping[str, Any] | None = None
    ) -> None:
        super().__init__(0.0, pool)
        self.head = head
        self.metadata = dict(metadata or {})

    @property
    def lossless(self) -> bool:
        return False

    def target(self, p, q, weights=None):
        if weights is None:
            raise ValueError(
                "DiversedRule needs per-position draft weights (from position_weights); the engine passes "
                "them"
            )
        return super().target(p, q, weights)

    @torch.no_grad()
    def position_weights(self, drafter_hidden: torch.Tensor, verifier_hidden: torch.Tensor) -> torch.Tensor:
        """(B, γ) draft weights (float32, on the hidden states' device) from the head, without grad."""
        if self.head.linear.weight.device != verifier_hidden.device:
            self.head.to(verifier_hidden.device)
        return self.head(drafter_hidden, verifier_hidden)

    def describe(self) -> dict:
        described: dict[str, Any] = {"rule": self.name, "pool": self.pool}
        for key in ("head_checkpoint", "trained_steps"):
            if self.metadata.get(key) is not None:
                described[key] = self.metadata[key]
        return described


# -- checkpoints -------------------------------------------------------------------------------------------


def hidden_size(model: LoadedModel | Drafter) -> int:
    """Width of the model's last hidden state (the head's input); a drafter object says it itself."""
    if isinstance(model, Drafter):
        if model.hidden_size is None:
            raise ValueError(
                f"DIVERSED reads the drafter's hidden states, which drafter {model.name!r} does not have; "
                "use a "
                "model drafter or an EAGLE-3 head"
            )
        return int(model.hidden_size)
    config = model.model.config
    size = getattr(config, "hidden_size", None)
    if size is None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "hidden_size", None)
    if size is None:
        raise ValueError(f"cannot tell the hidden size of {model.name!r} from its config")
    return int(size)


def pair_metadata(
    verifier: LoadedModel, drafter: LoadedModel | Drafter, pool: str = "linear"
) -> dict[str, Any]:
    """What identifies the pair a head is made for, as stored in its checkpoint."""
    return {
        "method": METHOD,
        "verifier": verifier.name,
        "drafter": drafter.name,
        "tokenizer_hash": tokenizer_hash(verifier.tokenizer),
        "verifier_hidden_size": hidden_size(verifier),
        "drafter_hidden_size": hidden_size(drafter),
        "vocab_size": len(verifier.tokenizer),
        "pool": pool,
        INPUT_FORMAT_KEY: INPUT_FORMAT,
    }


def check_head_metadata(
    metadata: Mapping[str, Any], expected: Mapping[str, Any], source: str = "the head"
) -> None:
    """Raise :class:`CheckpointMismatchError` unless ``metadata`` was made for the pair of ``expected``."""
    if metadata.get("method") != METHOD:
        raise CheckpointMismatchError(
            f"{source} is not a DIVERSED head (its metadata says method={metadata.get('method')!r}); pass "
            "the "
            "trained.pt or last.ckpt that `task=train method=diversed` wrote"
        )
    if metadata.get(INPUT_FORMAT_KEY) != INPUT_FORMAT:
        raise CheckpointMismatchError(
            f"{source} was trained on an older hidden-state input (format "
            f"{metadata.get(INPUT_FORMAT_KEY)!r}; "
            f"this specbench reads format {INPUT_FORMAT}: the LM head's input, normed once — heads written "
            "before "
            "read the final norm applied twice); train the head again with `python launch.py task=train "
            "method=diversed`"
        )
    details = metadata_differences(metadata, expected, PAIR_KEYS)
    if details:
        raise CheckpointMismatchError(
            f"{source} was trained for verifier {metadata.get('verifier')!r} + drafter "
            f"{metadata.get('drafter')!r}, "
            f"not for this pair, verifier {expected.get('verifier')!r} + drafter {expected.get('drafter')!r} "
            f"({details}); train a head for this pair with `python launch.py task=train "
            "method=diversed` and the same model/verifier and model/drafter, or pick the matching models"
        )


def head_state(state_dict: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The WeightHead weights of a checkpoint's state dict (keys ``head.linear.*`` or ``linear.*``)."""
    state = {}
    for key, value in state_dict.items():
        name = key.removeprefix("head.")
        if name in ("linear.weight", "linear.bias"):
            state[name] = value
    if set(state) != {"linear.weight", "linear.bias"}:
        raise CheckpointMismatchError(
            f"the checkpoint holds no DIVERSED head weights (keys: {sorted(state_dict)[:6]})"
        )
    return state


def fresh_diversed_rule(
    verifier: LoadedModel, drafter: LoadedModel | Drafter, pool: str = "linear", seed: int = 0
) -> DiversedRule:
    """An untrained rule for the pair (w = 0.5 everywhere), on the verifier's device."""
    head = WeightHead(hidden_size(drafter), hidden_size(verifier), seed=seed).to(verifier.model.device)
    return DiversedRule(head, pool, pair_metadata(verifier, drafter, pool))


def load_diversed_rule(
    path: str | Path, verifier: LoadedModel, drafter: LoadedModel | Drafter, pool: str = "linear"
) -> DiversedRule:
    """The trained head of ``path`` (trained.pt or a Lightning .ckpt) as a rule for this pair.

    Raises :class:`CheckpointMismatchError` (a ValueError) for a head made for another pair (names,
    hidden sizes or tokenizer hash differ), FileNotFoundError / ValueError for a missing or foreign file.
    A head trained with the other pool is used as asked, with a warning.
    """
    from specbench.models.checkpoints import read_checkpoint

    state_dict, metadata = read_checkpoint(path)
    expected = pair_metadata(verifier, drafter, pool)
    check_head_metadata(metadata, expected, source=f"method.head_checkpoint {str(path)!r}")
    state = head_state(state_dict)
    head = WeightHead(metadata["drafter_hidden_size"], metadata["verifier_hidden_size"])
    if tuple(state["linear.weight"].shape) != tuple(head.linear.weight.shape):
        raise CheckpointMismatchError(
            f"method.head_checkpoint {str(path)!r}: head weight of shape "
            f"{tuple(state['linear.weight'].shape)}, "
            f"expected {tuple(head.linear.weight.shape)} for hidden sizes {metadata['drafter_hidden_size']} "
            "+ "
            f"{metadata['verifier_hidden_size']}"
        )
    head.load_state_dict({k: v.float() for k, v in state.items()})
    trained_pool = metadata.get("pool")
    if trained_pool and trained_pool != pool:
        warnings.warn(
            f"method.head_checkpoint {str(path)!r} was trained with pool={trained_pool!r}; decoding with "
            f"pool={pool!r} as configured (method.pool)",
            stacklevel=2,
        )
    head.to(verifier.model.device)
    return DiversedRule(head, pool, {**metadata, "head_checkpoint": str(path)})
