"""CPU cost of the window scores (prefill scoring and every rescoring) at the real drafter's shapes.

    python -m benchmarks.scores                # Qwen2.5-Coder-0.5B shapes, T 4K/8K/16K, 24 layers, this CPU
    python -m benchmarks.scores --dry-run      # tiny shapes (CI)

Times `kernels.reference.window_attention_scores` (query rows in cache-sized chunks) against the same scores
computed over the whole `[H_kv, G*W, T]` logits at once (`whole_tensor_scores`, the formulation it replaced), side by
side in one process, the best of `--repeats` rounds for each. Writes `benchmarks/results/scores-cpu.json`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import platform
import time
from pathlib import Path

import torch

from kernels import reference
from rift_hf.tables import pipe_table

from .kernels import QWEN_05B, TINY


def whole_tensor_scores(query, key, scale):
    """The scores from one `[B, H_kv, G*W, T]` logits tensor (matmul, causal mask, softmax in place, reductions)."""
    batch, h_q, window, _ = query.shape
    h_kv, length = key.shape[1], key.shape[2]
    group = h_q // h_kv
    q = (query.float() * scale).reshape(batch, h_kv, group * window, -1)
    logits = torch.matmul(q, key.float().transpose(-1, -2)).view(batch, h_kv, group, window, length)
    logits[..., length - window :].masked_fill_(torch.ones(window, window, dtype=torch.bool).triu(1), float("-inf"))
    probs = logits.sub_(logits.amax(dim=-1, keepdim=True)).exp_()
    probs.div_(probs.sum(dim=-1, keepdim=True))
    return probs.sum(dim=3).mean(dim=2)


def best_ms(fn, layers: int, repeats: int) -> float:
    """Best of `repeats` rounds of `layers` calls, in ms per round (one call per layer: one rescoring)."""
    fn()
    rounds = []
    for _ in range(repeats):
        tick = time.perf_counter()
        for _ in range(layers):
            fn()
        rounds.append(1e3 * (time.perf_counter() - tick))
    return min(rounds)


def markdown(result: dict) -> str:
    """The result as a header line and a pipe table (ms per rescoring: every layer once)."""
    head = (
        f"Window scores, {result['shapes']['layers']} layers, {result['threads']} threads, fp32, {result['machine']}, "
        f"{result['date']} (`python -m benchmarks.scores`), best of repeats, ms per rescoring"
    )
    cells = [
        [r["T"], f"{r['whole_tensor_ms']:.0f}", f"{r['chunked_ms']:.0f}", f"{r['speedup']:.2f}x"]
        + [f"{r['max_abs_diff']:.1e}"]
        for r in result["rows"]
    ]
    return head + "\n\n" + pipe_table(["T", "whole tensor ms", "chunked ms", "speed-up", "max abs diff"], cells) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="4096,8192,16384", help="comma-separated key lengths")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes, two lengths")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/scores-cpu.json"))
    args = parser.parse_args(argv)
    shape, lengths, window = QWEN_05B, [int(n) for n in args.lengths.split(",")], args.window
    if args.dry_run:
        shape, lengths, window, args.repeats = TINY, [64, 96], 8, 1
    scale = shape["dim"] ** -0.5
    rows = []
    for length in lengths:
        g = torch.Generator().manual_seed(length)
        query = torch.randn(1, shape["h_q"], window, shape["dim"], generator=g)
        key = torch.randn(1, shape["h_kv"], length, shape["dim"], generator=g)
        args_, layers = (query, key, scale), shape["layers"]
        chunked, whole = reference.window_attention_scores(*args_), whole_tensor_scores(*args_)
        row = {
            "T": length,
            "W": window,
            "layers": shape["layers"],
            "max_abs_diff": float((chunked - whole).abs().max()),
            "whole_tensor_ms": best_ms(functools.partial(whole_tensor_scores, *args_), layers, args.repeats),
            "chunked_ms": best_ms(functools.partial(reference.window_attention_scores, *args_), layers, args.repeats),
        }
        row["speedup"] = row["whole_tensor_ms"] / row["chunked_ms"]
        rows.append(row)
        print(row, flush=True)
    result = {
        "what": "window scores over all layers (one rescoring), fp32, best of repeats",
        "shapes": shape,
        "threads": torch.get_num_threads(),
        "machine": f"{platform.machine()}, {torch.backends.cpu.get_cpu_capability()}",
        "date": datetime.date.today().isoformat(),
        "dry_run": args.dry_run,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(markdown(result))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
