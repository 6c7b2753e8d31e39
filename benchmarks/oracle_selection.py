"""
Selection ceiling (#18, #45): how much acceptance could any scorer buy rift-stat, rift-dyn or page-round at the same
budget?

Replays a policy whose selections are scored with the queries still to come instead of the last `w` ones: the
full-cache drafter's queries over the target's own output (the whole answer at rift-stat's prefill selection, the
next Δ tokens at each rift-dyn selection, the round's own gamma + 1 positions at each page-round refresh, which then
scores pages with all of them as `score_queries` does), with no causal mask since every scored key precedes them.
Budget, sinks, recent window, pooling and refresh schedule are the policy's own; only what the scorer reads
changes. A selection head is fitted to exactly that future attention, so a head can at best reach what this oracle
reaches: if the oracle does not lift retention by the +0.05 the issue asks, no head can. For page-round the question
is #45's: does generation lose AL because the newest query points at the wrong pages, or because the budget holds
too few?

    python -m benchmarks.oracle_selection --tasks repeat --out benchmarks/results/training/oracle-selection
    python -m benchmarks.oracle_selection --policies page-round --sources broad-tune --tasks python/generate,... \
        --new-tokens 256 --per-task 4 --before <the tune half's replay folder> --out ...

Resumable (`<out>/rows.jsonl`, one row per prompt and policy); `<out>/summary.json` compares each oracle with the same
policy's rows (and the full cache's) in the E1 replay folder given by `--before`.
"""

import argparse
import contextlib
import datetime
import json
import time
from pathlib import Path

import torch

import rift_hf.policies.base as policy_base
from lab.records import machine, policy_config, summarise
from lab.replay_runs import replay_models
from lab.tables import write_into_readme
from rift_hf.attention import use_rift_attention
from rift_hf.cache import RiftCache
from rift_hf.config import RiftConfig
from rift_hf.kernels import pool_scores, reference
from rift_hf.models import fix_draft_length
from rift_hf.policies import carry_forward
from rift_hf.prompts import prompt_set
from rift_hf.replay import cached_target_output, capture_prefill, replay
from rift_hf.training.selection import captured_attention

E1 = Path("benchmarks/results/E1/qwen-coder/replay-4096in-512tok-8per-task")
# The queries an oracle selection is scored with, from the selection on: the whole answer (rift-stat's one
# selection), the next Δ (rift-dyn's refresh period), the round's drafted positions (page-round refreshes per round).
SPANS = {
    "rift-stat": lambda args: args.new_tokens,
    "rift-dyn": lambda args: args.delta,
    "page-round": lambda args: args.gamma + 1,
}


def unmasked_scores(query, key, scale, pool="avg", kernel=5, sinks=None):
    """SnapKV scores `[B, H_kv, T]` from queries that all come after `key` (no causal mask; sinks in the softmax)."""
    return pool_scores(reference.window_attention_scores(query, key, scale, sinks, causal=False), kernel, pool)


@contextlib.contextmanager
def oracle_scoring(future: dict[int, torch.Tensor], span: int, lead: int = 0):
    """Within the block every `RiftCache` scores a selection made at length `t` with `future[layer][:, :, t + lead :
    t + lead + span]` (`lead = 0`: the queries of the next `span` positions, scored without a causal mask); where none
    are left, with its own queries. `lead = -window, span = window` gives back the policy's own scoring (a check)."""
    own_query, own_scores = RiftCache.scoring_query, policy_base.snapkv_scores
    ahead = {"future": False}

    def scoring_query(cache, layer_idx, query):
        t = cache.layers[layer_idx].seen
        queries = future[layer_idx][:, :, max(0, t + lead) : t + lead + span]
        ahead["future"] = lead >= 0 and queries.shape[2] > 0
        return queries.to(query.device, query.dtype) if queries.shape[2] else own_query(cache, layer_idx, query)

    def snapkv_scores(query, key, scale, pool="avg", kernel=5, sinks=None):
        score = unmasked_scores if ahead["future"] else own_scores
        return score(query, key, scale, pool, kernel, sinks)

    RiftCache.scoring_query, policy_base.snapkv_scores = scoring_query, snapkv_scores
    try:
        yield
    finally:
        RiftCache.scoring_query, policy_base.snapkv_scores = own_query, own_scores


