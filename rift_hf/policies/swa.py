"""swa: sinks plus a sliding window of the most recent tokens (StreamingLLM); no scoring."""

from __future__ import annotations

from .base import Policy, register


@register
class SlidingWindow(Policy):
    name = "swa"
    params = frozenset()
    scored = False
    rho = 1.0

    def check_params(self) -> None:
        super().check_params()
        rho = self.config.rho
        if rho is not None and rho < 1.0:
            raise ValueError(
                f"Policy {self.name!r} keeps only sinks and its recent window (it selects nothing to fill the rest of "
                f"the budget), so `rho` must be 1 or None, got {rho}; drop `rho`, or pick a policy that selects (e.g. "
                "'rift-stat')."
            )
