"""swa: sinks plus a sliding window of the most recent tokens (StreamingLLM); no scoring."""

from __future__ import annotations

from .base import Policy, register


@register
class SlidingWindow(Policy):
    name = "swa"
    params = frozenset()
    scored = False
    rho = 1.0
