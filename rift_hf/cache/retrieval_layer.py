"""`RiftRetrievalLayer`: a layer that keeps every token and lets each new query attend rows of its own."""

from __future__ import annotations

import torch

from ..storage import Rows
from .layer import RiftLayer
from .page_summaries import extend_page_summaries


class RiftRetrievalLayer(RiftLayer):
    """
    A layer of a retrieval policy (`page-retrieval`): nothing is evicted, the working set keeps every token and each
    committed page gets the policy's summary (`pages`); once past the budget, each new query attends only its own
    `budget` rows (`retrieve`, called by the attention backend).
    """

    def __init__(self, cache, layer_idx: int):
        super().__init__(cache, layer_idx)
        self.pages: Rows | None = None
        self.retrieved: torch.Tensor | None = None  # `[B, H_kv, L, K]`: the rows the last forward's queries attended

    @property
    def retrieving(self) -> bool:
        return self.compressed

    @property
    def visible_positions(self) -> torch.Tensor | None:
        if self.retrieving and self.retrieved is not None:
            return self.retrieved[0]
        return super().visible_positions

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        self.working.commit()
        self.pages = extend_page_summaries(
            self.pages, self.working, self.working.committed, self.cache.policy, self.device, self.HEADROOM
        )
        self.compressed = True

    def retrieve(self, query: torch.Tensor, scale: float) -> torch.Tensor:
        """The rows each new query attends, `[B, H_kv, L, budget]` (a retrieval policy's `retrieve`)."""
        cache = self.cache
        first = self.seen - query.shape[2]
        self.retrieved = cache.policy.retrieve(query, self.pages.used_keys, first, scale, cache.recent, cache.n_select)
        return self.retrieved

    def kv_bytes(self) -> tuple[int, int]:
        if not self.retrieving:
            return super().kv_bytes()
        # Every token is kept; a query reads `budget` rows and the page summaries.
        store = self.working.nbytes() + (0 if self.store is None else self.store.nbytes())
        return self.working.nbytes(min(self.stored, self.cache.budget)) + self.pages.nbytes(), store
