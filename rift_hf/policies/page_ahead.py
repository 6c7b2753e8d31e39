"""page-ahead: per-head pages of `block_size` tokens, each lifting the page after it; refreshed like rift-dyn.

Copying from the prompt reads forward: when the drafter attends a page now, it is likely to need the next one in a
few tokens. A page's score is its mean SnapKV score; its *ahead* score is the larger of its own and its
predecessor's, so a page that scores high brings the next page in with it (on a tie the page's own score decides).
The top pages by ahead score are kept (whole pages, per KV head), the recent window is smaller than rift-dyn's (a
quarter of the budget), and the selection is refreshed from the full store every `delta` tokens.
"""

from __future__ import annotations

import torch

from .base import StorePolicy, register
from .pages import WholePages
from .schedules import Every
from .selection import rank_pages_ahead


@register
class PageAhead(WholePages, StorePolicy):
    """Whole pages (the budget splits into sinks, whole pages and a window), chosen per KV head."""

    name = "page-ahead"
    params = frozenset({"window", "pool", "pool_kernel", "tokens_ahead", "block_size", "pages_ahead", "delta"})
    rho = 0.25
    pages_ahead = 1

    def schedule(self):
        return Every(self.config.delta)

    def select(self, scores: torch.Tensor, lo: int, hi: int, count: int) -> torch.Tensor:
        page = self.config.block_size
        first = -(-lo // page)  # pages lying entirely inside [lo, hi)
        last = hi // page
        n_pick = max(0, min(count // page, last - first))
        heads = scores.shape[1]
        if n_pick == 0:
            return torch.empty(heads, 0, dtype=torch.long, device=scores.device)
        pages = scores[0, :, first * page : last * page].float().unflatten(-1, (last - first, page)).mean(-1)
        order = rank_pages_ahead(pages, self.config.pages_ahead)
        chosen = order[:, :n_pick].sort(dim=-1).values + first  # [H_kv, n_pick]
        offsets = torch.arange(page, device=scores.device)
        return (chosen[:, :, None] * page + offsets).flatten(1)  # [H_kv, n_pick * page], ascending
