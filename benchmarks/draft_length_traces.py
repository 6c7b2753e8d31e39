"""The cost-aware draft length replayed on real acceptance: what each prompt's drafter would accept from every output
position, read from exact-replay records, priced with the costs our speed runs measured on this CPU.

    python -m benchmarks.draft_length_traces            # every trace set below, 128 new tokens
    python -m benchmarks.draft_length_traces --new-tokens 256

`python -m lab replay` records, per prompt and policy, how many of 11 drafts each verification round accepted, along the
target's own greedy output. Greedy drafting depends only on the tokens before it, so from those rounds follows how
many drafts a round starting at any output position would have accepted: inside a round that accepted `n` and
rejected the next, a round starting `j` tokens later accepts `n - j`. (A round that accepted all 11 says nothing about
the target's bonus token after them: the run is taken to continue into the next round when that one accepted
anything. A compressed drafter's selection also depends on its refresh history, which a different draft length
changes a little; the replay's is used.) A controller then drafts along the output: a round drafting `k` at position
`p` accepts `min(k, run(p))` and emits one more, at `draft(k) + verify(k + 1)` seconds.

Each set is played twice: with a fresh controller per prompt, and with the prompts as one model's successive
`generate` calls (each resuming the last call's controller, as in the speed runs and a user's session).

The costs are the same every round unless `--noise-seeds N`: then each round's verification and drafting seconds are
multiplied by factors drawn (seeded) from how far real rounds strayed from their typical cost on one host
(`cost_noise`: the verifications of an AVX2 EPYC's speed runs, where rounds varied most, up to 2x their row's median;
the drafting factors are drawn from the same ratios, as drafting was not timed per forward). The
controller sees the noisy seconds, the constant lengths and the target alone pay the same round's factors, and the
rows are the means over the N seeds (the lowest prompt: the lowest over them).

Trace sets: `tune` (what the controller's settings were chosen on) and `eval` (looked at only to report). Costs per
set: seconds per drafted token and a verification curve (tokens -> seconds, the loop included), from the speed runs
named beside each (`benchmarks/results/long/qwen-coder/...`, page-round drafting a constant 11).

Writes `<--out>/draft-length-traces.json` and a markdown table beside it (`benchmarks/results/` by default).
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from lab.records import write_record
from lab.tables import pipe_table
from rift_hf.generation.draft_length import DraftLength
from rift_hf.generation.rate_model import piecewise_linear

E1 = Path("benchmarks/results/E1/qwen-coder")
GAMMA = 11
IDLE_SEEN = 16  # the newest re-fed tokens whose predictions RiftCandidateGenerator keeps


@dataclass(frozen=True)
class TraceSet:
    half: str  # "tune" or "eval"
    rows: str  # rows.jsonl of an exact replay (drafting a constant 11)
    policy: str
    step: float  # seconds per drafted token (the round's first forward included)
    curve: tuple  # (tokens verified, seconds) of a verification round, the loop included
    costs_from: str
    first: float | None = None  # a round's first forward, measured (else a step plus the replay's refresh seconds)
    setting: str | None = None  # rows from a speed run (`benchmarks.long_inputs speed`): the setting to read


# The ~32K curve is `benchmarks/results/verify-cost-bf16` (sdpa_gqa) plus the loop's ~0.05 s a round; the others are a
# line through the target alone's seconds per token and a constant-11 round's verification and loop (two points).
SETS = {
    "32k-bf16": TraceSet(
        "tune",
        f"{E1}/replay-32000in-256tok-8per-task/4x/rows.jsonl",
        "page-round",
        0.131,
        ((1, 0.475), (2, 0.634), (3, 0.663), (4, 0.662), (6, 0.667), (8, 0.676), (12, 0.744)),
        "speed-32000in-128tok-bf16 (8 prompts) and verify-cost-bf16",
    ),
    "8k-fp32": TraceSet(
        "tune",
        f"{E1}/replay-8192in-256tok-8per-task/4x/rows.jsonl",
        "page-round@pages_ahead=2",
        0.088,
        ((1, 0.288), (12, 0.877)),
        "speed-8192in-128tok-schedules (16 prompts)",
    ),
    "16k-fp32": TraceSet(
        "eval",
        f"{E1}/replay-16384in-256tok-8per-task/4x/rows.jsonl",
        "page-round",
        0.185,
        ((1, 0.722), (12, 1.718)),
        "speed-16384in-128tok-gqa (2 prompts)",
    ),
    # The ~16K replay's acceptance (fp32) priced with a bf16 run's per-round seconds (medians over page-round's rounds
    # by size): the one set whose costs come round by round from a real run of the same prompts' length.
    "16k-bf16": TraceSet(
        "eval",
        f"{E1}/replay-16384in-256tok-8per-task/4x/rows.jsonl",
        "page-round",
        0.097,
        ((1, 0.322), (2, 0.399), (3, 0.406), (5, 0.424), (8, 0.436), (12, 0.455)),
        "speed-16384in-128tok-bf16 (8 prompts, round_draft_seconds / round_verify_seconds)",
        first=0.201,
    ),
    # The default policy's own acceptance at ~32K (rift-dyn, int4 store): the rounds of a constant 11 in a bf16 speed
    # run on an AMX Xeon (`speed-32000in-128tok-bf16-amx-explore-net`, four of the 32k-bf16 set's prompts per regime),
    # priced with that run's per-round seconds (medians by size over both of its drafting settings, each row's first
    # round left out: the verification sizes seen 14 times or more; the step from the 11- and 1-draft rounds'
    # drafting seconds, `first` the 1-draft rounds').
    "32k-bf16-rift-dyn": TraceSet(
        "tune",
        "benchmarks/results/long/qwen-coder/speed-32000in-128tok-bf16-amx-explore-net/rows.jsonl",
        "rift-dyn",
        0.1015,
        ((1, 0.459), (3, 0.641), (4, 0.635), (5, 0.689), (6, 0.679), (7, 0.682), (12, 0.724)),
        "speed-32000in-128tok-bf16-amx-explore-net (round_draft_seconds / round_verify_seconds)",
        first=0.121,
        setting="rift-dyn@tokens_ahead=128,store_dtype=int4",
    ),
    # The default at ~32K in fp32 on an AVX2 EPYC, `repeat` only (5 prompts): the rounds of a constant 11 in
    # `speed-32000in-128tok-fp32-amd-repeat-passes-5`, priced as that run measured them (medians by size over both
    # drafting settings and passes, each row's first round left out: the verification sizes seen 14 times or more;
    # the step from the 11- and 1-draft rounds' drafting seconds, `first` the 1-draft rounds').
    "32k-fp32-rift-dyn": TraceSet(
        "eval",
        "benchmarks/results/long/qwen-coder/speed-32000in-128tok-fp32-amd-repeat-passes-5/rows.jsonl",
        "rift-dyn",
        0.198,
        ((1, 1.165), (5, 2.251), (12, 2.621)),
        "speed-32000in-128tok-fp32-amd-repeat-passes-5 (round_draft_seconds / round_verify_seconds)",
        first=0.306,
        setting="rift-dyn@tokens_ahead=128,store_dtype=int4",
    ),
    "4k-fp32": TraceSet(
        "eval",
        f"{E1}/replay-4096in-512tok-8per-task/4x/rows.jsonl",
        "page-round@pages_ahead=2",
        0.163,
        ((1, 0.47), (12, 1.16)),
        "speed-4096in-96tok-gqa-explore (2 prompts)",
    ),
}


# Speed runs whose rounds give the cost noise of `--noise-seeds` (`cost_noise`).
NOISE_FROM = (
    "benchmarks/results/long/qwen-coder/speed-8192in-128tok-passes-2026-12-06-amd/rows.jsonl",
    "benchmarks/results/long/qwen-coder/speed-32000in-128tok-fp32-amd-passes/rows.jsonl",
)


def cost_noise(paths=NOISE_FROM, least: int = 5) -> list[float]:
    """How far one round's cost strays from its typical value: each round's verification seconds over the median of
    its row's rounds that verified as many tokens (sizes seen `least` times or more in a row; a row's first round, which
    holds warm-up, left out)."""
    ratios = []
    for path in paths:
        for line in Path(path).read_text().splitlines():
            row = json.loads(line) if line.strip() else {}
            if "round_verify_seconds" not in row:  # the target alone's rows, and rows from before rounds were timed
                continue
            by_size = defaultdict(list)
            for drafted, seconds in list(zip(row["drafted"], row["round_verify_seconds"], strict=True))[1:]:
                by_size[drafted].append(seconds)
            for seconds in (s for s in by_size.values() if len(s) >= least):
                typical = statistics.median(seconds)
                ratios += [x / typical for x in seconds]
    if not ratios:
        raise ValueError(f"No round costs to draw noise from in {list(paths)}: they need speed rows with rounds.")
    return ratios


def noise_draws(ratios: list[float], seed: int, rounds: int = 512) -> list[tuple[float, float]]:
    """Per round, factors for its verification and its drafting seconds, drawn independently and with replacement from
    `ratios`."""
    rng = random.Random(seed)
    return [(rng.choice(ratios), rng.choice(ratios)) for _ in range(rounds)]


def runs_from(accepted: list[int], gamma: int = GAMMA) -> list[int]:
    """Per output position, the drafts a round starting there would accept (capped at `gamma`)."""
    starts, position = [], 0
    for n in accepted:
        starts.append((position, n))
        position += n + 1
    runs = [0] * position
    for i in range(len(starts) - 1, -1, -1):
        start, n = starts[i]
        after = 0  # an all-accepted round's run, past its bonus token, into the next round when that one accepted
        if n >= gamma and i + 1 < len(starts) and starts[i + 1][1] > 0:
            after = 1 + runs[starts[i + 1][0]]
        for j in range(n + 1):
            runs[start + j] = min(gamma, n - j + (after if n >= gamma else 0))
    return runs


def play(
    runs: list[int],
    trace: TraceSet,
    new_tokens: int,
    choose,
    refresh: float = 0.0,
    noise: list | None = None,
) -> tuple[float, list[int]]:
    """Tokens per second of drafting along `runs` until `new_tokens` are emitted; `choose` is a DraftLength, an int
    (a constant length) or None; `refresh`: seconds a round's first forward adds to a step (the policy's refresh).
    `noise`: per round, factors on its verification and drafting seconds (`noise_draws`; cycled).
    Returns the rate and the lengths drafted."""
    controller = choose if isinstance(choose, DraftLength) else None
    position = tokens = 0
    seconds = 0.0
    lengths, idle = [], []
    while tokens < new_tokens:
        on_verify, on_draft = noise[len(lengths) % len(noise)] if noise else (1.0, 1.0)
        k = controller.choose() if controller else choose
        k = min(k, new_tokens - tokens - 1) if k else 0
        n = min(k, runs[position] if position < len(runs) else 0)
        forwards = [trace.step * on_draft] * k
        if forwards:
            forwards[0] += refresh * on_draft  # the round's first forward refreshes the selection
        verify = piecewise_linear(sorted(trace.curve), k + 1) * on_verify
        if controller is not None:
            if k and idle and hasattr(controller, "observe_idle"):
                # The round's first forward re-feeds what the target emitted alone: its drafter's predictions there,
                # as drafts from each of those positions up to the round's start (censored there)
                controller.observe_idle([(min(runs[q], position - q), position - q) for q in idle[-IDLE_SEEN:]])
            if k:
                idle = []
            else:
                idle.append(position)
            warm = list(forwards)
            if warm and not controller.warm:  # a call's first round
                warm[0] += 50 * trace.step  # the drafter's prompt forward: not in a decode-phase rate
            controller.observe(k, n, sum(warm), verify, warm)
        seconds += sum(forwards) + verify
        tokens += n + 1
        position += n + 1
        lengths.append(k)
    return tokens / seconds, lengths


def load(trace: TraceSet) -> tuple[dict[str, list[int]], float]:
    """Per prompt, the runs (`runs_from`) of `trace.policy`'s rounds; and the mean seconds of its refreshes."""
    rows = [json.loads(line) for line in Path(trace.rows).read_text().splitlines() if line.strip()]
    rows = [row for row in rows if row.get("policy") == trace.policy and row.get("setting") == trace.setting]
    events = [event["seconds"] for row in rows for event in row.get("rescoring_events", [])]
    return {row["prompt"]: runs_from(row["accepted"]) for row in rows}, statistics.mean(events) if events else 0.0


