"""rift-stat: the paper's static policy; half the budget recent, half selected once from the prompt."""

from __future__ import annotations

from .base import Policy, register


@register
class RiftStatic(Policy):
    name = "rift-stat"
