"""What each policy-specific `RiftConfig` field must hold. A policy lists the fields it reads (`Policy.params`) and
checks those (`Policy.check_params`); `RiftConfig` refuses any of them set for a policy that does not read it."""

from __future__ import annotations

import math
from collections.abc import Callable


def positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"`{name}` must be a positive int, got {value!r}.")


def count(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"`{name}` must be an int >= 0, got {value!r}.")


def odd_positive_int(name: str, value) -> None:
    positive_int(name, value)
    if value % 2 == 0:
        raise ValueError(f"`{name}` must be odd so pooling keeps positions aligned, got {value}.")


def pooling(name: str, value) -> None:
    if value not in ("avg", "max"):
        raise ValueError(f"`{name}` must be 'avg' or 'max', got {value!r}.")


def flag(name: str, value) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"`{name}` must be True or False, got {value!r}.")


def share(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number, got {value!r}.")
    if not 0.0 < value <= 1.0:
        raise ValueError(f"`{name}` must lie in (0, 1], got {value}.")


def threshold(name: str, value) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"`{name}` must be a number or None, got {value!r}.")
    if not math.isfinite(value):
        raise ValueError(
            f"`{name}` must be a finite number (or None to turn that signal off), got {value}; a NaN would silently "
            "never fire."
        )


def guide(name: str, value) -> None:
    if value not in (None, "target"):
        raise ValueError(f"`{name}` must be None (the drafter's own queries choose) or 'target', got {value!r}.")


CHECKS: dict[str, Callable[[str, object], None]] = {
    "window": positive_int,
    "pool": pooling,
    "pool_kernel": odd_positive_int,
    "tokens_ahead": count,
    "block_size": positive_int,
    "pages_ahead": count,
    "score_queries": positive_int,
    "rechoose_after": count,
    "delta": positive_int,
    "check_interval": positive_int,
    "a_min": positive_int,
    "a_max": positive_int,
    "al_alpha": share,
    "al_threshold": threshold,
    "entropy_threshold": threshold,
    "drift_threshold": threshold,
    "snapkv_grow": flag,
    "guide": guide,
}