def play_calls(prompts: dict, trace: TraceSet, new_tokens: int, make, refresh: float, player, start: str) -> dict:
    """Per prompt, `player`'s (rate, lengths) for a controller drafting along its runs. `start`: "fresh" (a new
    controller per prompt) or "resumed" (the prompts as one model's successive `generate` calls, in the replay's
    order, as the speed runs make them: each call resumes the last call's controller, `DraftLength.resume`)."""
    played, controller = {}, None
    for prompt, runs in prompts.items():
        fresh = start == "fresh" or controller is None
        controller = make(max_length=GAMMA) if fresh else controller.resume()
        played[prompt] = player(runs, trace, new_tokens, controller, refresh)
    return played


def evaluate(
    new_tokens: int, make=DraftLength, sets=SETS, player=None, starts=("fresh", "resumed"), noise=None
) -> list[dict]:
    """One row per trace set, start (`play_calls`) and regime: the controller against the target alone and the
    constant lengths (`player`: how the controller drafts along a trace, `play` by default; `noise`: per-round cost
    factors, `noise_draws`, that every setting pays alike)."""
    if noise is not None and player is not None:
        raise ValueError("noise= is played by the default player only; leave player= out to use it.")
    player = player or partial(play, noise=noise)
    rows = []
    for name, trace in sets.items():
        prompts, refresh = load(trace)
        if trace.first is not None:
            refresh = trace.first - trace.step
        calls = {start: play_calls(prompts, trace, new_tokens, make, refresh, player, start) for start in starts}
        for start, regime in ((s, g) for s in starts for g in ("repeat", "continue")):
            chosen = {p: r for p, r in prompts.items() if p.startswith(regime + ":")}
            if not chosen:
                continue
            constant = {
                k: [play(r, trace, new_tokens, k, refresh, noise=noise)[0] for r in chosen.values()]
                for k in range(GAMMA + 1)
            }
            # the target alone: constant[0] (one-token rounds), which pays the rounds' noise too
            alone = constant[0] if noise else [1 / piecewise_linear(sorted(trace.curve), 1)] * len(chosen)
            best = max(constant, key=lambda k: statistics.mean(constant[k]))
            played = [calls[start][p] for p in chosen]
            rate = [r for r, _ in played]
            rows.append(
                {
                    "set": name,
                    "half": trace.half,
                    "start": start,
                    "regime": regime,
                    "prompts": len(chosen),
                    "best_constant": best,
                    "vs_target": statistics.mean(r / a for r, a in zip(rate, alone, strict=True)),
                    "lowest_vs_target": min(r / a for r, a in zip(rate, alone, strict=True)),
                    "vs_constant_11": statistics.mean(r / c for r, c in zip(rate, constant[GAMMA], strict=True)),
                    "vs_best_constant": statistics.mean(r / c for r, c in zip(rate, constant[best], strict=True)),
                    "constant_11_vs_target": statistics.mean(
                        c / a for c, a in zip(constant[GAMMA], alone, strict=True)
                    ),
                    "mean_length": statistics.mean(statistics.mean(lengths) for _, lengths in played),
                    "refresh_seconds": refresh,
                    "costs_from": trace.costs_from,
                }
            )
    return rows


