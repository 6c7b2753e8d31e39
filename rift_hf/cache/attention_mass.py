"""The measurement mode (`RiftConfig(track_attention_mass=True)`): the share of the full cache's attention mass that
falls on what a compressed layer kept, per query position."""

from __future__ import annotations

import torch


def attention_mass_shares(
    query: torch.Tensor, store_keys: torch.Tensor, seen: int, scale: float, visible: torch.Tensor
) -> list[tuple[int, float]]:
    """
    `(position, share)` for each new query of a forward, averaged over heads: one batched product over the chunk's
    queries, causal within it.

    Args:
        query: `[B, H_q, q, D]`, the positions `[seen - q, seen)`.
        store_keys: `[B, H_kv, >= seen, D]`, every key (the full store).
        visible: `[H_kv, L, N]` the positions each query attended (L = 1 when all attend the same working set);
            positions past a query fall under the causal mask.
    """
    batch, _, q, dim = query.shape
    first = seen - q
    keys = store_keys[:, :, :seen].to(query.device).float()
    h_kv = keys.shape[1]
    queries = query.float().view(batch, h_kv, -1, q, dim)  # query head h * group + g reads KV head h
    logits = torch.einsum("bhgqd,bhtd->bhgqt", queries, keys) * scale
    steps = torch.arange(seen, device=query.device)
    causal = steps[None] <= (first + torch.arange(q, device=query.device))[:, None]  # [q, T]
    probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
    visible = visible.to(query.device)
    kept = torch.zeros(h_kv, visible.shape[1], seen, device=query.device)
    kept.scatter_reduce_(2, visible.clamp(max=seen - 1), (visible < seen).float(), reduce="amax")
    shares = (probs * kept[None, :, None]).sum(-1).mean(dim=(0, 1, 2))  # [q]
    return list(zip(range(first, seen), shares.tolist(), strict=True))
