"""Policies: what to keep (selection), how to score (scorers) and when to refresh (schedules)."""

from .schedules import Adaptive, Every, Once, Schedule, Signals, calibrate_thresholds, schedule_for
from .scorers import block_scores, snapkv_scores
from .selection import keep_mask, select_blocks, select_tokens

__all__ = [
    "Adaptive",
    "Every",
    "Once",
    "Schedule",
    "Signals",
    "block_scores",
    "calibrate_thresholds",
    "keep_mask",
    "schedule_for",
    "select_blocks",
    "select_tokens",
    "snapkv_scores",
]
