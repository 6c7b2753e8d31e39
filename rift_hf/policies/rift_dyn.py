"""rift-dyn: keeps the full store and re-selects from every token with the last `window` queries every `delta`.

`RiftConfig` fields read here:

- delta (`int`, defaults to 128): committed tokens between two rescorings of `rift-dyn`.
"""

from __future__ import annotations

from .base import StorePolicy, register
from .schedules import Every


@register
class RiftDynamic(StorePolicy):
    name = "rift-dyn"
    params = frozenset({"window", "pool", "pool_kernel", "tokens_ahead", "delta"})

    def schedule(self):
        return Every(self.config.delta)
