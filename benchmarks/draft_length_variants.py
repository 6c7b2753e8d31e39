"""Variants of the cost-aware draft length played side by side with today's `DraftLength` (#40): the synthetic loops
of `benchmarks.draft_length_sim` and the replayed rounds of `benchmarks.draft_length_traces`, without and with the
host's cost noise. A variant is kept only if it beats today's on the traces' tune half without losing on the rest;
the ones here were not (2026-12-06), and are kept so that the claim can be rerun and a new idea added beside them.

    python -m benchmarks.draft_length_variants                    # every variant; 8 noise seeds
    python -m benchmarks.draft_length_variants --variants today,grow-after-full --noise-seeds 2

Variants (each changes one thing):
- `grow-after-full`: after a round that kept every draft, the next drafts at least two more, where that still beats
  the target alone and is priced within 5% of the best length (acceptance comes in runs, and positions never drafted
  lean on the pooled rate, so the choice climbs back slowly after an early rejection).
- `backoff-2`: back-offs start at 2 rounds without drafting instead of 4.
- `pooled-8`: each draft position leans on the pooled acceptance with 8 pseudo-observations instead of 2 (a rejection
  at one position says little about that position in particular).
- `forgive-first`: a first round that accepts nothing teaches nothing about acceptance (an answer's first token is
  often mispredicted).
- `fading-prices`: a verification size's price leans on the line through the other sizes' prices, more as its own
  observations age (one slow verification of a size not drafted since otherwise prices it high for good).

Writes `<--out>/draft-length-variants.json` and a markdown table beside it (`benchmarks/results/` by default).
"""

from __future__ import annotations

import argparse
import datetime
import statistics
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from benchmarks import draft_length_sim as sim
from benchmarks import draft_length_traces as traces
from rift_hf.experiments.records import write_record
from rift_hf.experiments.tables import pipe_table
from rift_hf.generation.draft_length import DraftLength, LinearCost, piecewise_linear


@dataclass
class GrowAfterFull(DraftLength):
    """After a round that kept all its k drafts, draft at least k + `grow` where that beats the target alone and is
    priced within `slack` of the best length's rate."""

    grow: int = 2
    slack: float = 0.05
    last: tuple = (0, 0)  # (drafted, accepted) of the last round that drafted

    def choose(self) -> int:
        length = super().choose()
        drafted, kept = self.last
        if self.chosen[-1][1] != "best rate" or not drafted or kept < drafted:
            return length
        floor = min(self.max_length, drafted + self.grow)
        rate = self.rate(floor)
        if length < floor and rate > self.rate(0) and rate >= (1 - self.slack) * self.rate(length):
            self.chosen[-1] = (floor, "grow")
            return floor
        return length

    def observe(self, drafted, accepted, draft_seconds, verify_seconds, forwards) -> None:
        super().observe(drafted, accepted, draft_seconds, verify_seconds, forwards)
        if drafted:
            self.last = (drafted, accepted)


@dataclass
class PooledHarder(DraftLength):
    """Each position's acceptance shrunk towards the pooled rate with `pseudo` pseudo-observations (today: 2)."""

    pseudo: float = 8.0

    def acceptance(self) -> list[float]:
        seen = [(s, w) for s, w in self.accepted if w > 0]
        pooled = sum(s for s, _ in seen) / sum(w for _, w in seen) if seen else self.prior
        return [(s + self.pseudo * pooled) / (w + self.pseudo) for s, w in self.accepted]


@dataclass
class ForgiveFirst(DraftLength):
    """A call's first round that accepts nothing is not counted as acceptance evidence."""

    def _observe_acceptance(self, drafted: int, accepted: int) -> None:
        if self.warm or accepted:
            super()._observe_acceptance(drafted, accepted)


@dataclass
class FadingCost(LinearCost):
    """Each observed size's mean leans on the line through the other sizes' means, with `pseudo` pseudo-observations:
    a size verified often keeps its own price, one whose observations have decayed takes its neighbours'."""

    pseudo: float = 0.3

    def __call__(self, size: int) -> float:
        points = sorted((x, s / w, w) for x, (s, w) in self.sums.items() if w > 0)
        faded = []
        for x, mean, weight in points:
            others = [(a, b) for a, b, _ in points if a != x]
            near = piecewise_linear(others, x) if others else mean
            faded.append((x, (weight * mean + self.pseudo * near) / (weight + self.pseudo)))
        return piecewise_linear(faded, size)


