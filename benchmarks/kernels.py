"""Kernel benchmark: Triton kernels against the PyTorch path, and the rescoring share of drafter decode time.

    python -m benchmarks.kernels               # on a GPU: T 8K..128K, budgets 1K..8K, Qwen2.5-Coder-0.5B shapes
                                               # (kernels, rescoring share, drafter step full vs RIFT at 4K..128K)
    python -m benchmarks.kernels --dry-run     # tiny shapes on CPU, so the script cannot rot (CI runs this)

Writes `benchmarks/results/kernels-<device>.json`.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import re
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lab.tables import pipe_table
from rift_hf import kernels

# Qwen2.5-Coder-0.5B-Instruct (the qwen-coder drafter): 24 layers, 14 query heads, 2 KV heads, head dim 64.
QWEN_05B = {"layers": 24, "h_q": 14, "h_kv": 2, "dim": 64, "hidden": 896, "intermediate": 4864, "vocab": 151936}
QWEN_15B = {"layers": 28, "h_q": 12, "h_kv": 2, "dim": 128, "hidden": 1536, "intermediate": 8960, "vocab": 151936}
TINY = {"layers": 2, "h_q": 4, "h_kv": 2, "dim": 16, "hidden": 64, "intermediate": 96, "vocab": 96}


def _triton_ops():
    from rift_hf.kernels import triton_ops

    return triton_ops


def timeit(fn, repeats: int, device: torch.device) -> float:
    """Median seconds of `fn()` over `repeats` runs, after one warm-up."""
    fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        tick = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - tick)
    return sorted(times)[len(times) // 2]


def device_ms(fn, repeats: int) -> float:
    """Mean GPU kernel time of `fn()` in ms (torch.profiler, summed over kernels): what remains without host cost."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            fn()
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in prof.key_averages()) / repeats / 1e3


def unfused_scores(query, key, scale):
    """The PyTorch chain a scorer would otherwise run: repeat KV, matmul, causal mask, softmax, reduce."""
    group = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(group, 1)
    logits = (query @ k.transpose(-1, -2)).float() * scale
    window, length = query.shape[2], key.shape[2]
    causal = (
        torch.arange(length, device=key.device)[None, :]
        > torch.arange(length - window, length, device=key.device)[:, None]
    )
    probs = torch.softmax(logits.masked_fill(causal, float("-inf")), -1)
    return probs.sum(2).unflatten(1, (key.shape[1], group)).mean(2)


def sdpa_on_gathered_copy(query, key, value, index, scale):
    dim = key.shape[-1]
    gather = index.unsqueeze(-1).expand(-1, -1, -1, dim)
    k, v = torch.gather(key, 2, gather), torch.gather(value, 2, gather)
    length = query.shape[2]
    k_sel = index.shape[-1]
    mask = (
        torch.arange(k_sel, device=key.device)[None, :]
        <= torch.arange(k_sel - length, k_sel, device=key.device)[:, None]
    )
    return F.scaled_dot_product_attention(query, k, v, attn_mask=mask, scale=scale, enable_gqa=True)


def bench_scores(shape, lengths, window, dtype, device, repeats, use_triton):
    rows = []
    for length in tqdm(lengths, desc="window scores"):
        query = torch.randn(1, shape["h_q"], window, shape["dim"], dtype=dtype, device=device)
        key = torch.randn(1, shape["h_kv"], length, shape["dim"], dtype=dtype, device=device)
        scale = shape["dim"] ** -0.5
        row = {
            "T": length,
            "W": window,
            "torch_unfused_ms": 1e3 * timeit(functools.partial(unfused_scores, query, key, scale), repeats, device),
        }
        if use_triton:
            row["triton_ms"] = 1e3 * timeit(
                functools.partial(_triton_ops().window_attention_scores, query, key, scale), repeats, device
            )
            row["speedup"] = row["torch_unfused_ms"] / row["triton_ms"]
        rows.append(row)
    return rows


def bench_indexed(shape, lengths, budgets, queries, dtype, device, repeats, use_triton):
    rows = []
    for length in tqdm(lengths, desc="indexed attention"):
        key = torch.randn(1, shape["h_kv"], length, shape["dim"], dtype=dtype, device=device)
        value = torch.randn_like(key)
        for budget in budgets:
            if budget >= length:
                continue
            for n_q in queries:
                older = torch.stack(
                    [
                        torch.randperm(length - n_q, device=device)[: budget - n_q].sort().values
                        for _ in range(shape["h_kv"])
                    ]
                )
                own = torch.arange(length - n_q, length, device=device).expand(shape["h_kv"], -1)
                index = torch.cat([older, own], -1)[None]
                query = torch.randn(1, shape["h_q"], n_q, shape["dim"], dtype=dtype, device=device)
                scale = shape["dim"] ** -0.5
                row = {
                    "T": length,
                    "K": budget,
                    "L": n_q,
                    "sdpa_gathered_ms": 1e3
                    * timeit(
                        functools.partial(sdpa_on_gathered_copy, query, key, value, index, scale), repeats, device
                    ),
                }
                if use_triton:
                    row["triton_ms"] = 1e3 * timeit(
                        functools.partial(_triton_ops().indexed_attention, query, key, value, index, scale),
                        repeats,
                        device,
                    )
                    row["speedup"] = row["sdpa_gathered_ms"] / row["triton_ms"]
                rows.append(row)
    return rows


