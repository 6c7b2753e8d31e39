"""When a store policy refreshes its selection: the policy's schedule, fed the acceptance and drift signals, counted
in verified tokens since the last selection and the last check."""

from __future__ import annotations

from ..policies import Signals


class Refresh:
    """
    The refresh clock of one `RiftCache`: `decide` at a commit past the budget, `record` a refresh that happened,
    `restart` when a selection was made. `events` holds one entry per refresh (position, seconds, reason, signals);
    `signals` is fed by the generation loop (acceptance, entropy) and here (drift of the recent queries).
    """

    def __init__(self, policy, config, events: list | None = None):
        self.schedule = policy.schedule()
        self.signals = Signals(alpha=config.al_alpha, entropy_window=config.check_interval)
        self.events: list[dict] = [] if events is None else events
        self.last_select = self.last_check = 0

    def restart(self, position: int) -> None:
        self.last_select = self.last_check = position

    def decide(self, seen: int, layers, records_queries: bool) -> tuple[bool, str, dict | None]:
        """`(refresh, reason, signals)` at a commit after `seen` tokens, as the schedule says."""
        if not self.schedule.due(seen - self.last_select, seen - self.last_check):
            return False, "", None
        self.last_check = seen
        if records_queries and self.schedule.logs_drift:
            self.signals.drift = drift(layers)
        signals = self.signals.snapshot()
        return (*self.schedule.decide(seen - self.last_select, signals), signals)

    def record(self, seen: int, seconds: float, reason: str, signals: dict | None) -> None:
        self.events.append({"position": seen, "seconds": seconds, "reason": reason, "signals": signals})


def drift(layers) -> float | None:
    """1 - cosine between each layer's recent mean query now and at its last selection, averaged over layers."""
    values = []
    for layer in layers:
        now = layer.drift_summary()
        if now is not None and layer.drift_reference is not None:
            values.append(1.0 - float(now @ layer.drift_reference))
    return sum(values) / len(values) if values else None
