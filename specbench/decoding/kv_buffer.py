"""A KV cache layer that appends in place.

transformers' ``DynamicLayer`` appends a forward's keys and values with ``torch.cat``, which copies the whole
cache on every forward, so a step's cost grows with batch x context even where attention does not need it to
(benchmarks/kv_cache.py measures both side by side). ``BufferedLayer`` keeps each layer's keys and values in a
buffer with room to grow and hands attention views of its live columns: an append writes only the new
columns. It grows by at least half its size when full (an amortised copy), and the views keep the layout
attention reads: the last dimension contiguous, one head's keys in consecutive rows.

Whatever assigns ``layer.keys`` / ``layer.values`` (``CachedModel``'s crop, re-alignment and row selection,
transformers' ``batch_select_indices`` or ``crop``) still works: a column slice of the live view only moves
the live window, and any other tensor is copied into the buffer when it fits, into a new one when it does
not.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

MIN_GROWTH = 256  # columns added when the buffer is full, at least


class _Buffer:
    """One (B, H, capacity, D) tensor and its live columns ``start:end``."""

    def __init__(self, like: torch.Tensor, capacity: int):
        self.data = like.new_empty(*like.shape[:2], capacity, like.shape[3])
        self.start = self.end = 0

    @property
    def view(self) -> torch.Tensor:
        return self.data[:, :, self.start : self.end]

    def append(self, states: torch.Tensor) -> None:
        width = states.shape[2]
        if states.shape[:2] != self.data.shape[:2] or states.shape[3] != self.data.shape[3]:
            raise ValueError(f"cache append of shape {tuple(states.shape)} into {tuple(self.data.shape)}")
        if self.end + width > self.data.shape[2]:
            live = self.end - self.start
            self._move(self.view, live + width + max(MIN_GROWTH, (live + width) // 2))
        self.data[:, :, self.end : self.end + width] = states
        self.end += width

    def assign(self, tensor: torch.Tensor) -> None:
        """Make ``tensor`` the live columns: a column window of the live view in place, else a copy."""
        window = self._window_of(tensor)
        if window is not None:
            self.start, self.end = window
        elif (
            tensor.shape[0] == self.data.shape[0]
            and tensor.shape[2] <= self.data.shape[2]
            and tensor.untyped_storage().data_ptr() != self.data.untyped_storage().data_ptr()
        ):
            self.data[:, :, : tensor.shape[2]] = tensor
            self.start, self.end = 0, tensor.shape[2]
        else:
            self._move(tensor, tensor.shape[2] + MIN_GROWTH)

    def _move(self, live: torch.Tensor, capacity: int) -> None:
        data = live.new_empty(*live.shape[:2], capacity, live.shape[3])
        data[:, :, : live.shape[2]] = live
        self.data, self.start, self.end = data, 0, live.shape[2]

    def _window_of(self, tensor: torch.Tensor) -> tuple[int, int] | None:
        data = self.data
        if (
            tensor.untyped_storage().data_ptr() != data.untyped_storage().data_ptr()
            or tensor.shape[:2] != data.shape[:2]
            or tensor.shape[3] != data.shape[3]
            or tensor.stride() != data.stride()
            or tensor.dtype != data.dtype
        ):
            return None
        offset = tensor.storage_offset() - data.storage_offset()
        start, rest = divmod(offset, data.stride(2))
        if rest or not self.start <= start <= start + tensor.shape[2] <= self.end:
            return None
        return start, start + tensor.shape[2]


class BufferedLayer(DynamicLayer):
    """``DynamicLayer`` whose appends write into a preallocated buffer instead of concatenating."""

    def __init__(self, **kwargs):
        self._buffers: dict[str, _Buffer | None] = {"keys": None, "values": None}
        super().__init__(**kwargs)

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.device = key_states.device
        width = key_states.shape[2]
        self._buffers = {
            "keys": _Buffer(key_states, width + MIN_GROWTH),
            "values": _Buffer(value_states, width + MIN_GROWTH),
        }
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self._buffers["keys"].append(key_states)
        self._buffers["values"].append(value_states)
        return self.keys, self.values

    def _get(self, name: str) -> torch.Tensor | None:
        buffer = self.__dict__.get("_buffers", {}).get(name)
        return None if buffer is None else buffer.view

    def _set(self, name: str, tensor: torch.Tensor | None) -> None:
        buffers = self.__dict__.setdefault("_buffers", {"keys": None, "values": None})
        if tensor is None or tensor.dim() != 4:
            buffers[name] = None  # reset() (None) or DynamicLayer's empty placeholder
        elif buffers[name] is None:
            buffers[name] = _Buffer(tensor, tensor.shape[2] + MIN_GROWTH)
            buffers[name].assign(tensor)
        else:
            buffers[name].assign(tensor)

    keys = property(lambda self: self._get("keys"), lambda self, t: self._set("keys", t))
    values = property(lambda self: self._get("values"), lambda self, t: self._set("values", t))


def buffered_cache(config) -> DynamicCache:
    """A ``DynamicCache`` for ``config`` whose full-attention layers append in place (sliding-window layers,
    which ``CachedModel`` refuses anyway, keep transformers' own class)."""
    cache = DynamicCache(config=config)
    cache.layers = [BufferedLayer() if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache
