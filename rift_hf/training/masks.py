"""Attention masks that make a full-sequence forward see what a compressed drafter cache keeps.

The masks are read off a `RiftCache` itself: the sequence is teacher-forced through the cache (prefill up to the
boundary, then one token at a time, as in plain generation) and, at every position after the boundary, each
compressed layer records which positions its KV heads can see. So training matches inference by construction, for
every policy, rescoring schedules included; the price is one forward per position after the boundary (no grad).
A policy whose selection is fixed at the prefill (no store, no retrieval: `swa`, `snapkv`, `rift-stat`,
`rift-stat-block`) never looks at a later token's keys or queries, so after the prefill forward the cache is stepped
through its own commits and appends with placeholder states instead of the model (same code path, no model compute;
`fast=False` forces the forward per position).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from .._compat import CACHE
from ..attention import LAYER_MASKS, use_rift_attention
from ..cache import RiftCache
from ..config import RiftConfig


@torch.no_grad()
def compressed_attention_masks(
    model, input_ids: torch.Tensor, boundary: int, config: RiftConfig | dict, fast: bool = True
) -> dict[int, torch.Tensor]:
    """
    Per compressed layer, the attention pattern of inference with a compressed cache.

    Args:
        input_ids: `[1, T]`; positions `< boundary` form the prompt (full causal attention, as at prefill).
        boundary: the prefill length P (`1 <= P < T`).
        fast: for a policy fixed at the prefill, step the cache without the model after the prefill (exact: the
            cache's commits and positions do not depend on the states written).
    Returns:
        `{layer_idx: BoolTensor [1, H_kv, T, T]}`: row `t >= P` is True exactly at the positions the cache holds
        for the query at `t` (kept entries and `t` itself); rows `t < P` are causal.
    """
    length = input_ids.shape[1]
    if input_ids.shape[0] != 1:
        raise ValueError(f"compressed_attention_masks takes one sequence at a time, got batch {input_ids.shape[0]}.")
    if not 1 <= boundary < length:
        raise ValueError(f"boundary must lie in [1, {length - 1}] for a sequence of {length} tokens, got {boundary}.")
    config = RiftConfig.coerce(config)
    use_rift_attention(model, config)
    cache = RiftCache(model.config, config)
    was_training = model.training
    model.eval()
    try:
        model(input_ids[:, :boundary], use_cache=True, **{CACHE: cache})
        causal = torch.ones(length, length, dtype=torch.bool, device=input_ids.device).tril()
        masks = {}
        for layer in cache.rift_layers:
            heads = layer.positions.shape[0]
            mask = causal.expand(1, heads, length, length).clone()
            mask[:, :, boundary:] = False
            masks[layer.layer_idx] = mask
        policy = cache.config.policy_object
        static = fast and not policy.keeps_store and not policy.retrieves
        for t in range(boundary, length):
            if static:
                # What a one-token forward does to the cache: commit what is stored (mask sizing), then append.
                cache._commit()
                for layer in cache.rift_layers:
                    layer.update(torch.zeros_like(layer.keys[:, :, :1]), torch.zeros_like(layer.values[:, :, :1]))
            else:
                model(input_ids[:, t : t + 1], use_cache=True, **{CACHE: cache})
            for layer in cache.rift_layers:
                positions = layer.attended_positions.to(input_ids.device)  # [H_kv, N]: what the query at t attends
                masks[layer.layer_idx][0, :, t].scatter_(1, positions, True)
    finally:
        model.train(was_training)
    return masks


@contextmanager
def masked_attention(masks: dict[int, torch.Tensor] | None) -> Iterator[None]:
    """Within the block, the "rift" attention backend applies `masks` to every model using it (None: no override)."""
    token = LAYER_MASKS.set(masks)
    try:
        yield
    finally:
        LAYER_MASKS.reset(token)