@contextlib.contextmanager
def shifted_scoring(shift: int):
    """Within the block the policies' own scores are carried `shift` positions forward (each position gets the
    highest score among itself and the `shift` before it): a fixed guess that what was read recently is followed by
    what comes right after it in the prompt, as when text is copied. Not an oracle: it uses the policy's own queries.
    The same as `RiftConfig(tokens_ahead=shift)` (tested), kept because the committed `shift` rows ran through it."""
    own_scores = policy_base.snapkv_scores

    def snapkv_scores(query, key, scale, pool="avg", kernel=5, sinks=None):
        return carry_forward(own_scores(query, key, scale, pool, kernel, sinks), shift)

    policy_base.snapkv_scores = snapkv_scores
    try:
        yield
    finally:
        policy_base.snapkv_scores = own_scores


@torch.no_grad()
def future_queries(draft, record) -> dict[int, torch.Tensor]:
    """Every compressed layer's post-RoPE queries `[1, H_q, P + N, D]` over prompt and answer (full cache)."""
    with captured_attention() as captured:
        draft(record.sequence.to(draft.device))
    return {layer: query for layer, (query, _, _) in captured.items()}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--policies", default="rift-stat,rift-dyn")
    parser.add_argument("--tasks", default="repeat,continue")
    parser.add_argument("--sources", default="code", help="a source set of rift_hf.prompts (broad-tune: the tune half)")
    parser.add_argument("--compression", type=float, default=4.0)
    parser.add_argument("--input-tokens", type=int, default=4096)
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--per-task", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=11)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--delta", type=int, default=128)
    parser.add_argument("--before", type=Path, default=E1, help="replay folder with the same prompts (full + policies)")
    parser.add_argument("--targets", type=Path, default=Path("benchmarks/results/targets"))
    parser.add_argument("--out", type=Path)
    parser.add_argument("--table", type=Path, nargs="+", help="render these summary.json files as one markdown table")
    parser.add_argument("--docs", type=Path, help="with --table: write it into this file's selection-ceiling block")
    parser.add_argument("--shift", type=int, help="no oracle: the policy's own scores carried this many positions on")
    parser.add_argument("--summary-only", action="store_true", help="write summary.json from the rows already there")
    args = parser.parse_args(argv)
    from tqdm.auto import tqdm

    if args.table:
        table = render_table([json.loads(path.read_text()) for path in args.table])
        if args.docs is not None:
            write_into_readme(table, args.docs, "selection-ceiling")
        print(table, end="")
        return
    if args.out is None:
        parser.error("--out is required (the folder of rows.jsonl and summary.json)")
    policies, tasks = args.policies.split(","), tuple(args.tasks.split(","))
    if args.summary_only:
        write_summary(args, policies, tasks)
        return
    if args.shift is not None and "page-round" in policies:
        raise ValueError("--shift carries token scores forward; page-round scores pages (use `pages_ahead`), drop it.")
    for policy in policies:
        if policy not in SPANS:
            raise ValueError(
                f"The oracle is defined for rift-stat (whole answer), rift-dyn (next Δ) and page-round (the round's "
                f"gamma + 1 positions); got {policy!r}."
            )
    _, draft, tokenizer = replay_models(args.preset)
    fix_draft_length(draft, gamma=args.gamma)
    spans = {p: SPANS[p](args) for p in policies}
    # page-round scores with its newest `score_queries` queries: under the oracle, all of the round's; it chooses once
    # a round (rechoose_after=0, as the ceiling is defined and as page-round ran before 2026-12-05), since a choice
    # inside the round would read queries past the round's end.
    extra = {p: {"score_queries": spans[p], "rechoose_after": 0} if p == "page-round" else None for p in policies}
    configs = {
        p: RiftConfig.coerce(policy_config(p, 1 / args.compression, args.window, args.delta, extra[p]))
        for p in policies
    }
    use_rift_attention(draft, next(iter(configs.values())))
    prompts = prompt_set(tokenizer, args.input_tokens, args.per_task, tasks=tasks, sources=args.sources)
    rows_path = args.out / "rows.jsonl"
    args.out.mkdir(parents=True, exist_ok=True)
    done = (
        {(r["prompt"], r["policy"]) for r in map(json.loads, rows_path.read_text().splitlines())}
        if rows_path.exists()
        else set()
    )
    kind = "oracle" if args.shift is None else f"shift{args.shift}"
    todo = [(p, q) for p in prompts for q in policies if (p.name, f"{q}-{kind}") not in done]
    future, future_of, prefill = None, None, None
    for prompt, policy in tqdm(todo, desc="oracle replay"):
        record = cached_target_output(
            args.targets, args.preset, prompt.name, prompt.input_ids, args.new_tokens, "bfloat16"
        )
        if record is None:
            raise ValueError(
                f"No cached target output for {prompt.name}: run `python -m lab replay` on these prompts first."
            )
        if future_of != prompt.name:
            tick = time.perf_counter()
            future = future_queries(draft, record) if args.shift is None else None
            prefill, future_of = capture_prefill(draft, record, args.window), prompt.name
            forward_seconds = time.perf_counter() - tick
        span = spans[policy]
        tick = time.perf_counter()
        with oracle_scoring(future, span) if args.shift is None else shifted_scoring(args.shift):
            stats = replay(draft, record, configs[policy], prefill=prefill)
        row = {
            "prompt": prompt.name,
            "task": prompt.task,
            "policy": f"{policy}-{kind}",
            "oracle_span": span if args.shift is None else None,
            "shift": args.shift,
            "al": stats.acceptance_length,
            "rounds": len(stats.rounds),
            "accepted": [r["accepted"] for r in stats.rounds],
            "rescorings": len(stats.rescorings),
            "replay_seconds": time.perf_counter() - tick,
            "forward_seconds": forward_seconds,
            "machine": machine(),
        }
        with rows_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
    write_summary(args, policies, tasks)