def qwen_shaped_model(shape, max_length, dtype, device):
    """A randomly initialised Qwen2 model with the given shape (timings do not depend on the weights)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        num_hidden_layers=shape["layers"],
        num_attention_heads=shape["h_q"],
        num_key_value_heads=shape["h_kv"],
        hidden_size=shape["hidden"],
        intermediate_size=shape["intermediate"],
        vocab_size=shape["vocab"],
        max_position_embeddings=max(32768, 2 * max_length),
        attn_implementation="rift",
    )
    return Qwen2ForCausalLM(config).to(device=device, dtype=dtype).eval()


def _prefilled(model, cache, length, window, device):
    """Prefill `length` random tokens, then decode `window` more (fills rift's decode-query window)."""
    prompt = torch.randint(0, model.config.vocab_size, (1, length), device=device)
    model(prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)  # not T x vocab logits
    token = prompt[:, -1:]
    for _ in range(window):
        model(token, past_key_values=cache, use_cache=True)
    return token


def bench_rescore_share(model, length, budget, window, deltas, device, repeats):
    """Rescoring cost (all layers: scores over the store, top-k, gather) over the drafter's decode time."""
    import rift_hf

    cache = rift_hf.RiftCache(model.config, {"policy": "rift-dyn", "budget": budget, "window": window, "delta": 10**9})
    with torch.no_grad():
        token = _prefilled(model, cache, length, window, device)
        cache.get_mask_sizes(1, 0)  # settles the first selection

        # Plain decoding: every step commits, so the working set stays at the budget while the store grows.
        step = timeit(lambda: model(token, past_key_values=cache, use_cache=True), repeats, device)
        rescore = timeit(lambda: [layer._rescore() for layer in cache.rift_layers], repeats, device)
    return {
        "T": length,
        "budget": budget,
        "window": window,
        "decode_step_ms": 1e3 * step,
        "rescore_ms": 1e3 * rescore,
        "share": {str(d): rescore / (d * step) for d in deltas},
    }


def bench_drafter_step(model, lengths, budget, window, device, repeats):
    """
    One drafter decode step (the whole model, one token) with a full cache against RIFT caches at a fixed budget,
    as the input grows: the speed side of E3 at lengths a CPU cannot reach. Random weights, so no acceptance here.
    """
    from transformers import DynamicCache

    import rift_hf

    caches = {
        "full": lambda: DynamicCache(config=model.config),
        "rift-stat": lambda: rift_hf.RiftCache(
            model.config, {"policy": "rift-stat", "budget": budget, "window": window}
        ),
        "rift-dyn": lambda: rift_hf.RiftCache(
            model.config, {"policy": "rift-dyn", "budget": budget, "window": window, "delta": 10**9}
        ),
    }
    rows = []
    for length in tqdm(lengths, desc="drafter step"):
        row = {"T": length, "budget": budget}
        for name, make in caches.items():
            cache = make()
            with torch.no_grad():
                token = _prefilled(model, cache, length, window, device)
                step = functools.partial(model, token, past_key_values=cache, use_cache=True)
                row[f"{name}_ms"] = 1e3 * timeit(step, repeats, device)
                if device.type == "cuda":  # wall time is host-bound at this size; the kernels alone tell the trend
                    row[f"{name}_gpu_ms"] = device_ms(step, repeats)
            del cache
            if device.type == "cuda":
                torch.cuda.empty_cache()
        row["speedup_stat"] = row["full_ms"] / row["rift-stat_ms"]
        row["speedup_dyn"] = row["full_ms"] / row["rift-dyn_ms"]
        rows.append(row)
    return rows


def markdown(result: dict) -> str:
    """The kernel result as markdown: where it was measured, then one table per part that was run."""
    blocks = [f"Measured on {result['device']}, {result['dtype']}, {result['date']} (`python -m benchmarks.kernels`)."]
    if result.get("window_scores"):
        rows = [
            [
                r["T"],
                r["W"],
                f"{r['torch_unfused_ms']:.3f}",
                f"{r.get('triton_ms', float('nan')):.3f}",
                f"{r.get('speedup', float('nan')):.2f}x",
            ]  # fmt: skip
            for r in result["window_scores"]
        ]
        lines = [pipe_table(["T", "window", "unfused PyTorch ms", "Triton ms", "speedup"], rows)]
        blocks.append("SnapKV window scores:\n\n" + "\n".join(lines))
    if result.get("indexed_attention"):
        rows = [
            [
                r["T"],
                r["K"],
                r["L"],
                f"{r['sdpa_gathered_ms']:.3f}",
                f"{r.get('triton_ms', float('nan')):.3f}",
                f"{r.get('speedup', float('nan')):.2f}x",
            ]  # fmt: skip
            for r in result["indexed_attention"]
        ]
        headers = ["T", "kept K", "queries", "SDPA on gathered copy ms", "Triton in place ms", "speedup"]
        lines = [pipe_table(headers, rows)]
        blocks.append("Attention over the kept rows of the store:\n\n" + "\n".join(lines))
    if result.get("rescore_share"):
        r = result["rescore_share"]
        shares = ", ".join(f"{100 * v:.2g}% at Δ = {d}" for d, v in r["share"].items())
        blocks.append(
            f"Rescoring (all layers) at T = {r['T']}, budget {r['budget']}: {r['rescore_ms']:.1f} ms against a "
            f"{r['decode_step_ms']:.1f} ms decode step: {shares}."
        )
    if result.get("drafter_step"):
        names = ("full", "rift-stat", "rift-dyn")
        gpu = "full_gpu_ms" in result["drafter_step"][0]
        headers = ["T", "budget"] + [f"{n} ms" for n in names] + ([f"{n} GPU ms" for n in names] if gpu else [])
        rows = []
        for r in result["drafter_step"]:
            cells = [str(r["T"]), str(r["budget"])] + [f"{r[f'{n}_ms']:.1f}" for n in names]
            cells += [f"{r[f'{n}_gpu_ms']:.2f}" for n in names] if gpu else []
            rows.append(cells)
        lines = [pipe_table(headers, rows)]
        blocks.append(
            "One drafter decode step (whole model, one token; wall-clock median, and GPU kernel time from "
            "torch.profiler):\n\n" + "\n".join(lines)
        )
    return "\n\n".join(blocks) + "\n"


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU, reference path only")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parts = ["window_scores", "indexed_attention", "rescore_share", "drafter_step"]
    parser.add_argument(
        "--parts", nargs="+", choices=parts, default=parts, help="measure only these (updates an existing result file)"
    )
    parser.add_argument("--table", type=Path, help="print an existing result file as markdown, measure nothing")
    parser.add_argument("--readme", type=Path, help="with --table: also write it into the README's kernels block")
    args = parser.parse_args(argv)
    if args.table:
        from lab.tables import write_into_readme

        text = markdown(json.loads(args.table.read_text()))
        print(text)
        if args.readme:
            write_into_readme(text, args.readme, "kernels")
        return
    device = torch.device("cuda" if torch.cuda.is_available() and not args.dry_run else "cpu")
    if args.dry_run:
        shape, lengths, budgets, window, repeats, dtype = TINY, [64, 96], [16, 32], 8, 2, torch.float32
        share_length, share_budget = 96, 32
        step_lengths = [64, 128]
    else:
        shape, lengths, budgets, window, repeats, dtype = (
            QWEN_05B,
            [8192, 16384, 32768, 65536, 131072],
            [1024, 2048, 4096, 8192],
            64,
            10,
            torch.bfloat16,
        )
        share_length, share_budget = 32768, 4096
        step_lengths = [4096, 16384, 32768, 65536, 131072]
    # On CPU the kernels run only under the Triton interpreter: the dry run then exercises them too.
    interpreted = os.environ.get("TRITON_INTERPRET") == "1" and args.dry_run
    use_triton = kernels._HAS_TRITON and (device.type == "cuda" or interpreted)
    deltas = [16, 32, 64, 128, 256, 512, 1024]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    tag = "dry-run" if args.dry_run else re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()
    path = args.out / f"kernels-{tag}.json"
    result = json.loads(path.read_text()) if path.exists() and set(args.parts) != set(parts) else {}
    result |= {
        "device": name,
        "dtype": str(dtype).split(".")[-1],
        "date": datetime.date.today().isoformat(),
        "dry_run": args.dry_run,
        "shapes": shape,
        "triton": use_triton,
    }

    def save(key, value):  # written after every part, so a run cut short keeps what it measured
        result[key] = value
        path.write_text(json.dumps(result, indent=2) + "\n")
        path.with_suffix(".md").write_text(markdown(result))

    if "window_scores" in args.parts:
        save("window_scores", bench_scores(shape, lengths, window, dtype, device, repeats, use_triton))
    if "indexed_attention" in args.parts:
        save("indexed_attention", bench_indexed(shape, lengths, budgets, [1, 12], dtype, device, repeats, use_triton))
    if {"rescore_share", "drafter_step"} & set(args.parts):
        model = qwen_shaped_model(shape, max(step_lengths), dtype, device)
    if "rescore_share" in args.parts:
        save("rescore_share", bench_rescore_share(model, share_length, share_budget, window, deltas, device, repeats))
    if "drafter_step" in args.parts:
        steps = []
        for length in step_lengths:  # saved per length: the longest inputs take the longest
            steps += bench_drafter_step(model, [length], share_budget, window, device, repeats)
            save("drafter_step", steps)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
