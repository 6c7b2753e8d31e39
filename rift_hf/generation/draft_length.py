"""Cost-aware draft length: each round drafts the number of tokens that maximises expected tokens per second.

A round that drafts k tokens costs the drafter's k forwards plus one target forward over k + 1 tokens, and emits
1 + E[accepted | k] tokens, where E[accepted | k] = sum_{i<=k} prod_{j<=i} a_j and a_j is the chance that draft j is
accepted once drafts 1..j-1 were. The target alone emits one token per one-token forward. `DraftLength` keeps
running estimates of all three (acceptance per draft position, the drafter's cost against k, the target's cost against
the tokens it verifies), picks the best k before each round, and drafts nothing (k = 0: the target decodes alone) when
no length beats the target alone, probing again after a back-off that doubles while probes keep losing. The
estimates and the rate they give are `RateModel` (`rate_model.py`); this module is the rule that picks and probes.

The choice only changes how many tokens are proposed, never how they are verified, so greedy output and the sampling
distribution are those of any fixed length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from .rate_model import LinearCost, RateModel, piecewise_linear

__all__ = ["DraftLength", "LinearCost", "RateModel", "piecewise_linear"]


@dataclass
class DraftLength(RateModel):
    """
    Chooses each round's draft length (`choose`) from what past rounds cost and accepted (`observe`).

    Args:
        max_length, prior, decay: the rate model's (`RateModel`).
        backoff (`int`, defaults to 4) and max_backoff (`int`, defaults to 256): rounds without drafting before a
            probe (a draft of `first_length`), doubled after a probe that loses to the target alone, and never so few
            that a probe that accepts nothing costs more than `probe_share` (defaults to 0.02) of the time between.
        first_length (`int`, defaults to 4): the first round's draft (at most `max_length`): long enough to price a
            drafter step and see acceptance, short enough to cost little where drafting loses.
        explore_steps (`float`, defaults to 3.0): while what this call's drafting rounds lost to the target alone,
            net of what they gained (`_explored`: today's costs, their real acceptances), stays under this many
            target steps, a back-off stays `backoff` rounds and does not grow: a few unlucky rounds at the start (an
            answer's first tokens are often mispredicted) must not silence a drafter that pays, when finding out
            costs little. Probes that accept a draft or two cost about what the target alone would have, so they
            spend little of it; rounds that paid extend it. Where a probe is dear (a drafter step near a target
            step) the budget runs out after a probe or two and the back-off spaces probes out by what a probe is
            expected to lose at the acceptance seen so far (`probe_share`).

    Drafting k tokens is priced as `first + (k - 1) * step`: `step` is one drafter decode forward, `first` the rest of
    a round's drafting (its first forward, which re-feeds the verified tokens and refreshes the cache, and the loop's
    own work). The first round drafts `first_length` (acceptance and the step cost), the second nothing (the target's
    one-token step: what drafting must beat), the third drafts where the first says the choice will fall (`max_length`
    if every draft was accepted, else one past those that were), pricing a verification of several tokens and the
    round's fixed cost, which the first round's warm-up would overstate; the choice starts with the fourth. A back-off
    right after the second round counts it as its first round (`_back_off`).
    Positions beyond those observed lean on the pooled acceptance, so longer drafts are tried where it is high. Rounds
    without drafting are seen too: the next drafting round re-feeds their tokens, and the drafter's greedy predictions
    there say how many drafts it would have had accepted (`observe_idle`), so a probe that accepts nothing does not
    alone decide the next back-off. `python -m benchmarks.draft_length_sim` (synthetic loops) and `python -m
    benchmarks.draft_length_traces` (the rounds of exact replays, priced as measured) measure a change against the
    best constant length.
    """

    backoff: int = 4
    max_backoff: int = 256
    first_length: int = 4
    probe_share: float = 0.02
    explore_steps: float = 3.0
    rounds: int = 0
    idle: int = 0  # rounds left without drafting
    wait: int = 0  # the current back-off
    first_accepted: int = 0  # drafts accepted in the first round
    warm: bool = False  # this call's first round is behind us (its costs hold warm-up and the prompt forward)
    missed: int = 0  # rounds since the drafter last drafted (its next round re-feeds what they emitted)
    chosen: list = field(default_factory=list)  # (length chosen, reason) per round
    outcomes: dict = field(default_factory=dict)  # (drafted, accepted) -> this call's drafting rounds with them

    def __post_init__(self):
        super().__post_init__()
        self.wait = self.backoff

    def choose(self) -> int:
        """The draft length of the next round."""
        first = min(self.first_length, self.max_length)
        if not self.warm:  # every call's first round: this prompt's acceptance
            return self._pick(first, "calibrate")
        if 1 not in self.verify_cost.sums:
            return self._pick(0, "calibrate")
        taken = self.first_accepted
        if (len(self.verify_cost.sums) < 2 or not self.step[1]) and taken and not self.idle:
            # A verification of several tokens, where the first round says the choice will fall: the longest draft if
            # it was all accepted, else one past what was. (Where nothing was accepted, the target decodes alone
            # first and a probe prices it later.)
            return self._pick(self.max_length if taken >= first else taken + 1, "calibrate")
        if self.idle > 0:
            self.idle -= 1
            if self.idle > 0:
                return self._pick(0, "target faster")
            return self._pick(first, "probe")
        best = max(range(self.max_length + 1), key=self.rate)
        if best == 0:
            # While this call's drafting has lost little to the target alone, look again soon (`explore_steps`).
            if self._explored() < self.explore_steps * self.verify_cost(1):
                return self._back_off(self.backoff)
            # Otherwise probes are spaced so that a probe's expected loss (over the target alone, at the acceptance
            # estimated so far, idle evidence included) stays within `probe_share` of the time spent decoding alone;
            # the spacing also doubles while probes keep losing. (Priced as if nothing were accepted, a probe at ~32K
            # in bf16 spaced probes ~80 rounds apart as soon as the budget ran out, even where the drafter had started
            # to predict the answer: `python -m benchmarks.draft_length_traces`, resumed calls.)
            v1 = self.verify_cost(1)
            loss = max(0.0, self.draft_seconds(first) + self.verify_cost(first + 1) - self.expected_tokens(first) * v1)
            spacing = math.ceil(loss / (self.probe_share * max(v1, 1e-9)))
            # (The first back-off is short: early estimates rest on a round or two.)
            rounds = self.wait if self.wait == self.backoff else min(max(self.wait, spacing), self.max_backoff)
            self.wait = min(2 * self.wait, self.max_backoff)
            return self._back_off(rounds)
        self.wait = self.backoff
        return self._pick(best, "best rate")

    def _explored(self) -> float:
        """What this call's drafting rounds lost to the target alone so far, net of what they gained, priced at
        today's costs with their real acceptances: a round drafting k that kept a emitted a + 1 tokens, which the
        target alone emits in a + 1 steps."""
        v1 = self.verify_cost(1)
        return sum(
            n * (self.draft_seconds(k) + self.verify_cost(k + 1) - (a + 1) * v1) for (k, a), n in self.outcomes.items()
        )

    def _back_off(self, rounds: int) -> int:
        """Decode alone for `rounds` rounds (this one included), then probe. A back-off that starts right after the
        round that timed the target alone counts that round as its first (it drafted nothing either), so a fresh call
        probes where a resumed one, which skips that round, would.
        (`python -m benchmarks.draft_length_traces`: ~32K `repeat` 1.00 -> 1.02 of a constant 11 on the tune half, the
        other tune rows unchanged; `benchmarks.draft_length_sim`: no case lower by more than 0.01.)"""
        if self.chosen and self.chosen[-1] == (0, "calibrate"):
            rounds = max(1, rounds - 1)
        self.idle = rounds
        return self._pick(0, "target faster")

    def _pick(self, length: int, reason: str) -> int:
        self.chosen.append((length, reason))
        return length

    def observe(
        self, drafted: int, accepted: int, draft_seconds: float, verify_seconds: float, forwards: list[float]
    ) -> None:
        """
        One round's outcome: `drafted` tokens proposed and `accepted` of them kept; the round's drafting and
        verification time, and the time of each drafter forward in order (`forwards`, empty without drafting).
        """
        # The first round prices only steps: its first forward holds the drafter's prompt forward (or its first
        # compression), its verification the target's first forward over a cache (several times a later one's on a
        # CPU: allocation). A round after several without drafting re-feeds their tokens: it does not price `first`.
        self.observe_costs(draft_seconds, verify_seconds, forwards, drafted, price=self.warm, first=self.missed <= 1)
        self.observe_acceptance(drafted, accepted)
        if not self.warm:
            self.first_accepted = accepted
        if drafted:
            self.outcomes[drafted, accepted] = self.outcomes.get((drafted, accepted), 0) + 1
        self.missed = self.missed + 1 if drafted == 0 else 0
        self.rounds += 1
        self.warm = True

    def resume(self) -> DraftLength:
        """A controller for the next `generate` call on the same models: the costs and acceptance learnt so far carry
        over (they keep adapting), so only the first call calibrates; back-off and this call's warm-up start afresh."""
        import copy

        nxt = copy.deepcopy(self)
        nxt.idle, nxt.wait, nxt.missed, nxt.warm, nxt.chosen, nxt.outcomes = 0, self.backoff, 0, False, [], {}
        # Acceptance belongs to a prompt: the new call starts from the last one's pooled rate, held lightly.
        seen = [(a, w) for a, w in self.accepted if w > 0]
        nxt.prior = sum(a for a, _ in seen) / sum(w for _, w in seen) if seen else self.prior
        nxt.accepted = [[0.0, 0.0] for _ in range(self.max_length)]
        return nxt
