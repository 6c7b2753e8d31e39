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

from dataclasses import dataclass, field


@dataclass
class LinearCost:
    """
    Seconds against a size (tokens drafted or verified): a decayed mean per observed size, and a line through them
    (weighted least squares) to price sizes not observed yet. One observed size gives a line through the origin.
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

    def line(self) -> tuple[float, float]:
        """`(intercept, slope)` of the fit, both clamped at >= 0."""
        points = [(x, s / w, w) for x, (s, w) in self.sums.items() if w > 0]
        if len(points) == 1:
            x, y, _ = points[0]
            return 0.0, y / max(x, 1)
        total = sum(w for _, _, w in points)
        mx = sum(x * w for x, _, w in points) / total
        my = sum(y * w for _, y, w in points) / total
        var = sum(w * (x - mx) ** 2 for x, _, w in points)
        slope = max(0.0, sum(w * (x - mx) * (y - my) for x, y, w in points) / var)
        return max(0.0, my - slope * mx), slope

    def __call__(self, size: int) -> float:
        """Expected seconds at `size`: the observed mean where there is one, the line elsewhere."""
        entry = self.sums.get(size)
        if entry is not None and entry[1] > 0.5:
            return entry[0] / entry[1]
        intercept, slope = self.line()
        return intercept + slope * size


@dataclass
class DraftLength:
    """
    Chooses each round's draft length (`choose`) from what past rounds cost and accepted (`observe`).

    Args:
        max_length (`int`): the longest draft (the drafter's `num_assistant_tokens`).
        prior (`float`, defaults to 0.6): acceptance assumed at a draft position before any observation there
            (shrunk towards the positions already observed).
        decay (`float`, defaults to 0.9): weight kept by older observations at each new one.
        backoff (`int`, defaults to 4) and max_backoff (`int`, defaults to 64): rounds without drafting before a probe,
            doubled after a probe that loses to the target alone.
        first_length (`int`, defaults to 4): the first round's draft (at most `max_length`): long enough to price a
            drafter step and see acceptance, short enough to cost little where drafting loses.

    Drafting k tokens is priced as `first + (k - 1) * step`: `step` is one drafter decode forward, `first` the rest of
    a round's drafting (its first forward, which re-feeds the verified tokens and refreshes the cache, and the loop's
    own work). The first round drafts `first_length` (acceptance, the step cost, a longer verification), the second
    drafts nothing (the target's one-token step: what drafting must beat); the choice starts with the third.
    Positions beyond those observed lean on the pooled acceptance, so longer drafts are tried where it is high.
    """

    max_length: int
    prior: float = 0.6
    decay: float = 0.9
    backoff: int = 4
    max_backoff: int = 64
    first_length: int = 4
    accepted: list = field(default_factory=list)  # per position: [weighted accepts, weight]
    first: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of `first`
    step: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of one decode forward
    verify_cost: LinearCost = field(default_factory=LinearCost)
    rounds: int = 0
    idle: int = 0  # rounds left without drafting
    wait: int = 0  # the current back-off
    missed: int = 0  # rounds since the drafter last drafted (its next round re-feeds what they emitted)
    chosen: list = field(default_factory=list)  # (length chosen, reason) per round

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
        if self.rounds == 0 or not self.step[1]:
            return self._pick(
                min(self.first_length, self.max_length) if self.rounds == 0 else self.max_length, "calibrate"
            )
        if 1 not in self.verify_cost.sums:
            return self._pick(0, "calibrate")
        if self.idle > 0:
            self.idle -= 1
            if self.idle > 0:
                return self._pick(0, "target faster")
            best = max(range(1, self.max_length + 1), key=self.rate)
            return self._pick(best, "probe")
        best = max(range(self.max_length + 1), key=self.rate)
        if best == 0:
            # Where even drafts that are all accepted would lose, only the costs could change: probe rarely.
            hopeless = all(self.rate(k, certain=True) <= self.rate(0) for k in range(1, self.max_length + 1))
            self.idle = self.max_backoff if hopeless else self.wait
            self.wait = min(2 * self.wait, self.max_backoff)
            return self._pick(0, "target faster")
        self.wait = self.backoff
        return self._pick(best, "best rate")

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
        for entry in (*self.accepted, self.first, self.step):
            entry[0] *= self.decay
            entry[1] *= self.decay
        for position in range(min(drafted, accepted + 1)):  # accepted ones, then the first rejected one
            entry = self.accepted[position]
            entry[0] += 1.0 if position < accepted else 0.0
            entry[1] += 1.0
        steps = forwards[1:]
        if steps:
            self.step[0] += sum(steps) / len(steps)
            self.step[1] += 1.0
        # The first round holds the drafter's prompt forward, and one after several rounds without drafting re-feeds
        # their tokens: neither prices a round's first forward.
        if forwards and self.rounds > 0 and self.missed <= 1:
            self.first[0] += max(0.0, draft_seconds - sum(steps))
            self.first[1] += 1.0
        self.verify_cost.observe(drafted + 1, verify_seconds)
        self.missed = self.missed + 1 if drafted == 0 else 0
        self.rounds += 1
