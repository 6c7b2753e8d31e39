"""page-round: page-retrieval's pages, chosen once per verification round instead of at every drafted token.

page-retrieval picks, at every drafted token, the pages that token's own query scores highest; on a CPU that per-step
scoring and gather cost about 0.1x of a decode step. page-round scores the pages the same way (a page's midrange key
against a query, a softmax over pages per query head, averaged over the query heads of a KV head), but only with the
newest verified query (or the newest `score_queries`, their shares averaged) and only once per verification round
(at the commit after the drafter re-feeds the verified tokens). A chosen page brings the `pages_ahead` pages after it
(2 by default; copying reads forward). From the full store it then builds a working set of the sinks, the top whole
pages and the recent window, as rift-dyn's rescoring does, and the drafted tokens of the round attend that working
set like a rift-stat step. The layer keeps the page summaries beside the store (`Policy.summarises_pages`), adding
those of the pages completed since the last round, so what a round costs beyond rift-stat is one scoring over the
summaries (1/8 of the keys) and one gather of the budget.

With `rechoose_after = k > 0` (2 by default) the pages are chosen once more inside the round, before the drafter
feeds its `k + 1`-th drafted token, from the newest `score_queries` verified queries and the `k` drafted ones (a
ceiling that scores each round with its own future queries keeps all of the full cache's AL on generation,
docs/results/held-out.md): only the selection's rows of the working set are swapped (`RiftStoreLayer.reselect`), over
the pages summarised at the commit, so the drafted rows stay in flight and can still be rolled back.

With `guide="target"` the pages come from the target instead (#76): in assisted generation the target verifies every
round, reading the same tokens at the same positions with a far better model of what comes next. The candidate
generator keeps, from each verification, the attention of the newest verified query over every position, averaged
over the query heads of a few of the target's full-attention layers (`rift_hf.generation.guide`), and the cache holds
it as `guide`; at the next commit page-round keeps the whole pages holding the most of it (each with its
`pages_ahead`), the same pages for every layer and KV head. Before the first verification, and outside assisted
generation, it chooses from the drafter's queries as above; a choice inside a round (`rechoose_after`) always does.

`RiftConfig` fields read here:

- score_queries (`int`, defaults to 1): for `page-round`, how many of the newest verified queries score the
  pages at a refresh (each page's attention share averaged over them; at most `window`).
- rechoose_after (`int`, *optional*): for `page-round`, choose the pages once more inside a drafting round,
  after this many drafted tokens, scored with the round's queries so far (the newest `score_queries`
  verified ones and the drafted ones); only the selection's rows are swapped (0: once per round only);
  defaults to the policy's own (2 for `page-round`, 0 otherwise).
- guide (`str`, *optional*): for `page-round`, `"target"` chooses the pages of each round from the target's
  attention at its last verification (above); None (the default): from the drafter's own queries.
"""

from __future__ import annotations

import torch

from .base import StorePolicy, register
from .pages import WholePages, midrange, page_scores
from .schedules import Every
from .selection import rank_pages_ahead


