"""PyTorch references for the rift kernels: the semantics every faster implementation must match."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def window_attention_scores(
    query: torch.Tensor, key: torch.Tensor, scale: float, sinks: torch.Tensor | None = None, causal: bool = True
) -> torch.Tensor:
    """
    SnapKV observation-window scores.

    Args:
        query: `[B, H_q, W, D]`, the queries of the last `W` positions of `key`.
        key: `[B, H_kv, T, D]`, `H_q` a multiple of `H_kv`.
        scale: softmax scale.
        sinks: optional `[H_q]` extra logits in the softmax denominator (GPT-OSS attention sinks).
        causal: `False` for queries that all come after `key` (they see every key; any number of them).

    Returns:
        `[B, H_kv, T]` fp32: softmax attention (causal inside the window) summed over the `W` queries and averaged
        over the query heads of each KV head.
    """
    batch, h_q, window, _ = query.shape
    h_kv, length = key.shape[1], key.shape[2]
    if h_q % h_kv:
        raise ValueError(f"query heads ({h_q}) must be a multiple of key heads ({h_kv}).")
    if causal and window > length:
        raise ValueError(f"window ({window}) is longer than the keys ({length}).")
    group = h_q // h_kv
    # One query head at a time, its logits `[W, T]` in one buffer reused by every head, the softmax in place: at
    # decode-time rescoring this runs over the whole store, and on a CPU a fresh full-size temporary costs more in
    # page faults than the arithmetic (rift-dyn's first selection at ~32K: docs/results/long-inputs.md). Equal to one
    # batched matmul's scores up to float rounding.
    q = (query.float() * scale).reshape(batch, h_kv, group, window, -1)
    keys = key.float()
    late = torch.ones(window, window, dtype=torch.bool, device=key.device).triu(1) if causal else None
    sink = None if sinks is None else sinks.float().view(h_kv, group)
    logits = torch.empty(window, length, dtype=torch.float32, device=key.device)
    scores = torch.zeros(batch, h_kv, length, dtype=torch.float32, device=key.device)
    for b in range(batch):
        for h in range(h_kv):
            for g in range(group):
                torch.matmul(q[b, h, g], keys[b, h].transpose(0, 1), out=logits)
                if causal:  # the query at position T - W + i sees keys up to it: only the last W keys can be late
                    logits[:, length - window :].masked_fill_(late, float("-inf"))
                top = logits.amax(dim=-1, keepdim=True)
                if sink is not None:  # a sink's logit joins the denominator only
                    top = torch.maximum(top, sink[h, g])
                probs = logits.sub_(top).exp_()
                total = probs.sum(dim=-1, keepdim=True)
                if sink is not None:
                    total += (sink[h, g] - top).exp()
                scores[b, h] += probs.div_(total).sum(dim=0)
    return scores.div_(group)


def pool_scores(scores: torch.Tensor, kernel: int, mode: str = "avg") -> torch.Tensor:
    """1-D pooling along positions with stride 1 and `kernel // 2` padding: `[..., T] -> [..., T]`."""
    if kernel == 1:
        return scores
    flat = scores.reshape(-1, 1, scores.shape[-1])
    if mode == "avg":
        pooled = F.avg_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    elif mode == "max":
        pooled = F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2)
    else:
        raise ValueError(f"pool mode must be 'avg' or 'max', got {mode!r}")
    return pooled.view_as(scores)


def block_scores(scores: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mean token score per whole block, averaged over KV heads: `[B, H_kv, T] -> [B, T // block_size]`."""
    n_blocks = scores.shape[-1] // block_size
    blocks = scores[..., : n_blocks * block_size].float().unflatten(-1, (n_blocks, block_size))
    return blocks.mean(dim=-1).mean(dim=1)


