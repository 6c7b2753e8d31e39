"""Cost-aware draft length: each round drafts the number of tokens that maximises expected tokens per second.

A round that drafts k tokens costs the drafter's k forwards plus one target forward over k + 1 tokens, and emits
1 + E[accepted | k] tokens, where E[accepted | k] = sum_{i<=k} prod_{j<=i} a_j and a_j is the chance that draft j is
accepted once drafts 1..j-1 were. The target alone emits one token per one-token forward. `DraftLength` keeps
running estimates of all three (acceptance per draft position, the drafter's cost against k, the target's cost against
the tokens it verifies), picks the best k before each round, and drafts nothing (k = 0: the target decodes alone) when
no length beats the target alone, probing again after a back-off that doubles while probes keep losing.

The choice only changes how many tokens are proposed, never how they are verified, so greedy output and the sampling
distribution are those of any fixed length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass
class LinearCost:
    """
    Seconds against a size (tokens verified): a decayed mean per observed size, straight lines between observed sizes
    to price the sizes between them, and no growth past the largest observed size until a larger one is observed.

    Past the largest size it prices the largest's cost, not a line's: a verification's cost is far from linear in its
    tokens where reading the weights dominates (qwen-coder at ~32K in bf16 on a CPU: 0.42 s for one token, 0.61 s for
    3, 0.65 s for 12; `benchmarks/results/verify-cost-bf16`), and a line through 1 and 3 prices 12 at 1.46 s, so the
    controller never drafted long enough to see otherwise. Priced this way a longer draft gets tried, and its measured
    cost then replaces the guess (`python -m benchmarks.draft_length_sim`: no case worse by more than 0.01, 0.94 ->
    0.98 of the best constant length on the flat-verification one).
    """

    decay: float = 0.9
    sums: dict = field(default_factory=dict)  # size -> [weighted seconds, weight]

    def observe(self, size: int, seconds: float) -> None:
        for entry in self.sums.values():
            entry[0] *= self.decay
            entry[1] *= self.decay
        entry = self.sums.setdefault(size, [0.0, 0.0])
        entry[0] += seconds
        entry[1] += 1.0

    @property
    def known(self) -> bool:
        return bool(self.sums)

    def __call__(self, size: int) -> float:
        """Expected seconds at `size`: the observed mean where there is one; between two observed sizes, the straight
        line through them; below the smallest, the line through the two smallest (through the origin when only one
        size is observed); above the largest, the largest's mean."""
        entry = self.sums.get(size)
        if entry is not None and entry[1] > 0.5:
            return entry[0] / entry[1]
        return piecewise_linear(sorted((x, s / w) for x, (s, w) in self.sums.items() if w > 0), size)


def piecewise_linear(points: list, size: float) -> float:
    """`points` `[(size, seconds)]` sorted by size -> the seconds at `size`: the straight line through the two points
    around it (the two smallest below them, through the origin when there is one point), the last point's seconds past
    the largest; 0 without points."""
    if not points:
        return 0.0
    if size >= points[-1][0]:
        return points[-1][1]
    if len(points) == 1:
        x, y = points[0]
        return y * size / max(x, 1)
    below = sum(x <= size for x, _ in points)
    (x0, y0), (x1, y1) = points[max(below, 1) - 1], points[max(below, 1)]
    return y0 + (y1 - y0) * (size - x0) / (x1 - x0)


