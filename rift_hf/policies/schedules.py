"""When a selection is refreshed: never (stat), every delta tokens (dyn), or on signals (ada)."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field


@dataclass
class Signals:
    """The rift-ada signals, fed by whoever owns their data (generator: AL and entropy; cache: query drift)."""

    alpha: float = 0.3
    entropy_window: int = 8
    al_ewma: float | None = None
    entropies: deque = field(default_factory=deque)
    drift: float | None = None

    def observe_round(self, accepted: int, entropies: list[float]) -> None:
        al = accepted + 1
        self.al_ewma = al if self.al_ewma is None else self.alpha * al + (1 - self.alpha) * self.al_ewma
        self.entropies.extend(entropies)
        while len(self.entropies) > self.entropy_window:
            self.entropies.popleft()

    @property
    def entropy(self) -> float | None:
        return sum(self.entropies) / len(self.entropies) if self.entropies else None

    def snapshot(self) -> dict[str, float | None]:
        return {"al_ewma": self.al_ewma, "entropy": self.entropy, "drift": self.drift}


def fired(config, signals: dict[str, float | None]) -> list[str]:
    """Names of the signals past the thresholds of `config` (a `RiftConfig`: `al_threshold`, `entropy_threshold`,
    `drift_threshold`)."""
    out = []
    if config.al_threshold is not None and signals["al_ewma"] is not None and signals["al_ewma"] < config.al_threshold:
        out.append("al")
    if (
        config.entropy_threshold is not None
        and signals["entropy"] is not None
        and signals["entropy"] > config.entropy_threshold
    ):
        out.append("entropy")
    if (
        config.drift_threshold is not None
        and signals["drift"] is not None
        and signals["drift"] > config.drift_threshold
    ):
        out.append("drift")
    return out


class Schedule:
    """Decides, at each commit, whether to rescore. `age` counts committed tokens since the last selection."""

    needs_drift = False
    # The query drift is measured at each due commit: rift-ada decides on it, rift-dyn logs it (E5 calibrates the
    # threshold from those logs). A refresh at every round leaves no drift to measure.
    logs_drift = False

    def due(self, age: int, since_check: int) -> bool:
        """Whether the schedule wants to look at its signals now."""
        return False

    def decide(self, age: int, signals: dict[str, float | None]) -> tuple[bool, str]:
        return False, ""


class Once(Schedule):
    """rift-stat, snapkv: select at prefill, keep forever."""


class Every(Schedule):
    """rift-dyn: rescore every `delta` committed tokens."""

    def __init__(self, delta: int):
        self.delta = delta
        self.logs_drift = delta > 1

    def due(self, age: int, since_check: int) -> bool:
        return age >= self.delta

    def decide(self, age: int, signals: dict[str, float | None]) -> tuple[bool, str]:
        return True, "delta"


class Adaptive(Schedule):
    """rift-ada: every `check_interval` tokens, rescore at `a_max`, or when a signal fires and `age >= a_min`."""

    needs_drift = True
    logs_drift = True

    def __init__(self, config):
        self.config = config

    def due(self, age: int, since_check: int) -> bool:
        return since_check >= self.config.check_interval

    def decide(self, age: int, signals: dict[str, float | None]) -> tuple[bool, str]:
        if age >= self.config.a_max:
            return True, "a_max"
        names = fired(self.config, signals)
        if names and age >= self.config.a_min:
            return True, "+".join(names)
        return False, ""


def schedule_for(config) -> Schedule:
    """The refresh schedule of `config`'s policy (`config`: a `RiftConfig`)."""
    return config.policy_object.schedule()


def calibrate_thresholds(events: list[dict], min_events: int = 4) -> dict[str, float | None]:
    """
    Thresholds for rift-ada from recorded rift-dyn rescoring events.

    Each event holds the signals just before a rescoring (`al_ewma`, `entropy`, `drift`) and `gain`, the AL gain
    that rescoring bought (mean AL of the rounds after it minus the rounds before it). For each signal, the
    threshold is the candidate value (the observed values) that maximises the mean gain of the events it would
    fire on, among thresholds firing on at least `min_events` events; a signal with too few events stays `None`.

    Returns:
        `{"al_threshold": ..., "entropy_threshold": ..., "drift_threshold": ...}`, ready for `RiftConfig(**...)`.
    """
    out: dict[str, float | None] = {}
    for signal, key, fires_below in (
        ("al_ewma", "al_threshold", True),
        ("entropy", "entropy_threshold", False),
        ("drift", "drift_threshold", False),
    ):
        pairs = [(e[signal], e["gain"]) for e in events if e.get(signal) is not None and e.get("gain") is not None]
        best, best_gain = None, -math.inf
        for threshold, _ in pairs:
            chosen = [g for v, g in pairs if (v <= threshold if fires_below else v >= threshold)]
            if len(chosen) < min_events:
                continue
            mean_gain = sum(chosen) / len(chosen)
            if mean_gain > best_gain:
                best, best_gain = threshold, mean_gain
        if best is not None:
            # `fired` uses strict comparisons; nudge so the chosen boundary event itself fires.
            best = math.nextafter(best, math.inf if fires_below else -math.inf)
        out[key] = best
    return out
