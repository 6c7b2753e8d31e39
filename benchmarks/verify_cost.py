"""What a verification forward costs against a one-token step, with the target on transformers' "sdpa" and on
"sdpa_gqa" (`rift_hf.speedups.gqa_attention`), over a long prompt's recorded cache.

    python -m benchmarks.verify_cost --input-tokens 32000            # the qwen-coder target, fp32, 1-12 tokens
    python -m benchmarks.verify_cost --preset tiny-random --input-tokens 256 --repeats 1   (CI-sized)

Each measurement loads the prompt's recorded target forward (`PromptCache`, as `benchmarks.long_inputs` records it;
computed if missing) into a fresh `DynamicCache` and times one forward of n tokens over it with the mask transformers'
assisted loop passes, both backends interleaved, the median of `--repeats`; the largest logit difference between the
two backends is recorded too. Writes `<--out>/verify-cost-<preset>-<tokens>in.json` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

from lab.records import machine
from lab.tables import pipe_table
from rift_hf._compat import CACHE
from rift_hf.generation.decode import target_cache
from rift_hf.speedups import gqa_attention


def time_forward(target, prompt_cache, n: int) -> tuple[float, torch.Tensor]:
    cache = target_cache(target, prompt_cache)
    held = cache.get_seq_length()
    ids = prompt_cache.input_ids[:, held : held + 1]
    ids = torch.cat([ids, ids.new_full((1, n - 1), 100)], dim=1)  # the drafts' values do not change the cost
    mask = torch.ones(1, held + n, dtype=torch.long)
    position_ids = torch.arange(held, held + n)[None]
    with torch.no_grad():
        tick = time.perf_counter()
        out = target(input_ids=ids, attention_mask=mask, position_ids=position_ids, logits_to_keep=n, **{CACHE: cache})
        return time.perf_counter() - tick, out.logits


def main(argv=None) -> None:
    from benchmarks.long_inputs import ensure_prompt_cache
    from rift_hf.models import PRESETS, load_preset
    from rift_hf.prefill import prefill_folder, prefills_root
    from rift_hf.prompts import prompt_set

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder", choices=["tiny-random", *sorted(PRESETS)])
    parser.add_argument("--input-tokens", type=int, required=True)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 2, 5, 12])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--prefills", type=Path, default=None, help="default: $RIFT_HF_HOME/prefills")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args(argv)
    if args.repeats < 1 or any(n < 1 for n in args.tokens):
        raise SystemExit("--repeats and --tokens must be positive.")
    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    prompt = prompt_set(tokenizer, args.input_tokens, 1, tasks=("repeat",), sources="repo")[0]
    folder = prefill_folder(args.prefills or prefills_root(), args.preset, prompt, target.dtype)
    prompt_cache = ensure_prompt_cache(target, draft, prompt, folder, window=64)
    del draft
    seconds = {"sdpa": {n: [] for n in args.tokens}, "sdpa_gqa": {n: [] for n in args.tokens}}
    differences = {}
    time_forward(target, prompt_cache, 1)  # warm-up
    for _ in range(args.repeats):
        for n in args.tokens:
            logits = {}
            for backend in ("sdpa", "sdpa_gqa"):
                gqa_attention(target, enabled=backend == "sdpa_gqa")
                elapsed, logits[backend] = time_forward(target, prompt_cache, n)
                seconds[backend][n].append(elapsed)
            differences[n] = float((logits["sdpa"] - logits["sdpa_gqa"]).abs().max())
    gqa_attention(target, enabled=False)
    step = statistics.median(seconds["sdpa"][1])
    rows = [
        {
            "tokens": n,
            "sdpa_seconds": statistics.median(seconds["sdpa"][n]),
            "sdpa_gqa_seconds": statistics.median(seconds["sdpa_gqa"][n]),
            "sdpa_vs_step": statistics.median(seconds["sdpa"][n]) / step,
            "sdpa_gqa_vs_step": statistics.median(seconds["sdpa_gqa"][n]) / step,
            "max_logit_difference": differences[n],
        }
        for n in args.tokens
    ]
    record = {
        "preset": args.preset,
        "prompt": prompt.name,
        "input_tokens": prompt.tokens,
        "dtype": args.dtype,
        "repeats": args.repeats,
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"verify-cost-{args.preset}-{prompt.tokens}in.json"
    path.write_text(json.dumps(record, indent=1) + "\n")
    headers = ["tokens", "sdpa s", "sdpa_gqa s", "sdpa / one-token step", "sdpa_gqa / one-token step", "max |dlogit|"]
    body = [
        [r["tokens"], f"{r['sdpa_seconds']:.3f}", f"{r['sdpa_gqa_seconds']:.3f}", f"{r['sdpa_vs_step']:.2f}",
         f"{r['sdpa_gqa_vs_step']:.2f}", f"{r['max_logit_difference']:.1e}"]
        for r in rows
    ]  # fmt: skip
    print(f"{prompt.name}, {prompt.tokens} tokens, {args.dtype}, {machine()}\n\n{pipe_table(headers, body)}\n{path}")


if __name__ == "__main__":
    main()
