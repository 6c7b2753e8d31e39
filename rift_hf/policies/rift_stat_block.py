"""rift-stat-block: rift-stat selecting whole blocks of `block_size` tokens, the same blocks for every KV head."""

from __future__ import annotations

from .base import Policy, register
from .pages import WholePages
from .scorers import block_scores
from .selection import select_blocks


@register
class RiftStaticBlock(WholePages, Policy):
    name = "rift-stat-block"
    params = frozenset({"window", "pool", "pool_kernel", "tokens_ahead", "block_size"})

    def select(self, scores, lo, hi, count):
        block = self.config.block_size
        return select_blocks(block_scores(scores, block)[0], block, lo, hi, count, scores.shape[1])
