"""SD² drafter steering (methods.md §4): verifier features steer the drafter's MLPs through hooks.

``SteeringHead`` maps the concatenated verifier features at ``v_layers`` (low, mid, high) to one
offset per steered drafter layer: fusion W_hml (initialised to [I | I | I], zero bias), LayerNorm,
then W_s (zero-initialised, optionally low rank). ``SteeredDrafter`` registers forward hooks on a
stock transformers drafter: ``merged`` adds the offset to ``mlp.up_proj``'s output, so the MLP is
down(act(gate(x)) ⊙ (up(x) + δ)); ``simple`` adds it to the MLP's output. The hooks act only inside
``steer(deltas)``, so a drafter that shares modules with the verifier (early exit) never steers the
verifier's own forward passes.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

GUIDE_METHODS = ("merged", "simple")


@dataclass(frozen=True)
class SteeringSpec:
    """The architecture of a steering head; stored in checkpoints."""

    v_layers: tuple[int, ...]
    guide_method: str
    d_layers: tuple[int, ...]
    rank: int | None
    verifier_hidden: int
    out_size: int

    def to_dict(self) -> dict:
        return {**asdict(self), "v_layers": list(self.v_layers), "d_layers": list(self.d_layers)}

    @classmethod
    def from_dict(cls, data: dict) -> SteeringSpec:
        return cls(
            v_layers=tuple(data["v_layers"]),
            guide_method=data["guide_method"],
            d_layers=tuple(data["d_layers"]),
            rank=data["rank"],
            verifier_hidden=data["verifier_hidden"],
            out_size=data["out_size"],
        )


class SteeringHead(nn.Module):
    """Verifier features (..., n_features·H_V) → per-layer offsets (..., n_layers, out_size)."""

    def __init__(
        self, verifier_hidden: int, num_features: int, num_layers: int, out_size: int, rank: int | None = None
    ):
        super().__init__()
        self.num_layers, self.out_size = num_layers, out_size
        self.fusion = nn.Linear(num_features * verifier_hidden, verifier_hidden)
        with torch.no_grad():
            self.fusion.weight.copy_(torch.eye(verifier_hidden).repeat(1, num_features))
            self.fusion.bias.zero_()
        self.norm = nn.LayerNorm(verifier_hidden)
        width = verifier_hidden
        self.down = None
        if rank is not None:
            self.down = nn.Linear(verifier_hidden, rank, bias=False)
            width = rank
        self.project = nn.Linear(width, num_layers * out_size, bias=False)
        nn.init.zeros_(self.project.weight)  # step 0: the steered drafter is exactly the pretrained one

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        hidden = self.norm(self.fusion(features))
        if self.down is not None:
            hidden = self.down(hidden)
        return self.project(hidden).unflatten(-1, (self.num_layers, self.out_size))


def decoder_mlps(model: PreTrainedModel) -> list[nn.Module]:
    """The MLP of every decoder layer; each must have gate_proj / up_proj / down_proj."""
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise TypeError(f"SD² steering needs a decoder-only model with `layers`; got {type(model).__name__}")
    mlps = []
    for index, layer in enumerate(layers):
        mlp = getattr(layer, "mlp", None)
        if mlp is None or not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
            raise TypeError(
                f"SD² steering needs gate/up/down MLPs (Llama, Qwen3, ...); layer {index} of "
                f"{type(model).__name__} has {type(mlp).__name__}"
            )
        mlps.append(mlp)
    return mlps


def verifier_depth(model: PreTrainedModel) -> int:
    return int(model.config.num_hidden_layers)


def resolve_spec(
    verifier: PreTrainedModel,
    drafter: PreTrainedModel,
    v_layers: Sequence[int],
    guide_method: str = "merged",
    d_layers: Sequence[int] | str = "all",
    rank: int | None = None,
) -> SteeringSpec:
    """Check the steering settings against the two models and fill in sizes."""
    depth = verifier_depth(verifier)
    v_layers = tuple(int(i) for i in v_layers)
    if (
        len(v_layers) != 3
        or list(v_layers) != sorted(set(v_layers))
        or v_layers[0] < 0
        or v_layers[-1] > depth
    ):
        raise ValueError(
            f"steering.v_layers must be three ascending indices into the verifier's hidden states "
            f"(0 = embeddings .. {depth} = last layer; the verifier has {depth} layers), got {list(v_layers)}"
        )
    if guide_method not in GUIDE_METHODS:
        raise ValueError(f"steering.guide_method must be one of {list(GUIDE_METHODS)}, got {guide_method!r}")
    mlps = decoder_mlps(drafter)
    if d_layers == "all":
        d_layers = tuple(range(len(mlps)))
    else:
        d_layers = tuple(int(i) for i in d_layers)
        bad = [i for i in d_layers if not 0 <= i < len(mlps)]
        if bad or not d_layers or len(set(d_layers)) != len(d_layers):
            raise ValueError(
                f"steering.d_layers must be distinct drafter layer indices in [0, {len(mlps)}), got "
                f"{list(d_layers)}"
            )
    if rank is not None and rank < 1:
        raise ValueError(f"steering.rank must be >= 1 or null, got {rank}")
    out_size = mlps[0].up_proj.out_features if guide_method == "merged" else drafter.config.hidden_size
    return SteeringSpec(
        v_layers, guide_method, d_layers, rank, int(verifier.config.hidden_size), int(out_size)
    )


def verifier_features(taps: Mapping[int, torch.Tensor], v_layers: Sequence[int]) -> torch.Tensor:
    """Concatenate the verifier's taps at ``v_layers`` (ascending; see :mod:`specbench.models.taps`:
    index 0 = embeddings, i = residual stream after i layers, before the final norm)."""
    return torch.cat([taps[i] for i in v_layers], dim=-1)


class SteeredDrafter(nn.Module):
    """A drafter with SD² steering hooks and the steering head that feeds them."""

    def __init__(self, drafter: PreTrainedModel, spec: SteeringSpec):
        super().__init__()
        self.spec = spec
        self.head = SteeringHead(
            spec.verifier_hidden, len(spec.v_layers), len(spec.d_layers), spec.out_size, spec.rank
        )
        param = next(drafter.parameters())
        self.head.to(device=param.device, dtype=torch.float32)
        self._drafter = [drafter]  # not a submodule: the drafter's weights are not the head's
        self._deltas: torch.Tensor | None = None
        self._handles = []
        self.install(drafter)

    @property
    def drafter(self) -> PreTrainedModel:
        return self._drafter[0]

    def install(self, drafter: PreTrainedModel) -> None:
        """(Re)attach the hooks to ``drafter`` (e.g. a trainable copy, or one with LoRA adapters)."""
        self.remove()
        self._drafter = [drafter]
        mlps = decoder_mlps(drafter)
        for slot, layer in enumerate(self.spec.d_layers):
            target = mlps[layer].up_proj if self.spec.guide_method == "merged" else mlps[layer]
            self._handles.append(target.register_forward_hook(self._hook(slot)))

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _hook(self, slot: int):
        def add_offset(module, args, output):
            if self._deltas is None:
                return None
            delta = self._deltas[..., slot, :]
            if delta.dim() == 2:  # one offset per row, for every position of this forward
                delta = delta.unsqueeze(1)
            return output + delta.to(output.dtype)

        return add_offset

    def deltas(self, features: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Offsets (..., n_layers, out) from features (..., 3·H_V); rows/positions with mask False get 0."""
        out = self.head(features.float())
        if mask is not None:
            out = out * mask.to(out.dtype)[..., None, None]
        return out

    @contextlib.contextmanager
    def steer(self, deltas: torch.Tensor | None) -> Iterator[None]:
        """Within the block, the drafter's steered MLPs add ``deltas``: (B, L, out) or (B, T, L, out)."""
        previous = self._deltas
        self._deltas = deltas
        try:
            yield
        finally:
            self._deltas = previous

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.head.parameters())