@register
class PageRound(WholePages, StorePolicy):
    """Sinks, whole pages from `n_sink` on, a window; pages per KV head, chosen at every commit from the newest query
    (scored as page-retrieval scores them)."""

    name = "page-round"
    params = frozenset({"window", "block_size", "pages_ahead", "score_queries", "rechoose_after", "guide"})
    summarises_pages = True
    # A round drafts up to ~11 tokens past the newest verified query: one to two 8-token pages past the page it points
    # at. Replay on the 16 E1 prompts (4x / 8x, repeat / continue): 0.99 / 0.96 and 0.94 / 0.93 of the full cache's AL
    # with 2, 0.92 / 0.97 and 0.78 / 0.91 with 0 (docs/results/e1-scale.md).
    pages_ahead = 2
    # Choosing once more after 2 drafted tokens: on the broad set's tune half (16 generate prompts, ~4K) retention
    # 0.939 -> 0.968 at 8x and 0.996 -> 1.001 at 4x; on the 16 stdlib ~4K prompts no cell lower (4x continue 0.96 ->
    # 0.98); a drafted token costs about the same (docs/results/held-out.md, "choosing once more inside a round").
    rechoose_after = 2
    rho = 0.125
    block_size = 8
    refresh_at_rollback = False  # once per round: after the verified tokens are re-fed, with the newest query
    # The store in int4 (keys per channel, values per token; the newest rows exact): with the working set the drafter
    # then holds under half of a full cache's KV at 4x, where a full-precision store alone equals it. A refresh
    # dequantises only the rows it keeps, and page summaries come from exact keys.
    store_dtype = "int4"

    summarise = staticmethod(midrange)
    page_scores = staticmethod(page_scores)

    def schedule(self):
        return Every(1)

    @property
    def guided(self) -> bool:
        """Whether the candidate generator captures the target's attention for this policy (`guide="target"`)."""
        return self.config.guide == "target"

    def check_params(self) -> None:
        super().check_params()
        if self.config.score_queries > self.config.window:
            raise ValueError(
                f"`score_queries` ({self.config.score_queries}) must not exceed `window` ({self.config.window}): the "
                "cache keeps the last `window` verified queries. Raise `window` or lower `score_queries`."
            )

    def select_pages(
        self,
        query: torch.Tensor,
        summaries: torch.Tensor,
        scale: float,
        lo: int,
        hi: int,
        count: int,
        newest: int | None = None,
    ) -> torch.Tensor:
        """
        The top whole pages inside `[lo, hi)` per KV head, `[H_kv, pages * block_size]` positions, ascending.

        Args:
            query: `[B, H_q, W, D]` the recent queries; only the newest `newest` count (`score_queries` unless given).
            summaries: `[B, H_kv, n, D]` the summary of every whole committed page (`summarise`); page `j` covers
                positions `n_sink + j * block_size` on. A page's score is its share of a query's attention over all
                of them (a softmax over pages per query head), averaged over the heads of a KV head and over the
                newest `score_queries` queries.
        """
        page, n_sink = self.config.block_size, self.config.n_sink
        heads, n_pages = summaries.shape[1:3]
        first = max(0, -(-(lo - n_sink) // page))
        last = min(n_pages, max(first, (hi - n_sink) // page))
        n_pick = min(count // page, last - first)
        if n_pick <= 0:
            return torch.empty(heads, 0, dtype=torch.long, device=summaries.device)
        query = query[:, :, -(newest or self.config.score_queries) :]
        shares = torch.softmax(self.page_scores(query, summaries, scale), dim=-1).mean(2)[0].mean(1)
        pages = shares[:, first:last]  # [H_kv, candidates]
        if self.config.pages_ahead:
            chosen = rank_pages_ahead(pages, self.config.pages_ahead)[:, :n_pick]
        else:  # the same set up to how ties are broken; `topk` as page-round chose before `pages_ahead` existed
            chosen = pages.topk(n_pick, dim=-1).indices
        chosen = chosen.sort(dim=-1).values
        offsets = torch.arange(page, device=summaries.device)
        return (n_sink + (first + chosen[:, :, None]) * page + offsets).flatten(1)

    def select_layers(self, layers: list, cache) -> tuple[torch.Tensor, ...] | None:
        """
        A refresh of every compressed layer in one `select_pages` call: `select_pages` chooses for every KV head on its
        own, so the layers' heads are stacked as heads of one layer and scoring and ranking run once per refresh
        instead of once per layer. None (each layer then selects for itself) unless the layers are alike (`_alike`).
        """
        if not self._alike(layers):
            return None
        for layer in layers:
            layer.summarise_pages()
        weights = cache.guide if self.guided else None
        if weights is None:
            return self._choose(layers, cache, self.config.score_queries, layers[0].seen)
        chosen = self.guided_pages(weights, layers[0].seen - layers[0].recent_window(), cache.n_select)
        return tuple(chosen.to(layer.device).expand(layer.pages.shape[1], -1).contiguous() for layer in layers)

    def guided_pages(self, weights: torch.Tensor, hi: int, count: int) -> torch.Tensor:
        """
        `[1, pages * block_size]` positions: the whole pages inside `[n_sink, hi)` holding the most of `weights`
        (`[positions]`, the target's attention; positions past its end weigh nothing), ascending.
        """
        page, n_sink = self.config.block_size, self.config.n_sink
        last = max(0, (hi - n_sink) // page)
        n_pick = min(count // page, last)
        if n_pick <= 0:
            return torch.empty(1, 0, dtype=torch.long, device=weights.device)
        span = weights.new_zeros(last * page)
        have = max(0, min(weights.shape[0] - n_sink, last * page))
        span[:have] = weights[n_sink : n_sink + have]
        pages = span.view(last, page).sum(-1)[None]
        if self.config.pages_ahead:
            picked = rank_pages_ahead(pages, self.config.pages_ahead)[:, :n_pick]
        else:
            picked = pages.topk(n_pick, dim=-1).indices
        picked = picked.sort(dim=-1).values
        return (n_sink + picked[:, :, None] * page + torch.arange(page, device=picked.device)).flatten(1)

    def rechoose_layers(self, layers: list, cache, drafted: int) -> tuple[torch.Tensor | None, ...]:
        """
        The selection of every compressed layer chosen again inside a round (`rechoose_after`), `drafted` tokens
        after its commit: scored with the newest `score_queries` verified queries and the `drafted` ones since, over
        the pages summarised at that commit and below the same recent window (drafted rows may still be rolled back,
        so they are never candidates). One stacked call when the layers are alike, else one per layer (None for a
        layer that has not made its first page selection).
        """
        committed = layers[0].seen - drafted
        newest = self.config.score_queries + drafted
        if self._alike(layers) and all(layer.pages is not None for layer in layers):
            return self._choose(layers, cache, newest, committed)
        return tuple(
            self._choose([layer], cache, newest, layer.seen - drafted)[0]
            if self._alike([layer]) and layer.pages is not None
            else None
            for layer in layers
        )

    @staticmethod
    def _alike(layers: list) -> bool:
        """Compressed, with recent queries, the same query heads, store shape, length, window, scale and device."""
        first = layers[0]
        return all(
            layer.compressed
            and layer.store is not None
            and layer.queries is not None
            and layer.queries.shape[2] > 0
            and layer.queries.shape[1] == first.queries.shape[1]  # heads of a group kept together when stacked
            and layer.store.shape == first.store.shape
            and layer.seen == first.seen
            and layer.scale == first.scale
            and layer.device == first.device
            and layer.recent_window() == first.recent_window()
            for layer in layers
        )

    def _choose(self, layers: list, cache, newest: int, seen: int) -> tuple[torch.Tensor, ...]:
        """`select_pages` over the stacked heads of `layers` (alike), with their newest `newest` queries, below the
        recent window of a layer that has seen `seen` tokens."""
        first = layers[0]
        newest = min(newest, *(layer.queries.shape[2] for layer in layers))
        query = torch.cat(
            [cache.scoring_query(layer.layer_idx, layer.queries)[:, :, -newest:] for layer in layers], dim=1
        )
        pages = torch.cat([layer.pages.used_keys for layer in layers], dim=1)
        hi = seen - first.recent_window()
        selected = self.select_pages(query, pages, first.scale, self.config.n_sink, hi, cache.n_select, newest)
        return selected.split([layer.pages.shape[1] for layer in layers])
