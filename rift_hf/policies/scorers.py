"""Scorers: how important each cached position is, from the latest queries.

`RiftConfig` fields read here:

- pool (`str`, defaults to `"avg"`) and pool_kernel (`int`, defaults to 5): 1-D pooling of the scores.
- tokens_ahead (`int`, defaults to 0): for policies that select tokens by score (snapkv, rift-stat,
  rift-stat-block, rift-dyn, rift-ada, page-ahead), each position's score is raised to the highest among
  it and the `tokens_ahead` positions before it, so a chosen token brings the ones after it (copying reads
  forward; `pages_ahead` is the page-level counterpart).
"""

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


def carry_forward(scores: torch.Tensor, steps: int) -> torch.Tensor:
    """
    Raise each position's score to the highest among it and the `steps` positions before it (`scores` `[B, H, T]`,
    non-negative): a high-scoring token lends its score to the `steps` tokens after it, which text being copied
    reads next.
    """
    if steps == 0:
        return scores
    padded = torch.nn.functional.pad(scores, (steps, 0))
    return torch.nn.functional.max_pool1d(padded, kernel_size=steps + 1, stride=1)


__all__ = ["block_scores", "carry_forward", "snapkv_scores"]
