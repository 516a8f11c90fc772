"""A KV cache with room for the whole decode, for the torch engine: transformers' `DynamicCache` grows by
concatenation (a copy of every layer's keys and values per generated token); `preallocate` swaps each layer for one
that writes into a buffer sized for prompt + max_tokens, and grows the batch by repeating rows in place."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicLayer


class PreallocatedLayer(DynamicLayer):
    """A `DynamicLayer` whose keys/values live in a buffer with room for the whole decode.

    A decode step writes one column in place instead of `torch.cat`-ing the whole cache into a fresh allocation
    (on small models that copy, and the page faults of the new buffer, were the largest cost of a step).
    `keys` / `values` are views of the filled part, so attention sees exactly what `DynamicLayer` would give it.
    """

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, capacity: int, repeats: int = 1):
        super().__init__()
        B, H, L, D = keys.shape
        self.dtype, self.device, self.is_initialized, self.length = keys.dtype, keys.device, True, L
        self.kbuf = keys.new_empty(B * repeats, H, max(capacity, L), D)
        self.vbuf = values.new_empty(B * repeats, *values.shape[1:2], max(capacity, L), values.shape[-1])
        # rows repeated in place (sample k of prompt b is row b * repeats + k): no intermediate copy
        self.kbuf.view(B, repeats, *self.kbuf.shape[1:])[:, :, :, :L] = keys[:, None]
        self.vbuf.view(B, repeats, *self.vbuf.shape[1:])[:, :, :, :L] = values[:, None]
        self._views()

    def _views(self):
        self.keys, self.values = self.kbuf[:, :, : self.length], self.vbuf[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        end = self.length + key_states.shape[-2]
        if end > self.kbuf.shape[-2]:  # out of room (not expected): grow like DynamicLayer would
            grow = lambda buf, new: torch.cat([buf[:, :, : self.length], new], dim=-2)
            self.kbuf, self.vbuf = grow(self.kbuf, key_states), grow(self.vbuf, value_states)
        else:
            self.kbuf[:, :, self.length : end] = key_states
            self.vbuf[:, :, self.length : end] = value_states
        self.length = end
        self._views()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def reset(self) -> None:
        self.length = 0
        self._views()

    def crop(self, tokens_to_remove: int) -> None:
        self.length = max(0, self.length - abs(tokens_to_remove))
        self._views()

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self.kbuf, self.vbuf = self.kbuf[indices], self.vbuf[indices]
        self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        self.kbuf, self.vbuf = self.kbuf.repeat_interleave(repeats, 0), self.vbuf.repeat_interleave(repeats, 0)
        self._views()


def preallocate(cache, capacity: int, repeats: int = 1):
    """Swap a prefilled `DynamicCache`'s plain layers for `PreallocatedLayer`s of `capacity` positions, each
    prompt row repeated `repeats` times; other layer kinds (sliding window, ...) are repeated and kept."""
    if all(type(layer) is DynamicLayer for layer in cache.layers):
        cache.layers = [PreallocatedLayer(layer.keys, layer.values, capacity, repeats) for layer in cache.layers]
    elif repeats > 1:
        cache.batch_repeat_interleave(repeats)
    return cache
