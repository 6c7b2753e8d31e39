"""rift-stat-block: rift-stat selecting whole blocks of `block_size` tokens, the same blocks for every KV head."""

from __future__ import annotations

from .base import Policy, register
from .scorers import block_scores
from .selection import select_blocks


@register
class RiftStaticBlock(Policy):
    name = "rift-stat-block"
    params = frozenset({"window", "pool", "pool_kernel", "block_size"})

    def round_budget(self, budget: int) -> int:
        n_sink, block = self.config.n_sink, self.config.block_size
        return n_sink + (budget - n_sink) // block * block

    def round_selection(self, count: int) -> int:
        return count // self.config.block_size * self.config.block_size

    def recent_tokens(self, budget: int) -> int:
        # The selected part must be whole blocks, so the window takes the remainder.
        recent = super().recent_tokens(budget)
        n_sink, block = self.config.n_sink, self.config.block_size
        selected = (budget - n_sink - recent) // block * block
        return budget - n_sink - selected

    def check_budget(self, budget: int) -> None:
        super().check_budget(budget)
        if budget - self.config.n_sink < self.config.block_size:
            raise ValueError(
                f"rift-stat-block needs budget - n_sink >= block_size ({self.config.block_size}), got budget={budget}; "
                "raise `budget` or lower `block_size`."
            )

    def select(self, scores, lo, hi, count):
        block = self.config.block_size
        return select_blocks(block_scores(scores, block)[0], block, lo, hi, count, scores.shape[1])
