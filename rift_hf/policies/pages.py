"""What the page policies share: a budget laid out in whole pages of `block_size` tokens (`WholePages`), a page's
summary by its midrange key (`midrange`), and the score of every page for every query head (`page_scores`).

`RiftConfig` fields read here:

- block_size (`int`, *optional*): block length of `rift-stat-block`, page length of `page-ahead` and
  `page-retrieval`; defaults to the policy's own (8 for `page-retrieval`, 16 otherwise).
- pages_ahead (`int`, *optional*): for `page-ahead` and `page-round`, how many following pages a chosen page
  brings with it (copying reads forward); defaults to the policy's own (1 for `page-ahead`, 2 for
  `page-round`, 0 otherwise).
"""

from __future__ import annotations

import torch


class WholePages:
    """
    A budget of sinks, whole pages of `block_size` tokens and a recent window that takes the remainder. Mixed into a
    `Policy` before it: `class RiftStaticBlock(WholePages, Policy)`.
    """

    def round_budget(self, budget: int) -> int:
        n_sink, page = self.config.n_sink, self.config.block_size
        return n_sink + (budget - n_sink) // page * page

    def round_selection(self, count: int) -> int:
        return count // self.config.block_size * self.config.block_size

    def recent_tokens(self, budget: int) -> int:
        # The selected part must be whole pages, so the window takes the remainder.
        recent = super().recent_tokens(budget)
        n_sink, page = self.config.n_sink, self.config.block_size
        selected = (budget - n_sink - recent) // page * page
        return budget - n_sink - selected

    def check_budget(self, budget: int) -> None:
        super().check_budget(budget)
        if budget - self.config.n_sink < self.config.block_size:
            raise ValueError(
                f"{self.name} needs budget - n_sink >= block_size ({self.config.block_size}), got budget={budget}; "
                "raise `budget` or lower `block_size`."
            )


def midrange(keys: torch.Tensor) -> torch.Tensor:
    """`[B, H_kv, n, page, D]` keys of `n` whole pages -> their summaries `[B, H_kv, n, D]`: the midpoint of the
    element-wise minimum and maximum of each page's keys."""
    return (keys.amin(3) + keys.amax(3)) / 2


def page_scores(query: torch.Tensor, summaries: torch.Tensor, scale: float) -> torch.Tensor:
    """
    Args:
        query: `[B, H_q, L, D]`; summaries: `[B, H_kv, n_pages, D]`.
    Returns:
        `[B, H_kv, G, L, n_pages]` float32: each query head's scaled score of every page.
    """
    batch, h_q, length, dim = query.shape
    h_kv, n_pages = summaries.shape[1:3]
    q = query.float().reshape(batch, h_kv, h_q // h_kv * length, dim)  # heads of a group, then positions
    scores = torch.matmul(q, summaries.float().transpose(-1, -2)).mul_(scale)
    return scores.view(batch, h_kv, h_q // h_kv, length, n_pages)
