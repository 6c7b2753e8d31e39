"""The cost-aware draft length (`rift_hf.generation.draft_length.DraftLength`) against synthetic loops, at run lengths
our real runs have (128 new tokens is 20-40 rounds), next to the best constant length chosen with hindsight.

    python -m benchmarks.draft_length_sim                  # every case, 40 and 256 rounds, 8 seeds
    python -m benchmarks.draft_length_sim --rounds 40 --seeds 2

A case prices drafting k tokens as k drafter steps and a verification of n tokens as `v0 + v1 * n` seconds (or a
measured curve), and
draws each round's accepted drafts from an acceptance model: i.i.d. (each draft accepted with chance p once the ones
before were) or a mixture of "easy" and "hard" rounds (acceptance comes in runs: a file being repeated, then a
passage the drafter cannot predict), optionally sticky (a round's kind persists into the next) and with the first
rounds rejecting everything (the start of an answer). The best constant length is the one with the highest mean rate
over the same draws. No timing is measured: the seconds are the case's, so the result is the same on every machine.

Writes `<--out>/draft-length-sim.json` (`benchmarks/results/` by default) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import datetime
import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from lab.records import write_record
from lab.tables import pipe_table
from rift_hf.generation.draft_length import DraftLength
from rift_hf.generation.rate_model import piecewise_linear


@dataclass
class Case:
    draft_step: float  # seconds per drafted token
    v0: float  # verification seconds: v0 + v1 * tokens verified
    v1: float
    easy: float  # acceptance per draft in an easy round (an i.i.d. case: every round is easy)
    hard: float = 0.0  # acceptance per draft in a hard round
    share: float = 1.0  # chance that a round is easy
    stick: float = 0.0  # chance that a round keeps the previous round's kind
    cold: int = 0  # first rounds that accept nothing
    curve: tuple = ()  # measured (tokens, seconds) of verifications, interpolated, instead of v0 + v1 * tokens

    def verify(self, tokens: int) -> float:
        return piecewise_linear(sorted(self.curve), tokens) if self.curve else self.v0 + self.v1 * tokens


CASES = {
    "cheap-agreeing": Case(0.05, 1.0, 0.02, 0.9),
    "dear": Case(0.3, 1.0, 0.05, 0.6),
    "losing": Case(0.5, 0.4, 0.1, 0.3),
    "cpu-4k-like": Case(0.1, 0.5, 0.13, 0.75),
    # ~32K on this CPU after gqa_attention: a drafter step ~0.2 s, a target step ~1.3 s, ~0.1 s per verified token
    "cpu-32k-runs": Case(0.2, 1.25, 0.1, 0.97, 0.25, share=0.6),
    "cpu-32k-runs-cold": Case(0.2, 1.25, 0.1, 0.97, 0.25, share=0.6, cold=2),
    # ~32K in bf16 on an AMX CPU: a verification is nearly flat past 2 tokens (one-token step 0.42 s, 2 tokens
    # 0.58 s, 12 tokens 0.65 s: benchmarks/results/verify-cost-bf16); a page-round drafter step ~0.14 s
    # (speed-32000in-128tok-bf16)
    "cpu-32k-bf16-flat-verify": Case(
        0.14,
        0.0,
        0.0,
        0.97,
        0.25,
        share=0.8,
        curve=((1, 0.423), (2, 0.582), (3, 0.611), (4, 0.61), (6, 0.615), (8, 0.624), (12, 0.648)),
    ),
    "cpu-16k-sticky": Case(0.12, 0.9, 0.06, 0.95, 0.35, share=0.5, stick=0.5),
    "gpu-like-runs": Case(0.02, 0.1, 0.001, 0.95, 0.4, share=0.5),
    "dear-runs": Case(0.3, 1.0, 0.05, 0.9, 0.2, share=0.5),
}


def draws(case: Case, rounds: int, seed: int) -> list[list[bool]]:
    """Per round, whether each of 11 drafts would be accepted given the ones before (the run stops at the first no)."""
    rng, easy, out = random.Random(seed), True, []
    for r in range(rounds):
        if rng.random() >= case.stick or r == 0:
            easy = rng.random() < case.share
        p = 0.0 if r < case.cold else case.easy if easy else case.hard
        out.append([rng.random() < p for _ in range(11)])
    return out


def accepted(draw: list[bool], k: int) -> int:
    n = 0
    while n < k and draw[n]:
        n += 1
    return n


def run_controller(case: Case, rounds: list[list[bool]], make=DraftLength) -> tuple[float, list[int]]:
    """Tokens per second of a controller (`make(max_length=11)`) over `rounds` (one draw per round, in order), and
    its lengths."""
    controller = make(max_length=11)
    tokens = seconds = 0.0
    lengths = []
    for draw in rounds:
        k = controller.choose()
        n = accepted(draw, k)
        forwards = [case.draft_step] * k
        if forwards and controller.rounds == 0:
            forwards[0] += 50 * case.draft_step  # the drafter's prompt forward: not in a decode-phase rate
        controller.observe(k, n, sum(forwards), case.verify(k + 1), forwards)
        tokens += n + 1
        seconds += k * case.draft_step + case.verify(k + 1)
        lengths.append(k)
    return tokens / seconds, lengths


def run_constant(case: Case, rounds: list[list[bool]], k: int) -> float:
    tokens = sum(accepted(draw, k) + 1 for draw in rounds)
    return tokens / (len(rounds) * (k * case.draft_step + case.verify(k + 1)))


def simulate(rounds: list[int], seeds: int, cases=CASES, make=DraftLength) -> list[dict]:
    """One row per case and run length: the controller `make` builds against the best constant length."""
    rows = []
    for name, case in cases.items():
        for n_rounds in rounds:
            sets = [draws(case, n_rounds, seed) for seed in range(seeds)]
            constant = {k: statistics.mean(run_constant(case, s, k) for s in sets) for k in range(12)}
            best = max(constant, key=constant.get)
            runs = [run_controller(case, s, make) for s in sets]
            rate = statistics.mean(r for r, _ in runs)
            alone = 1 / case.verify(1)
            rows.append(
                {
                    "case": name,
                    "rounds": n_rounds,
                    "seeds": seeds,
                    "best_constant": best,
                    "vs_best_constant": rate / constant[best],
                    "vs_constant_11": rate / constant[11],
                    "vs_target_alone": rate / alone,
                    "best_vs_target_alone": constant[best] / alone,
                    "mean_length": statistics.mean(statistics.mean(lengths) for _, lengths in runs),
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    headers = ["case", "rounds", "best constant", "controller / best", "controller / 11", "controller / target",
               "best / target", "mean length"]  # fmt: skip
    body = [
        [r["case"], r["rounds"], r["best_constant"], f"{r['vs_best_constant']:.2f}", f"{r['vs_constant_11']:.2f}",
         f"{r['vs_target_alone']:.2f}", f"{r['best_vs_target_alone']:.2f}", f"{r['mean_length']:.1f}"]
        for r in rows
    ]  # fmt: skip
    return pipe_table(headers, body) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, nargs="+", default=[40, 256])
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if args.seeds < 1 or any(r < 1 for r in args.rounds):
        raise SystemExit("--rounds and --seeds must be positive.")
    rows = simulate(args.rounds, args.seeds)
    record = {"date": datetime.date.today().isoformat(), "rows": rows}
    write_record(args.out, "draft-length-sim", record, table(rows))


if __name__ == "__main__":
    main()
