"""When a store policy refreshes its selection: the policy's schedule, fed the acceptance and drift signals, counted
in verified tokens since the last selection and the last check."""

from __future__ import annotations

import time

import torch

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
        self.in_round_at: int | None = None  # tokens seen at the last re-choice inside a round (`choose_in_round`)
        self.before_in_round: list | None = None  # each layer's selection before it (`undo_in_round`)

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


def choose_in_round(cache) -> None:
    """
    A drafting forward of `cache` (a `RiftCache`) is starting: if `rechoose_after` drafted tokens are in flight since
    the round's commit, the policy chooses the selection again from the round's queries so far
    (`Policy.rechoose_layers`) and each layer swaps its selection rows (`RiftStoreLayer.reselect`). Nothing is
    committed: the rows in flight stay, a rollback still works, and the next commit refreshes as usual. Logged in
    `events` with reason "in-round".
    """
    first = cache.rift_layers[0] if cache.rift_layers else None
    if first is None or first.selected is None or not first.compressed or cache.refresh.in_round_at == first.seen:
        return  # not compressed yet, or already done for this forward (the mask may be sized more than once)
    drafted = first.stored - first.committed
    if drafted != cache.config.rechoose_after:
        return
    cache.refresh.in_round_at = first.seen
    cache.refresh.before_in_round = [layer.selected for layer in cache.rift_layers]
    tick = time.perf_counter()
    chosen = cache.policy.rechoose_layers(cache.rift_layers, cache, drafted)
    for layer, selected in zip(cache.rift_layers, chosen, strict=True):
        if selected is not None:
            layer.reselect(selected)
    if first.device is not None and torch.device(first.device).type == "cuda":
        torch.cuda.synchronize(first.device)
    cache.refresh.record(first.seen, time.perf_counter() - tick, "in-round", None)


def bounded_rollback(cache, tokens_to_remove: int) -> int:
    """
    The rollback `cache.crop(tokens_to_remove)` may make (`tokens_to_remove` <= 0): never below the end of the last
    verified forward (`cache.verified_length`; transformers re-feeds one verified token when no draft was accepted,
    and keeping it is equivalent). With linear-attention / SSM layers their states are restored to that point here,
    and the attention layers go back to it too, so the drafter re-feeds the accepted tokens.
    """
    verified = cache.verified_length
    if verified is None:
        return tokens_to_remove
    seen = cache.get_seq_length()
    target = seen + tokens_to_remove
    if target < verified - 1:
        raise ValueError(
            f"Cannot roll back to {target} tokens: the last verified forward ended at {verified} and earlier entries "
            "may be compressed or folded into recurrent states."
        )
    if cache.state_layers:
        target = verified
        for layer in cache.state_layers:
            layer.restore(target)
    return -(seen - max(target, verified))


def undo_in_round(cache) -> None:
    """
    At a rollback of `cache`: if it removed a drafted token whose query scored this round's re-choice, put the
    selection chosen at the round's commit back (its rows read from the store again). The re-fed verified tokens then
    meet the working set they would have met without the re-choice, which never depends on a rejected draft (so exact
    replay, which feeds the target's tokens where drafts were rejected, reproduces it); when every scoring draft was
    accepted the re-choice stays until the next refresh.
    """
    before, cache.refresh.before_in_round = cache.refresh.before_in_round, None
    first = cache.rift_layers[0] if cache.rift_layers else None
    if before is None or first is None or first.seen >= cache.refresh.in_round_at:
        return
    for layer, selected in zip(cache.rift_layers, before, strict=True):
        if selected is not None and layer.selected is not selected:
            layer.reselect(selected)


def commit_layers(cache, rollback: bool = False) -> None:
    """
    Commit every compressed layer of `cache` (a `RiftCache` past its budget's resolution): refresh the selection where
    the policy's schedule says so (after a rollback only if the policy refreshes there: `Policy.refresh_at_rollback`),
    and after every chunk of a prompt read in chunks (`cache.reading`), where a store policy chooses again.
    """
    first = cache.rift_layers[0]
    seen, started, reading = first.seen, first.selected is not None, cache.reading is not None
    rescore, reason, signals = False, "", None
    if reading and started and cache.policy.keeps_store:
        rescore = True
    elif started and (not rollback or cache.policy.refresh_at_rollback) and seen > cache.budget:
        rescore, reason, signals = cache.refresh.decide(seen, cache.rift_layers, cache.records_queries)
    tick = time.perf_counter()
    chosen = cache.policy.select_layers(cache.rift_layers, cache) if rescore else None
    for i, layer in enumerate(cache.rift_layers):
        layer.commit(rescore, None if chosen is None else chosen[i])
    if rescore and not reading:  # choices made while reading are part of the prompt pass, not refreshes
        if first.device is not None and torch.device(first.device).type == "cuda":
            torch.cuda.synchronize(first.device)
        cache.refresh.record(seen, time.perf_counter() - tick, reason, signals)
    if rescore or (not started and first.selected is not None):
        cache.refresh.restart(seen)
