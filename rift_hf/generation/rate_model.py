"""The rate model of the cost-aware draft length (`draft_length.DraftLength`): what a round drafting k tokens costs
and emits, learnt from the rounds seen.

A round that drafts k tokens costs `first + (k - 1) * step` of drafting (`step`: one drafter decode forward; `first`:
the rest of a round's drafting, its first forward re-feeding the verified tokens and the loop's own work) plus a
target forward verifying k + 1 tokens (`verify_cost(k + 1)`, a `LinearCost`), and emits 1 + E[accepted | k] tokens,
E[accepted | k] = sum_{i<=k} prod_{j<=i} a_j, where a_j is the chance that draft j is accepted once drafts 1..j-1 were
(`acceptance`). Its rate is tokens over seconds (`rate`); k = 0 is the target alone.
"""

from __future__ import annotations

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
class RateModel:
    """
    Running estimates of acceptance per draft position, the drafter's costs and the target's verification cost.

    Args:
        max_length (`int`): the longest draft (the drafter's `num_assistant_tokens`).
        prior (`float`, defaults to 0.6): acceptance assumed at a draft position before any observation there
            (shrunk towards the positions already observed).
        decay (`float`, defaults to 0.9): weight kept by older observations at each new one.
    """

    max_length: int
    prior: float = 0.6
    decay: float = 0.9
    accepted: list = field(default_factory=list)  # per position: [weighted accepts, weight]
    first: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of `first`
    step: list = field(default_factory=lambda: [0.0, 0.0])  # [weighted seconds, weight] of one decode forward
    verify_cost: LinearCost = field(default_factory=LinearCost)

    def __post_init__(self):
        if isinstance(self.max_length, bool) or not isinstance(self.max_length, int) or self.max_length < 1:
            raise ValueError(f"max_length must be an int >= 1, got {self.max_length!r}.")
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

    def observe_costs(
        self, draft_seconds: float, verify_seconds: float, forwards: list[float], drafted: int, price: bool, first: bool
    ) -> None:
        """A round's costs: its drafter forwards' seconds in order (`forwards`; all but the first price `step`); with
        `price`, its verification of `drafted + 1` tokens, and with `first` too, the drafting beyond its steps."""
        for entry in (self.first, self.step):
            entry[0] *= self.decay
            entry[1] *= self.decay
        steps = forwards[1:]
        if steps:
            self.step[0] += sum(steps) / len(steps)
            self.step[1] += 1.0
        if price:
            if forwards and first:
                self.first[0] += max(0.0, draft_seconds - sum(steps))
                self.first[1] += 1.0
            self.verify_cost.observe(drafted + 1, verify_seconds)

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
            self.observe_acceptance(drafted, min(accepted, drafted))

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        for entry in self.accepted:
            entry[0] *= self.decay
            entry[1] *= self.decay
        for position in range(min(drafted, accepted + 1)):  # accepted ones, then the first rejected one
            entry = self.accepted[position]
            entry[0] += 1.0 if position < accepted else 0.0
            entry[1] += 1.0
