"""Losslessness on real weights in fp32: every policy's assisted output must equal the target's plain greedy output.

    python -m benchmarks.lossless_fp32 --preset qwen-coder --input-tokens 256 --new-tokens 64
    python -m benchmarks.lossless_fp32 --input-tokens 4096 --prompt-index 1 --new-tokens 256 --budget 770 \
        --policies full,snapkv,rift-dyn@delta=16 --out benchmarks/results/lossless_fp32-continue-json-decoder-4k.json

In bf16, assisted output can differ from plain greedy (and between policies) because the target verifies chunks
of different lengths and rounds differently; fp32 removes that, so a mismatch here is a real bug.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch

import rift_hf
from lab.records import machine, policy_config
from rift_hf.models import fix_draft_length, load_preset
from rift_hf.prompts import prompt_set


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--input-tokens", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=128)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--delta", type=int, default=128)
    parser.add_argument("--task", default="continue")
    parser.add_argument("--prompt-index", type=int, default=0, help="which prompt of the task (0: argparse, 1: ...)")
    parser.add_argument("--policies", default="full,rift-stat,rift-dyn")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lossless_fp32.json"))
    args = parser.parse_args(argv)
    if args.prompt_index < 0:
        raise ValueError(f"--prompt-index must be 0 or more (0 is the task's first prompt), got {args.prompt_index}.")
    target, draft, tokenizer = load_preset(args.preset, dtype=torch.float32)
    fix_draft_length(target, draft, gamma=11)
    prompt = prompt_set(tokenizer, args.input_tokens, args.prompt_index + 1, tasks=(args.task,))[args.prompt_index]
    gen = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    ids = prompt.input_ids.to(target.device)
    plain = target.generate(ids, **gen)
    result = {"preset": args.preset, "prompt": prompt.name, "tokens": prompt.tokens, "new_tokens": args.new_tokens}
    result |= {"dtype": "float32", "machine": machine(), "date": datetime.date.today().isoformat(), "runs": {}}
    for policy in args.policies.split(","):
        config = policy_config(policy, args.budget, args.window, args.delta, None)
        tick = time.perf_counter()
        out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
        result["runs"][policy] = {
            "same_as_greedy": bool(torch.equal(out, plain)),
            "al": rift_hf.last_stats(target).acceptance_length,
            "seconds": time.perf_counter() - tick,
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
