"""The one place that touches a model's KV cache (methods.md §3.3).

``CachedModel`` runs a causal LM over a batch whose rows have different lengths. It keeps, next to
the transformers ``DynamicCache`` (whose layers append in place: :mod:`specbench.decoding.kv_buffer`), a
boolean ``valid`` mask over cache slots: left padding and rejected drafts are invalid slots, masked out of
attention and skipped by the per-row position ids.
After a round ``keep(counts)`` invalidates everything past each row's committed length, crops the
columns no row uses and, when rows have holes, re-aligns them to the right so that no rejected token
stays in the attended context or wastes attention compute.

A caller that needs only some logits (a model drafter over a reduced draft vocabulary) passes its own
``lm_head``: the model's body then runs without the model's LM head, and ``lm_head`` turns the final-normed
last hidden state into the logits it wants.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache, PreTrainedModel

from specbench.decoding.kv_buffer import buffered_cache
from specbench.decoding.tree import tree_structure
from specbench.models.row_invariant import ROWWISE_ATTENTION
from specbench.models.taps import record_states


@dataclass
class ForwardOutput:
    logits: torch.Tensor | None  # (B, W, vocab) float32, sliced to the shared vocabulary (or what ``lm_head``
    # gives); None for a forward asked for no logits (a prefill: the body alone runs)
    hidden: torch.Tensor | None  # (B, W, H) last hidden state: the LM head's input (final-normed)
    taps: dict[int, torch.Tensor] = field(
        default_factory=dict
    )  # residual-stream taps (specbench.models.taps)


class CachedModel:
    """A causal LM with its own KV cache and per-row slot validity.

    ``lm_head``: None runs the whole model (logits sliced to ``vocab_size`` columns); a callable runs only
    the model's body (``model.base_model``, whose output is the final-normed last hidden state) and
    ``lm_head(hidden (B, W, H))`` gives the logits (``vocab_size`` is then the width it returns).
    """

    def __init__(
        self,
        model: PreTrainedModel,
        vocab_size: int,
        lm_head: Callable[[torch.Tensor], torch.Tensor] | None = None,
    ):
        self.model = model
        self.vocab_size = vocab_size
        self.lm_head = lm_head
        self.device = next(model.parameters()).device
        self.cache: DynamicCache | None = None
        self.valid = torch.zeros(0, 0, dtype=torch.bool, device=self.device)

    def reset(self, batch_size: int) -> None:
        self.cache = buffered_cache(self.model.config)
        self.valid = torch.zeros(batch_size, 0, dtype=torch.bool, device=self.device)

    @property
    def num_valid(self) -> torch.Tensor:
        """(B,) number of tokens of each row held in the cache."""
        return self.valid.sum(dim=1)

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        input_valid: torch.Tensor | None = None,
        output_hidden: bool = False,
        output_taps: Sequence[int] = (),
        tree_parents: torch.Tensor | None = None,
        logits: bool = True,
        **model_inputs: torch.Tensor,
    ) -> ForwardOutput:
        """Append ``input_ids`` (B, W) to the cache; ``input_valid`` marks padding columns as False.

        ``output_hidden``: also return the last hidden state; ``output_taps``: the residual-stream taps
        with these indices (both as defined in :mod:`specbench.models.taps`). ``tree_parents`` (B, W−1):
        the columns are a draft tree over column 0 (:mod:`specbench.decoding.tree`), each attending to the
        cache and its ancestors at position ``cached + depth``. ``model_inputs`` are passed to the model's
        forward as they are (e.g. per-position features of a drafter head). ``logits=False``: run the model's
        body only (no LM head; what a prefill whose logits nobody reads needs: the LM head over a long prompt
        costs about as much as the body does)."""
        if input_valid is None:
            input_valid = torch.ones_like(input_ids, dtype=torch.bool)
        if tree_parents is None:
            positions = self.num_valid.unsqueeze(1) + input_valid.long().cumsum(dim=1) - 1
            positions = positions.clamp(min=0)
            attention = torch.cat([self.valid, input_valid], dim=1).long()
        else:
            positions, attention = self._tree_inputs(tree_parents)
        inputs = {"input_ids": input_ids, "attention_mask": attention, "position_ids": positions}
        whole = self.lm_head is None and logits
        with record_states(self.model, output_taps, output_hidden and whole) as states:
            if whole:
                out = self.model(**inputs, cache=self.cache, use_cache=True, **model_inputs)
                scores, hidden = out.logits[..., : self.vocab_size].float(), states.last
            else:  # the body only: its output is the LM head's input
                body = self.model.base_model(**inputs, cache=self.cache, use_cache=True, **model_inputs)
                hidden = body.last_hidden_state
                scores = None if not logits else self.lm_head(hidden).float()
        self.valid = torch.cat([self.valid, input_valid], dim=1)
        return ForwardOutput(logits=scores, hidden=hidden if output_hidden else None, taps=states.taps)

    def _tree_inputs(self, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Position ids and the 4D attention mask of a tree forward (transformers passes 4D masks as they
        are)."""
        ancestors, depth = tree_structure(parents)
        batch, width = depth.shape
        cached = self.valid.unsqueeze(1).expand(batch, width, -1)
        allowed = torch.cat([cached, ancestors], dim=2).unsqueeze(1)  # (B, 1, W, cache + W)
        implementation = getattr(self.model.config, "_attn_implementation", None)
        if implementation == "eager":
            dtype = next(self.model.parameters()).dtype
            blocked = torch.full(allowed.shape, torch.finfo(dtype).min, dtype=dtype, device=allowed.device)
            mask = blocked.masked_fill(allowed, 0.0)
        elif implementation in ("sdpa", ROWWISE_ATTENTION):
            mask = allowed
        else:
            raise ValueError(
                f"tree drafts need sdpa or eager attention; this model uses {implementation!r} "
                "(load it with attn_implementation='sdpa')"
            )
        return self.num_valid.unsqueeze(1) + depth, mask

    def reorder_last(self, order: torch.Tensor) -> None:
        """Permute each row's last ``W = order.shape[1]`` cache slots (the newest forward's columns) by
        ``order`` (B, W): a tree round puts its accepted path first, so that ``keep`` then keeps a chain.
        Only those W slots per layer are copied."""
        width = order.shape[1]
        if bool((order == torch.arange(width, device=order.device)).all()):
            return  # the path is already in front (it is the chain): nothing moves
        for layer in self._layers():
            here = order.to(layer.keys.device)
            for name in ("keys", "values"):
                cached = getattr(layer, name)
                index = here[:, None, :, None].expand(-1, cached.shape[1], -1, cached.shape[-1])
                cached[:, :, -width:] = torch.gather(cached[:, :, -width:], 2, index)
        self.valid[:, -width:] = torch.gather(self.valid[:, -width:], 1, order.to(self.valid.device))

    def keep(self, counts: torch.Tensor) -> None:
        """Keep only the first ``counts[b]`` cached tokens of each row; drop the rest from attention."""
        kept = self.valid & (self.valid.long().cumsum(dim=1) <= counts.unsqueeze(1))
        self.valid = kept
        self._compact()

    def select_rows(self, rows: torch.Tensor) -> None:
        """Keep only the given batch rows (finished sequences leave the batch)."""
        for layer in self._layers():
            # Each layer's cache lives on that layer's device (a device_map spreads layers over GPUs).
            here = rows.to(layer.keys.device)
            layer.keys = layer.keys[here]
            layer.values = layer.values[here]
        self.valid = self.valid[rows]
        self._compact()

    def _layers(self):
        layers = [layer for layer in self.cache.layers if getattr(layer, "is_initialized", False)]
        for layer in layers:
            if getattr(layer, "is_sliding", False):
                raise NotImplementedError(
                    "sliding-window cache layers cannot be re-aligned; use a model without sliding-window "
                    "attention"
                )
        return layers

    def _compact(self) -> None:
        # Crop first: a row's rejected drafts at the end of the cache are then gone without touching the
        # others (batch 1 never needs the re-alignment, a copy of every layer's cache); re-align only the
        # holes that remain (a row's invalid slots before slots another row still uses).
        if not self._crop():
            return
        holes = bool((self.valid.long().cumsum(dim=1) > 0).logical_and(~self.valid).any())
        if holes:
            # Stable sort puts each row's invalid slots first, valid slots after, in order.
            order = torch.sort(self.valid.long(), dim=1, stable=True).indices
            self.valid = torch.gather(self.valid, 1, order)
            for layer in self._layers():
                here = order.to(layer.keys.device)
                index = here[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[-1])
                layer.keys = torch.gather(layer.keys, 2, index)
                index = here[:, None, :, None].expand(-1, layer.values.shape[1], -1, layer.values.shape[-1])
                layer.values = torch.gather(layer.values, 2, index)
            self._crop()

    def _crop(self) -> bool:
        """Drop the leading and trailing columns no row uses (reset when none is used); False if empty."""
        used_columns = self.valid.any(dim=0)
        if used_columns.numel() == 0:
            return False
        if not bool(used_columns.any()):
            self.reset(self.valid.shape[0])
            return False
        first = int(used_columns.nonzero()[0])
        last = int(used_columns.nonzero()[-1]) + 1
        if first > 0 or last < self.valid.shape[1]:
            for layer in self._layers():
                layer.keys = layer.keys[:, :, first:last]
                layer.values = layer.values[:, :, first:last]
            self.valid = self.valid[:, first:last]
        return True
