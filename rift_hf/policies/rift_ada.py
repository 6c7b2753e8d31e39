"""rift-ada: rift-dyn rescoring on signals (acceptance, entropy, query drift), within [a_min, a_max] tokens.

`RiftConfig` fields read here:

- check_interval, a_min, a_max, al_alpha, al_threshold, entropy_threshold, drift_threshold:
  the `rift-ada` schedule; a threshold of `None` disables that signal.
"""

from __future__ import annotations

from .base import StorePolicy, register
from .schedules import Adaptive


@register
class RiftAdaptive(StorePolicy):
    name = "rift-ada"
    params = frozenset(
        {
            "window",
            "pool",
            "pool_kernel",
            "tokens_ahead",
            "check_interval",
            "a_min",
            "a_max",
            "al_alpha",
            "al_threshold",
            "entropy_threshold",
            "drift_threshold",
        }
    )

    def check_params(self) -> None:
        super().check_params()
        if self.config.a_min > self.config.a_max:
            raise ValueError(f"`a_min` ({self.config.a_min}) must not exceed `a_max` ({self.config.a_max}).")

    def schedule(self):
        return Adaptive(self.config)
