"""page-round: page-retrieval's pages, chosen once per verification round instead of at every drafted token.

page-retrieval picks, at every drafted token, the pages that token's own query scores highest; on a CPU that per-step
scoring and gather cost about 0.1x of a decode step. page-round scores the pages the same way (a page's midrange key
against a query, a softmax over pages per query head, averaged over the query heads of a KV head), but only with the
newest verified query and only once per verification round (at the commit after the drafter re-feeds the verified
tokens). From the full store it then builds a working set of the sinks, the top whole pages and the recent window,
as rift-dyn's rescoring does, and the drafted tokens of the round attend that working set like a rift-stat step.
What a round costs beyond rift-stat is one scoring over the page summaries and one gather of the budget.
"""

from __future__ import annotations

import torch

from .base import register
from .page_retrieval import PageRetrieval
from .schedules import Every
from .selection import rank_pages_ahead


@register
class PageRound(PageRetrieval):
    """Budget laid out like page-retrieval (sinks, whole pages from `n_sink` on, a window); pages per KV head, chosen
    at every commit from the newest query."""

    name = "page-round"
    retrieves = False
    keeps_store = True
    refresh_at_rollback = False  # once per round: after the verified tokens are re-fed, with the newest query

    def schedule(self):
        return Every(1)

    def score(self, query: torch.Tensor, keys: torch.Tensor, scale: float, sinks: torch.Tensor | None):
        """`[B, H_kv, T]`: each token carries its page's share of the newest query's attention over the pages of
        `keys` (0 for the sinks and the tokens after the last whole page)."""
        page, n_sink = self.config.block_size, self.config.n_sink
        batch, h_kv, length, _ = keys.shape
        n_pages = max(0, (length - n_sink) // page)
        scores = torch.zeros(batch, h_kv, length, dtype=torch.float32, device=keys.device)
        if n_pages:
            summaries = self.summarise(keys[:, :, n_sink : n_sink + n_pages * page].unflatten(2, (n_pages, page)))
            shares = torch.softmax(self.page_scores(query[:, :, -1:], summaries, scale), dim=-1).mean(2)[:, :, 0]
            scores[:, :, n_sink : n_sink + n_pages * page] = shares.repeat_interleave(page, dim=-1)
        return scores

    def select(self, scores: torch.Tensor, lo: int, hi: int, count: int) -> torch.Tensor:
        """The top whole pages (from `n_sink` on) inside `[lo, hi)` per KV head: `[H_kv, pages * block_size]`."""
        page, n_sink = self.config.block_size, self.config.n_sink
        first = max(0, -(-(lo - n_sink) // page))
        last = max(first, (hi - n_sink) // page)
        n_pick = min(count // page, last - first)
        heads = scores.shape[1]
        if n_pick <= 0:
            return torch.empty(heads, 0, dtype=torch.long, device=scores.device)
        start = n_sink + first * page
        pages = scores[0, :, start : n_sink + last * page].unflatten(-1, (last - first, page))[..., 0]  # [H_kv, n]
        if self.config.pages_ahead:
            chosen = rank_pages_ahead(pages, self.config.pages_ahead)[:, :n_pick]
        else:  # the same set up to how ties are broken; `topk` as page-round chose before `pages_ahead` existed
            chosen = pages.topk(n_pick, dim=-1).indices
        chosen = chosen.sort(dim=-1).values
        offsets = torch.arange(page, device=scores.device)
        return (start + chosen[:, :, None] * page + offsets).flatten(1)