@dataclass
class DraftLength:
    """
    Chooses each round's draft length (`choose`) from what past rounds cost and accepted (`observe`).

    Args:
        max_length (`int`): the longest draft (the drafter's `num_assistant_tokens`).
        prior (`float`, defaults to 0.6): acceptance assumed at a draft position before any observation there
            (shrunk towards the positions already observed).
        decay (`float`, defaults to 0.9): weight kept by older observations at each new one.
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

    max_length: int
    prior: float = 0.6
    decay: float = 0.9
    backoff: int = 4
    max_backoff: int = 256
    first_length: int = 4
    probe_share: float = 0.02
    explore_steps: float = 3.0
    accepted: list = field(default_factory=list)  # per position: [weighted accepts, weight]
    first: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of `first`
    step: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of one decode forward
    verify_cost: LinearCost = field(default_factory=LinearCost)
    rounds: int = 0
    idle: int = 0  # rounds left without drafting
    wait: int = 0  # the current back-off
    first_accepted: int = 0  # drafts accepted in the first round
    warm: bool = False  # this call's first round is behind us (its costs hold warm-up and the prompt forward)
    missed: int = 0  # rounds since the drafter last drafted (its next round re-feeds what they emitted)
    chosen: list = field(default_factory=list)  # (length chosen, reason) per round
    outcomes: dict = field(default_factory=dict)  # (drafted, accepted) -> this call's drafting rounds with them

    def __post_init__(self):
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {self.max_length!r}.")
        self.wait = self.backoff
        self.accepted = [[0.0, 0.0] for _ in range(self.max_length)]

    def acceptance(self) -> list[float]:
        """Estimated chance that draft j is accepted given drafts 1..j-1 were, for j = 1..max_length."""
        seen = [(s, w) for s, w in self.accepted if w > 0]
        pooled = sum(s for s, _ in seen) / sum(w for _, w in seen) if seen else self.prior
        # Two pseudo-observations of the pooled rate: a position seen rarely leans on the others.
        return [(s + 2.0 * pooled) / (w + 2.0) for s, w in self.accepted]

    def expected_tokens(self, length: int) -> float:
        """Tokens a round that drafts `length` emits on average: accepted drafts plus the target's own token."""
        total, run = 1.0, 1.0
        for a in self.acceptance()[:length]:
            run *= a
            total += run
        return total

    def draft_seconds(self, length: int) -> float:
        """Expected drafting time of a round that drafts `length` tokens."""
        step = self.step[0] / self.step[1] if self.step[1] else 0.0
        first = self.first[0] / self.first[1] if self.first[1] else step  # until observed, as dear as a step
        return first + (length - 1) * step if length else 0.0

    def rate(self, length: int, certain: bool = False) -> float:
        """Expected tokens per second of a round drafting `length` (0: the target alone); with `certain`, as if
        every draft were accepted (the most drafting could give at today's costs)."""
        seconds = self.draft_seconds(length) + self.verify_cost(length + 1)
        tokens = length + 1 if certain else self.expected_tokens(length)
        return tokens / max(seconds, 1e-9)

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
        for entry in (self.first, self.step):
            entry[0] *= self.decay
            entry[1] *= self.decay
        self._observe_acceptance(drafted, accepted)
        steps = forwards[1:]
        if steps:
            self.step[0] += sum(steps) / len(steps)
            self.step[1] += 1.0
        # The first round prices only steps: its first forward holds the drafter's prompt forward (or its first
        # compression), its verification the target's first forward over a cache (several times a later one's on a
        # CPU: allocation). A round after several without drafting re-feeds their tokens: it does not price `first`.
        if self.warm:
            if forwards and self.missed <= 1:
                self.first[0] += max(0.0, draft_seconds - sum(steps))
                self.first[1] += 1.0
            self.verify_cost.observe(drafted + 1, verify_seconds)
        if not self.warm:
            self.first_accepted = accepted
        if drafted:
            self.outcomes[drafted, accepted] = self.outcomes.get((drafted, accepted), 0) + 1
        self.missed = self.missed + 1 if drafted == 0 else 0
        self.rounds += 1
        self.warm = True

    def observe_idle(self, rounds: list[tuple[int, int]]) -> None:
        """
        Acceptance seen without drafting: `(accepted, drafted)` per token the target emitted alone, oldest first, as
        if a round had drafted there: the drafter's greedy predictions when it re-feeds those tokens tell how many
        drafts in a row it would have had accepted from each (up to the last of them, hence `drafted`). Rounds
        without drafting otherwise teach nothing, so one early round that accepts nothing could keep the drafter
        silent through a stretch it would have predicted (`benchmarks/draft_length_traces.py`).
        """
        for accepted, drafted in rounds:
            drafted = min(drafted, self.max_length)
            self._observe_acceptance(drafted, min(accepted, drafted))

    def _observe_acceptance(self, drafted: int, accepted: int) -> None:
        for entry in self.accepted:
            entry[0] *= self.decay
            entry[1] *= self.decay
        for position in range(min(drafted, accepted + 1)):  # accepted ones, then the first rejected one
            entry = self.accepted[position]
            entry[0] += 1.0 if position < accepted else 0.0
            entry[1] += 1.0

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
