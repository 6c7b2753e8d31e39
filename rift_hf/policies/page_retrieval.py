"""page-retrieval: every drafted token attends the pages its own query points at (per-step retrieval, after Quest).

The layer keeps every token. Each page of `block_size` tokens (8 by default; after the sinks) is summarised, once it
is committed, by the midpoint of the element-wise minimum and maximum of its keys (its *midrange key*). At every
forward, for each new query and KV head, a page scores `q . midrange`; the top pages are attended, beside the
`n_sink` first tokens and a recent window. Each query attends exactly `budget` rows, so the attention reads what a
compressed cache reads, plus one summary row per page (1/8 of the keys).

Quest (Tang et al. 2024, arXiv 2406.10774) ranks pages by an upper bound of `q . k`, `sum_d max(q_d min_d, q_d max_d)`.
On our real drafter (Qwen2.5-Coder-0.5B, grouped-query attention) and 16-token pages that bound kept 0.61 of the
full-cache AL on a repeat prompt at 8x where the midrange score kept 0.90; with 8-token pages, 0.96 vs 1.00 (replay,
2026-11-30; benchmarks/results/E1/qwen-coder/replay-page-retrieval-variants/). With grouped-query attention one
selection serves the whole group of query heads of a KV head: each head's scores become a softmax over pages (the
share of that head's attention a page would take), averaged over the group. Only whole pages that end before the
recent window starts are candidates, so the three parts never overlap and every query attends `budget` distinct rows.
"""

from __future__ import annotations

import torch

from .base import RetrievalPolicy, register
from .pages import WholePages, midrange, page_scores


@register
class PageRetrieval(WholePages, RetrievalPolicy):
    """Sinks, whole pages and a window; the pages are chosen per query."""

    name = "page-retrieval"
    params = frozenset({"window", "block_size"})
    rho = 0.125
    block_size = 8
    _layout_key: tuple | None = None  # what `_layout` last computed for (shared by the layers of one forward)

    summarise = staticmethod(midrange)
    page_scores = staticmethod(page_scores)

    def retrieve(
        self,
        query: torch.Tensor,
        summaries: torch.Tensor,
        first: int,
        scale: float,
        recent: int,
        selected: int,
    ) -> torch.Tensor:
        """
        Rows each new query attends: `[B, H_kv, L, budget]` (sinks, the chosen pages, the recent window).

        Args:
            query: `[B, H_q, L, D]` at positions `first .. first + L - 1` (rows of the layer's store).
            summaries: `[B, H_kv, n_pages, D]` (`summarise`); page `j` covers rows `n_sink + j * block_size` on.
            recent: size of the recent window (the query's own row included).
            selected: rows given to pages (a whole number of pages).
        """
        page, n_sink = self.config.block_size, self.config.n_sink
        batch, h_kv, n_pages = summaries.shape[:3]
        length = query.shape[2]
        n_pick = selected // page
        if (first - recent + 1 - n_sink) // page < n_pick or n_pages < n_pick:
            raise RuntimeError(
                f"Internal error: page-retrieval at position {first} has fewer than {n_pick} candidate pages."
            )
        # Only pages that end before the newest query's window are scored (a prefix of the pages).
        n_pages = min(n_pages, (first + length - recent - n_sink) // page)
        hidden, offsets, fixed = self._layout(first, length, n_pages, recent, query.device)
        scores = self.page_scores(query, summaries[:, :, :n_pages], scale)
        if hidden is not None:
            scores = scores.masked_fill_(hidden, float("-inf"))
        pages = torch.softmax(scores, dim=-1).mean(2).topk(n_pick, dim=-1).indices  # [B, H_kv, L, n_pick]
        rows = (pages[..., None] * page + offsets).flatten(-2)  # [B, H_kv, L, n_pick * page]
        return torch.cat([rows, fixed.expand(batch, h_kv, -1, -1)], dim=-1)

    def _layout(self, first: int, length: int, n_pages: int, recent: int, device):
        """
        What does not depend on the layer, computed once per forward and shared by every layer: the mask of pages
        each query may not pick (`[L, n_pages]`, None if none), row offsets inside a page (`+ n_sink`), and each
        query's sinks and recent window (`[L, n_sink + recent]`).
        """
        key = (first, length, n_pages, recent, device)
        if self._layout_key == key:
            return self._layout_value
        page, n_sink = self.config.block_size, self.config.n_sink
        positions = torch.arange(first, first + length, device=device)  # [L]
        # Candidate pages end before the window of their query starts: j < (p - recent + 1 - n_sink) // page.
        limit = (positions - recent + 1 - n_sink) // page
        hidden = torch.arange(n_pages, device=device) >= limit[:, None]
        window = positions[:, None] - torch.arange(recent - 1, -1, -1, device=device)  # [L, recent]
        fixed = torch.cat([torch.arange(n_sink, device=device).expand(length, -1), window], dim=-1)
        offsets = torch.arange(page, device=device) + n_sink
        self._layout_key = key
        # The earliest query has the smallest limit: some page is hidden iff its limit falls short of the pages.
        some_hidden = (first - recent + 1 - n_sink) // page < n_pages  # Python ints: no host sync
        self._layout_value = (hidden if some_hidden else None, offsets, fixed)
        return self._layout_value