def write_summary(args, policies, tasks) -> dict:
    """Per regime and variant (`<policy>-oracle`, `<policy>-shift<S>`), on the prompts the variant ran: the full cache,
    the policy as it is (from `--before`) and the variant, each with retention and its per-prompt values."""
    rows = [json.loads(line) for line in (args.out / "rows.jsonl").read_text().splitlines()]
    before = [
        json.loads(line) for line in (args.before / f"{args.compression:g}x" / "rows.jsonl").read_text().splitlines()
    ]
    by_task = {}
    for task in tasks:
        by_task[task] = []
        for variant in sorted({r["policy"] for r in rows if r["task"] == task}):
            base = variant.rsplit("-", 1)[0]
            ran = [r for r in rows if r["policy"] == variant and r["task"] == task]
            names = {r["prompt"] for r in ran}
            runs = [r for r in before if r["prompt"] in names and r["policy"] in ("full", base)] + ran
            labels = ["full", base, variant]
            by_task[task].append(
                {
                    "variant": variant,
                    "prompts": sorted(names),
                    "summary": summarise(runs, labels),
                    "per_prompt": {
                        label: {r["prompt"]: r["retention"] for r in runs if r["policy"] == label} for label in labels
                    },
                }
            )
    summary = {
        "experiment": "oracle-selection",
        "preset": args.preset,
        "sources": args.sources,
        "compression": args.compression,
        "input_tokens": args.input_tokens,
        "new_tokens": args.new_tokens,
        "gamma": args.gamma,
        "window": args.window,
        "delta": args.delta,
        "before": str(args.before),
        "dtype": "drafter float32, target bfloat16",
        "machine": "; ".join(sorted({r.get("machine", "unrecorded") for r in rows})),  # where the rows ran
        "date": datetime.date.today().isoformat(),
        "tasks": by_task,
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    for task, blocks in by_task.items():
        for block in blocks:
            print(task, len(block["prompts"]), {s["policy"]: round(s["retention"], 3) for s in block["summary"]})
    return summary


def render_table(summaries: list[dict]) -> str:
    """One markdown row per compression, regime and variant: prompts, full-cache AL, the policy's retention as it is
    and with the variant (mean over prompts, with the per-prompt range)."""

    def cell(block: dict, label: str) -> str:
        values = list(block["per_prompt"][label].values())
        mean = sum(values) / len(values)
        return f"{mean:.3f} ({min(values):.2f}-{max(values):.2f})"

    lines = [
        "| compression | regime | policy | scored with | prompts | full-cache AL | retention as it is | retention so |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for summary in summaries:
        for task, blocks in summary["tasks"].items():
            for block in blocks:
                variant = block["variant"]
                base, kind = variant.rsplit("-", 1)
                how = "the queries to come (oracle)" if kind == "oracle" else f"own queries, `tokens_ahead={kind[5:]}`"
                full = next(s["al"] for s in block["summary"] if s["policy"] == "full")
                lines.append(
                    f"| {summary['compression']:g}x | {task} | {base} | {how} | {len(block['prompts'])} | {full:.2f} | "
                    f"{cell(block, base)} | {cell(block, variant)} |"
                )
    first = summaries[0]
    lines.append(
        f"\n{first['preset']}, ~{first['input_tokens']} prompt tokens, {first['new_tokens']} new tokens, "
        f"gamma={first['gamma']}, window {first['window']}, Δ = {first['delta']}, {first['dtype']}, by replay; "
        f"{first['machine']}, {first['date']}; `python -m benchmarks.oracle_selection` (`summary.json` by the rows)."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
