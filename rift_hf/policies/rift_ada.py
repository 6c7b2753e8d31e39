"""rift-ada: rift-dyn rescoring on signals (acceptance, entropy, query drift), within [a_min, a_max] tokens."""

from __future__ import annotations

from .base import Policy, register
from .schedules import Adaptive


@register
class RiftAdaptive(Policy):
    name = "rift-ada"
    keeps_store = True

    def schedule(self):
        return Adaptive(self.config)
