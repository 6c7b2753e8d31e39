"""full: the uncompressed drafter cache, the baseline every retention figure divides by."""

from __future__ import annotations

import math

from .base import Policy, register


@register
class Full(Policy):
    name = "full"
    params = frozenset()
    compresses = False
    scored = False

    def recent_tokens(self, budget) -> int:
        return 0

    def check_budget(self, budget) -> None:
        return None

    def round_budget(self, budget) -> float:
        return math.inf
