"""Policies: one registered class per file (`base.Policy`), plus the scoring, selection and schedule helpers."""

# isort: off
# Importing a policy's file registers it; this order is the order `policy_names()` lists them in.
from . import (  # noqa: F401
    full,
    swa,
    snapkv,
    rift_stat,
    rift_stat_block,
    rift_dyn,
    rift_ada,
    page_ahead,
    page_retrieval,
    page_round,
    auto,
)

# isort: on
from .base import (
    Policy,
    RetrievalPolicy,
    StorePolicy,
    is_resolver,
    label_fields,
    policy_class,
    policy_fields,
    policy_names,
    policy_settings,
    register,
    register_resolver,
)
from .schedules import Adaptive, Every, Once, Schedule, Signals, calibrate_thresholds, schedule_for
from .scorers import block_scores, carry_forward, snapkv_scores
from .selection import keep_mask, select_blocks, select_tokens

__all__ = [
    "Adaptive",
    "Every",
    "Once",
    "Policy",
    "RetrievalPolicy",
    "StorePolicy",
    "Schedule",
    "Signals",
    "block_scores",
    "calibrate_thresholds",
    "keep_mask",
    "label_fields",
    "policy_class",
    "policy_fields",
    "policy_names",
    "policy_settings",
    "register",
    "register_resolver",
    "is_resolver",
    "schedule_for",
    "select_blocks",
    "select_tokens",
    "carry_forward",
    "snapkv_scores",
]
