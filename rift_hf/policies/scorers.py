"""Scorers: how important each cached position is, from the latest queries."""

from __future__ import annotations

import torch

from ..kernels import block_scores, pool_scores, window_attention_scores


def snapkv_scores(
    query: torch.Tensor,
    key: torch.Tensor,
    scale: float,
    pool: str = "avg",
    kernel: int = 5,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """
    SnapKV scores of every key position from an observation window of queries.

    Args:
        query: `[B, H_q, W, D]`, queries of the last `W` positions of `key`.
        key: `[B, H_kv, T, D]`.
    Returns:
        `[B, H_kv, T]` fp32 pooled scores.
    """
    return pool_scores(window_attention_scores(query, key, scale, sinks), kernel, pool)


__all__ = ["block_scores", "snapkv_scores"]
