"""snapkv: one selection of the prompt by its last `window` queries (SnapKV); the window then slides.

`RiftConfig` fields read here:

- snapkv_grow (`bool`, defaults to `False`): original SnapKV, which appends every generated token instead of
  rolling a window (the budget then only bounds the prompt part).
"""

from __future__ import annotations

from .base import Policy, register


@register
class SnapKV(Policy):
    name = "snapkv"
    params = frozenset({"window", "pool", "pool_kernel", "tokens_ahead", "snapkv_grow"})

    def default_rho(self, budget: int) -> float:
        # The recent part is the observation window itself.
        return min(1.0, self.config.window / budget)
