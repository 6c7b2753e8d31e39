"""What a round without drafting costs against the target decoding alone: the floor of the cost-aware draft length.

When no draft length beats the target alone, `DraftLength` drafts nothing (k = 0) and the target decodes through
transformers' assisted loop, one token a round, with rift's candidate generator around it. Issue #40's "never below the
target alone" then rests on those rounds costing what a plain step costs. This times, on the same recorded prompt
forwards (decode phase only, `generate_from`), the target alone against the assisted loop with the controller held at
k = 0 for every round, interleaved, the median of `--repeats`.

    python -m benchmarks.idle_rounds --input-tokens 4096                  # qwen-coder, fp32, 48 new tokens
    python -m benchmarks.idle_rounds --preset tiny-random --input-tokens 100 --new-tokens 6 --repeats 1  (CI-sized)

Writes `<--out>/idle-rounds-<preset>-<tokens>in.json` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from pathlib import Path
from unittest import mock

import torch

from lab.records import machine
from lab.tables import pipe_table
from rift_hf.generation.draft_length import DraftLength


def _never_draft(controller: DraftLength) -> int:
    return controller._pick(0, "held at 0")


def main(argv=None) -> None:
    from benchmarks.long_inputs import ensure_prompt_cache
    from rift_hf import last_stats
    from rift_hf.generation.decode import generate_from
    from rift_hf.models import PRESETS, fix_draft_length, load_preset
    from rift_hf.prefill import prefill_folder, prefills_root
    from rift_hf.prompts import prompt_set
    from rift_hf.speedups import gqa_attention

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder", choices=["tiny-random", *sorted(PRESETS)])
    parser.add_argument("--input-tokens", type=int, required=True)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--per-task", type=int, default=1, help="prompts per task (repeat, continue)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prefills", type=Path, default=None, help="default: $RIFT_HF_HOME/prefills")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if min(args.repeats, args.new_tokens, args.per_task) < 1:
        raise SystemExit("--repeats, --new-tokens and --per-task must be positive.")
    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    gqa_attention(target)
    gqa_attention(draft)
    fix_draft_length(target, draft, gamma=11)
    gen = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
    rows = []
    for prompt in prompt_set(tokenizer, args.input_tokens, args.per_task, tasks=("repeat", "continue"), sources="repo"):
        folder = prefill_folder(args.prefills or prefills_root(), args.preset, prompt, target.dtype)
        prompt_cache = ensure_prompt_cache(target, draft, prompt, folder, window=64)
        alone, idle, same = [], [], True
        for _ in range(args.repeats):
            out, seconds = generate_from(target, prompt_cache, **gen)
            alone.append(seconds)
            with mock.patch.object(DraftLength, "choose", _never_draft):
                held, seconds = generate_from(
                    target, prompt_cache, assistant_model=draft, cache_implementation="rift", **gen
                )
            idle.append(seconds)
            same = same and torch.equal(out, held)
            drafted = sum(r["drafted"] for r in last_stats(target).rounds)
            if drafted:
                raise RuntimeError(f"the controller drafted {drafted} tokens while held at 0")
        rows.append(
            {
                "prompt": prompt.name,
                "input_tokens": prompt.tokens,
                "target_seconds": statistics.median(alone),
                "idle_loop_seconds": statistics.median(idle),
                "ratio": statistics.median(idle) / statistics.median(alone),
                "all_seconds": {"target": alone, "idle_loop": idle},
                "same_output": same,
            }
        )
    record = {
        "preset": args.preset,
        "new_tokens": args.new_tokens,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "attention": "sdpa_gqa",
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"idle-rounds-{args.preset}-{args.input_tokens}in.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    headers = ["prompt", "tokens", "target alone s", "assisted loop at k = 0 s", "ratio", "same output"]
    body = [
        [r["prompt"], r["input_tokens"], f"{r['target_seconds']:.2f}", f"{r['idle_loop_seconds']:.2f}",
         f"{r['ratio']:.3f}", r["same_output"]]
        for r in rows
    ]  # fmt: skip
    print(f"{args.new_tokens} new tokens, {args.dtype}, {machine()}\n\n{pipe_table(headers, body)}\n{path}")


if __name__ == "__main__":
    main()