def evaluate_noisy(new_tokens: int, seeds: int, make=DraftLength, sets=SETS, ratios=None) -> list[dict]:
    """`evaluate` once per seed of cost noise (`noise_draws` from `ratios`, `cost_noise()` by default), merged: the
    means over the seeds, the lowest prompt over all of them, the best constant chosen most often."""
    ratios = cost_noise() if ratios is None else ratios
    runs = [evaluate(new_tokens, make, sets, noise=noise_draws(ratios, seed)) for seed in range(seeds)]
    merged = []
    for rows in zip(*runs, strict=True):
        row = dict(rows[0], noise_seeds=seeds)
        for key in ("vs_target", "vs_constant_11", "vs_best_constant", "constant_11_vs_target", "mean_length"):
            row[key] = statistics.mean(r[key] for r in rows)
        row["lowest_vs_target"] = min(r["lowest_vs_target"] for r in rows)
        row["best_constant"] = Counter(r["best_constant"] for r in rows).most_common(1)[0][0]
        merged.append(row)
    return merged


def table(rows: list[dict]) -> str:
    headers = ["set", "half", "start", "regime", "prompts", "controller / target", "lowest / target", "controller / 11",
               "controller / best constant (k)", "11 / target", "mean length"]  # fmt: skip
    body = [
        [r["set"], r["half"], r["start"], r["regime"], r["prompts"], f"{r['vs_target']:.2f}",
         f"{r['lowest_vs_target']:.2f}", f"{r['vs_constant_11']:.2f}",
         f"{r['vs_best_constant']:.2f} ({r['best_constant']})", f"{r['constant_11_vs_target']:.2f}",
         f"{r['mean_length']:.1f}"]
        for r in rows
    ]  # fmt: skip
    return pipe_table(headers, body) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument(
        "--noise-seeds",
        type=int,
        default=0,
        help="play each set this many times with seeded per-round cost noise (`cost_noise`) and average; 0: none",
    )
    args = parser.parse_args(argv)
    if args.new_tokens < 1 or args.noise_seeds < 0:
        raise SystemExit("--new-tokens must be positive and --noise-seeds at least 0.")
    ratios = cost_noise() if args.noise_seeds else []  # read once: drawn from, then summarised
    rows = evaluate_noisy(args.new_tokens, args.noise_seeds, ratios=ratios) if ratios else evaluate(args.new_tokens)
    record = {"date": datetime.date.today().isoformat(), "new_tokens": args.new_tokens, "rows": rows}
    if ratios:
        spread = {"count": len(ratios), "median": statistics.median(ratios), "max": max(ratios)}
        spread["p95"] = statistics.quantiles(ratios, n=20)[-1]
        record |= {"noise_seeds": args.noise_seeds, "noise_from": list(NOISE_FROM), "noise_ratios": spread}
    write_record(args.out, "draft-length-traces", record, table(rows))


if __name__ == "__main__":
    main()