@dataclass
class FadingPrices(DraftLength):
    """Verification priced by `FadingCost`."""

    verify_cost: LinearCost = field(default_factory=FadingCost)


VARIANTS = {
    "today": DraftLength,
    "grow-after-full": GrowAfterFull,
    "backoff-2": partial(DraftLength, backoff=2),
    "pooled-8": PooledHarder,
    "forgive-first": ForgiveFirst,
    "fading-prices": FadingPrices,
}


def summarise(rows: list[dict], half: str) -> dict:
    """One half's trace rows (both starts) -> the figures a variant is judged on."""
    rows = [r for r in rows if r["half"] == half]
    repeat = [r["vs_constant_11"] for r in rows if r["regime"] == "repeat"]
    cont = [r["vs_target"] for r in rows if r["regime"] == "continue"]
    return {
        "repeat_vs_11": statistics.mean(repeat),
        "repeat_vs_11_lowest_row": min(repeat),
        "continue_vs_target": statistics.mean(cont),
        "lowest_prompt_vs_target": min(r["lowest_vs_target"] for r in rows),
    }


def compare(names: list[str], new_tokens: int, seeds: int, sim_seeds: int) -> list[dict]:
    """Per variant: the simulator's cases (mean and lowest of controller / best constant, and the largest fall of one
    case against today's controller) and, per trace half, the clean and noisy traces' summaries (`summarise`)."""
    ratios = traces.cost_noise() if seeds else []
    simulated = {n: [c["vs_best_constant"] for c in sim.simulate([40, 256], sim_seeds, make=VARIANTS[n])]
                 for n in dict.fromkeys(["today", *names])}  # fmt: skip
    rows = []
    for name in names:
        make, cases = VARIANTS[name], simulated[name]
        row = {"variant": name, "sim_mean": statistics.mean(cases), "sim_lowest": min(cases)}
        row["sim_worst_change"] = min(c - t for c, t in zip(cases, simulated["today"], strict=True))
        played = {"clean": traces.evaluate(new_tokens, make)}
        if seeds:
            played["noisy"] = traces.evaluate_noisy(new_tokens, seeds, make, ratios=ratios)
        for kind, trace_rows in played.items():
            for half in ("tune", "eval"):
                row |= {f"{kind}_{half}_{k}": v for k, v in summarise(trace_rows, half).items()}
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    headers = ["variant", "traces", "half", "repeat / 11 (lowest row)", "continue / target", "lowest prompt / target",
               "sim / best constant (lowest case)", "sim: worst case's change"]  # fmt: skip
    body = []
    for r in rows:
        for kind in ("clean", "noisy"):
            for half in ("tune", "eval"):
                key = f"{kind}_{half}_"
                if key + "repeat_vs_11" not in r:
                    continue
                repeat = f"{r[key + 'repeat_vs_11']:.3f} ({r[key + 'repeat_vs_11_lowest_row']:.3f})"
                body.append([
                    r["variant"], kind, half, repeat,
                    f"{r[key + 'continue_vs_target']:.3f}", f"{r[key + 'lowest_prompt_vs_target']:.3f}",
                    f"{r['sim_mean']:.3f} ({r['sim_lowest']:.3f})", f"{r['sim_worst_change']:+.3f}",
                ])  # fmt: skip
    return pipe_table(headers, body) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--noise-seeds", type=int, default=8, help="seeds of cost noise for the noisy traces; 0: none")
    parser.add_argument("--sim-seeds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown or not names:
        raise SystemExit(f"Unknown variants {unknown}; choose from {', '.join(VARIANTS)}.")
    if args.new_tokens < 1 or args.noise_seeds < 0 or args.sim_seeds < 1:
        raise SystemExit("--new-tokens and --sim-seeds must be positive, --noise-seeds at least 0.")
    rows = compare(names, args.new_tokens, args.noise_seeds, args.sim_seeds)
    record = {"date": datetime.date.today().isoformat(), "new_tokens": args.new_tokens,
              "noise_seeds": args.noise_seeds, "sim_seeds": args.sim_seeds, "rows": rows}  # fmt: skip
    write_record(args.out, "draft-length-variants", record, table(rows))


if __name__ == "__main__":
    main()