def indexed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    Attention of the `L` newest positions over a per-head selection of a KV store.

    Args:
        query: `[B, H_q, L, D]`.
        key, value: `[B, H_kv, S, D]`, the store.
        index: `[B, H_kv, K]` int64, ascending rows of the store each KV head attends to; its last `L` entries are
            the queries' own positions, causal among themselves.
        scale: softmax scale.
        sinks: optional `[H_q]` extra logits in the softmax denominator.

    Returns:
        `[B, H_q, L, D]` in the query's dtype.
    """
    batch, h_q, length, dim = query.shape
    h_kv, k_sel = key.shape[1], index.shape[-1]
    group = h_q // h_kv
    gather = index.unsqueeze(-1).expand(-1, -1, -1, dim)
    k = torch.gather(key, 2, gather).float()  # [B, H_kv, K, D]
    v = torch.gather(value, 2, gather).float()
    q = query.float().view(batch, h_kv, group, length, dim)
    logits = torch.einsum("bhgld,bhkd->bhglk", q, k) * scale
    # Query i is the (K - L + i)-th selected row; it may not see the later query rows.
    rows = torch.arange(k_sel, device=query.device)
    own = torch.arange(k_sel - length, k_sel, device=query.device)
    logits = logits.masked_fill(rows[None, :] > own[:, None], float("-inf"))
    probs = _softmax_with_sinks(logits, sinks)
    out = torch.einsum("bhglk,bhkd->bhgld", probs, v)
    return out.reshape(batch, h_q, length, dim).to(query.dtype)


def _softmax_with_sinks(logits: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """Softmax of `[B, H_kv, G, L, K]` logits over K, with optional per-query-head sink logits (`[H_q]`) in the
    denominator only."""
    if sinks is None:
        return torch.softmax(logits, dim=-1)
    batch, h_kv, group, length = logits.shape[:4]
    sink = sinks.float().view(1, h_kv, group, 1, 1).expand(batch, h_kv, group, length, 1)
    return torch.softmax(torch.cat([logits, sink], dim=-1), dim=-1)[..., :-1]


def _take_rows(store: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Rows `index` (`[B, H, N]`) of `store` (`[B, H, S, D]`) -> `[B, H, N, D]`.

    One `index_select` over the store's buffer seen as rows (offsets per batch entry and head added to the indices)
    when its rows are contiguous, as a cache's preallocated buffer is: on CPU that is several times faster than an
    element-wise `gather` and about 2.5x faster than an `index_select` per head."""
    batch, heads, length, dim = store.shape
    strides = store.stride()
    if strides[-1] == 1 and strides[-2] == dim and strides[0] % dim == 0 and strides[1] % dim == 0:
        span = (batch - 1) * strides[0] // dim + (heads - 1) * strides[1] // dim + length
        rows = store.as_strided((span, dim), (dim, 1))
        base = torch.arange(batch, device=index.device)[:, None] * (strides[0] // dim)
        base = base + torch.arange(heads, device=index.device)[None, :] * (strides[1] // dim)
        flat = (index + base[..., None]).reshape(-1)
        return rows.index_select(0, flat).view(batch, heads, index.shape[-1], dim)
    rows = [store[b, h].index_select(0, index[b, h]) for b in range(batch) for h in range(heads)]
    return torch.stack(rows).view(batch, heads, index.shape[-1], dim)


def retrieved_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """
    Attention where every query position attends its own rows of a KV store (per-step retrieval).

    Args:
        query: `[B, H_q, L, D]`.
        key, value: `[B, H_kv, S, D]`, the store.
        index: `[B, H_kv, L, K]` int64, the rows query `l` of each KV head attends (all visible to it; any order).
        scale: softmax scale.
        sinks: optional `[H_q]` extra logits in the softmax denominator.
        softcap: optional logit soft-cap (`tanh(x / c) * c`).

    Returns:
        `[B, H_q, L, D]` in the query's dtype.
    """
    batch, h_q, length, dim = query.shape
    h_kv, k_sel = key.shape[1], index.shape[-1]
    group = h_q // h_kv
    k = _take_rows(key, index.reshape(batch, h_kv, length * k_sel)).view(batch, h_kv, length, k_sel, dim)
    v = _take_rows(value, index.reshape(batch, h_kv, length * k_sel)).view(batch, h_kv, length, k_sel, dim)
    if sinks is None and softcap is None and batch == 1:
        # Each query position is its own batch entry of torch's SDPA (in the model's dtype, like the other backends).
        out = F.scaled_dot_product_attention(
            query[0].transpose(0, 1)[:, :, None],  # [L, H_q, 1, D]
            k[0].transpose(0, 1),  # [L, H_kv, K, D]
            v[0].transpose(0, 1),
            scale=scale,
            enable_gqa=group > 1,
        )
        return out[:, :, 0].transpose(0, 1)[None]
    k, v = k.float(), v.float()
    q = query.float().view(batch, h_kv, group, length, dim)
    logits = torch.einsum("bhgld,bhlkd->bhglk", q, k) * scale
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    probs = _softmax_with_sinks(logits, sinks)
    out = torch.einsum("bhglk,bhlkd->bhgld", probs, v)
    return out.reshape(batch, h_q, length, dim).to(query.dtype)
