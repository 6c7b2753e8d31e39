"""Small-batch linear layers on a CPU: torch's `F.linear` against the weight-major form (`rift_hf.weight_major_linear`).

    python -m benchmarks.linear              # the real qwen-coder drafter and target, fp32, 1-16 rows
    python -m benchmarks.linear --dry-run    # tiny random models, so the script cannot rot (CI runs this)

Three parts (`--parts`), both ways interleaved in one process (alternations, median of each):
- `layer`: one linear layer of each distinct shape of the model (`[out, in]`), `rows` input rows, over a stack of
  distinct weight copies larger than the last-level cache (so every product reads its weights from memory, as a
  decode step does);
- `model`: a whole forward of the model after a 1K-token prefill (`DynamicCache`, cropped back after each): 1 token
  (a decode step), 2 tokens (the drafter's first forward of a round after a fully accepted one) and gamma + 1 = 12
  tokens with every position's logits (a verification forward), with the largest logit difference between the two;
- `generate`: greedy generation end to end on one prompt per task, the target alone and assisted (full drafter cache,
  page-round 4x), with whether each output equals the target's own.

Writes `<--out>/linear-cpu.json` (`benchmarks/results/` by default) and a markdown table beside it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from lab.records import cpu_name
from lab.tables import pipe_table
from rift_hf.speedups import weight_major_linear


def _weight_major(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.mm(weight, x.t()).t()


def time_layers(model, rows: list[int], repeats: int, stack_bytes: int) -> list[dict]:
    """ms per product for each distinct linear shape of `model` and row count, both ways."""
    shapes = sorted({tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)})
    records = []
    for out_features, in_features in tqdm(shapes, desc="layer shapes"):
        size = out_features * in_features * 4
        copies = max(2, min(64, stack_bytes // size))
        weights = [torch.randn(out_features, in_features) for _ in range(copies)]
        for n in rows:
            x = torch.randn(n, in_features)
            times = {"torch": [], "weight-major": []}
            for _ in range(repeats):
                for way, fn in (("torch", F.linear), ("weight-major", _weight_major)):
                    tick = time.perf_counter()
                    for w in weights:
                        fn(x, w)
                    times[way].append((time.perf_counter() - tick) / copies)
            torch_ms, major_ms = (1e3 * statistics.median(times[w]) for w in ("torch", "weight-major"))
            records.append(
                {
                    "part": "layer",
                    "shape": [out_features, in_features],
                    "rows": n,
                    "torch_ms": torch_ms,
                    "weight_major_ms": major_ms,
                    "speedup": torch_ms / major_ms,
                }
            )
    return records


def time_model(name: str, model, context: int, tokens: list[int], repeats: int) -> list[dict]:
    """ms per forward of `tokens` new tokens after a `context`-token prefill, both ways, and the logit difference."""
    from transformers import DynamicCache

    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(context)
    prompt = torch.randint(0, vocab, (1, context), generator=generator)
    cache = DynamicCache(config=model.config)
    records = []
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, use_cache=True)
        for n in tokens:
            ids = torch.randint(0, vocab, (1, n), generator=generator)
            keep = 0 if n > 2 else 1  # a verification forward needs every position's logits, a drafting one the last
            times, logits = {"torch": [], "weight-major": []}, {}
            for _ in range(repeats):
                for way in ("torch", "weight-major"):
                    weight_major_linear(model, enabled=way == "weight-major")
                    tick = time.perf_counter()
                    out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=keep).logits
                    times[way].append(time.perf_counter() - tick)
                    logits[way] = out
                    cache.crop(context - cache.get_seq_length())
            weight_major_linear(model, enabled=False)
            torch_ms, major_ms = (1e3 * statistics.median(times[w]) for w in ("torch", "weight-major"))
            records.append(
                {
                    "part": "model",
                    "model": name,
                    "context": context,
                    "tokens": n,
                    "torch_ms": torch_ms,
                    "weight_major_ms": major_ms,
                    "speedup": torch_ms / major_ms,
                    "max_logit_diff": float((logits["torch"] - logits["weight-major"]).abs().max()),
                    "same_argmax": bool((logits["torch"].argmax(-1) == logits["weight-major"].argmax(-1)).all()),
                }
            )
    return records


def time_generate(target, draft, prompts, new_tokens: int, gamma: int, repeats: int) -> list[dict]:
    """
    Greedy generation end to end, both ways alternating on each prompt: the target alone, and assisted by the drafter
    with a full cache and with page-round at 4x (`cache_implementation="rift"`); seconds per run (and their medians),
    and whether the output equals the target's own (torch path) greedy output.
    """
    import rift_hf  # noqa: F401  (registers cache_implementation="rift")
    from rift_hf.models import fix_draft_length

    fix_draft_length(target, draft, gamma=gamma)
    gen = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False}
    setups = {
        "target alone": {},
        "assisted, full drafter cache": {"assistant_model": draft, "cache_implementation": "rift",
                                         "cache_config": {"policy": "full"}},
        "assisted, page-round 4x": {"assistant_model": draft, "cache_implementation": "rift",
                                    "cache_config": {"policy": "page-round", "budget": 0.25}},
    }  # fmt: skip
    records = []
    for prompt in tqdm(prompts, desc="generate"):
        reference = None
        times = {(name, way): [] for name in setups for way in ("torch", "weight-major")}
        same = dict.fromkeys(times, True)
        for _ in range(repeats):
            for name, kwargs in setups.items():
                for way in ("torch", "weight-major"):
                    for model in (target, draft):
                        weight_major_linear(model, enabled=way == "weight-major")
                    tick = time.perf_counter()
                    with torch.no_grad():
                        out = target.generate(prompt.input_ids, **gen, **kwargs)
                    times[name, way].append(time.perf_counter() - tick)
                    if reference is None:
                        reference = out
                    same[name, way] &= bool(torch.equal(out, reference))
        for model in (target, draft):
            weight_major_linear(model, enabled=False)
        for name in setups:
            torch_s, major_s = (statistics.median(times[name, w]) for w in ("torch", "weight-major"))
            records.append(
                {
                    "part": "generate",
                    "prompt": prompt.name,
                    "input_tokens": int(prompt.input_ids.shape[1]),
                    "new_tokens": new_tokens,
                    "setup": name,
                    "torch_s": torch_s,
                    "weight_major_s": major_s,
                    "speedup": torch_s / major_s,
                    "torch_runs_s": times[name, "torch"],
                    "weight_major_runs_s": times[name, "weight-major"],
                    "same_as_target": same[name, "torch"] and same[name, "weight-major"],
                }
            )
    return records


def markdown(result: dict) -> str:
    head = (
        f"{result['machine']}, {result['threads']} threads, {result['dtype']}, torch {result['torch']}, "
        f"{result['date']}, {result['weights']}"
    )
    model_rows = [
        [
            r["model"],
            r["tokens"],
            f"{r['torch_ms']:.1f}",
            f"{r['weight_major_ms']:.1f}",
            f"{r['speedup']:.2f}x",
            f"{r['max_logit_diff']:.1e}",
            "yes" if r["same_argmax"] else "no",
        ]
        for r in result["records"]
        if r["part"] == "model"
    ]
    layer_rows = [
        [
            f"{r['shape'][0]}x{r['shape'][1]}",
            r["rows"],
            f"{r['torch_ms']:.3f}",
            f"{r['weight_major_ms']:.3f}",
            f"{r['speedup']:.2f}x",
        ]
        for r in result["records"]
        if r["part"] == "layer"
    ]
    model_table = pipe_table(
        ["model", "new tokens", "F.linear ms", "weight-major ms", "speed-up", "max logit diff", "same argmax"],
        model_rows,
    )
    layer_table = pipe_table(["weight", "rows", "F.linear ms", "weight-major ms", "speed-up"], layer_rows)
    forwards = f"Whole forwards after a {result['context']}-token prefill:"
    text = f"{head}\n\n{forwards}\n\n{model_table}\n\nOne layer:\n\n{layer_table}\n"
    generate = [r for r in result["records"] if r["part"] == "generate"]
    if generate:
        rows = [
            [r["prompt"], r["input_tokens"], r["setup"], f"{r['torch_s']:.1f}", f"{r['weight_major_s']:.1f}",
             f"{r['speedup']:.2f}x", "yes" if r["same_as_target"] else "no"]
            for r in generate
        ]  # fmt: skip
        table = pipe_table(["prompt", "input", "run", "torch s", "weight-major s", "speed-up", "same output"], rows)
        runs = f"Greedy generation end to end ({generate[0]['new_tokens']} new tokens, gamma {result['gamma']}, " + (
            f"median of {result['repeats_generate']} alternations):"
        )
        text += f"\n{runs}\n\n{table}\n"
    return text


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    ints = lambda text: [int(x) for x in text.split(",") if x]  # noqa: E731
    parser.add_argument("--rows", type=ints, default=[1, 2, 3, 4, 8, 12, 16], help="input rows, layer part")
    parser.add_argument("--tokens", type=ints, default=[1, 2, 12], help="new tokens per forward, model part")
    parser.add_argument("--context", type=int, default=1024, help="prefill before the model part's forwards")
    parser.add_argument("--repeats", type=int, default=5, help="alternations of the two ways")
    parser.add_argument("--stack-mib", type=int, default=256, help="weight copies per layer shape (MiB)")
    parser.add_argument("--parts", default="layer,model,generate", help="which parts to run")
    parser.add_argument("--new-tokens", type=int, default=32, help="new tokens per generation, generate part")
    parser.add_argument("--input-tokens", type=int, default=1024, help="prompt tokens, generate part")
    parser.add_argument("--gamma", type=int, default=11, help="draft length, generate part")
    parser.add_argument("--tasks", default="repeat,continue", help="prompt tasks, generate part (one prompt each)")
    parser.add_argument("--repeats-generate", type=int, default=3, help="alternations per setup, generate part")
    parser.add_argument("--dry-run", action="store_true", help="tiny random models, tiny sizes (CI)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"), help="output folder")
    args = parser.parse_args(argv)
    if args.dry_run:
        from rift_hf.models import tiny_random_pair

        target, draft, tokenizer = tiny_random_pair(torch.float32)
        weights = "tiny random"
        args.rows, args.tokens, args.context, args.repeats, args.stack_mib = [1, 2], [1, 2, 12], 16, 2, 1
        args.new_tokens, args.input_tokens, args.gamma, args.repeats_generate = 6, 64, 3, 1
    else:
        from rift_hf.models import load_preset

        target, draft, tokenizer = load_preset("qwen-coder", dtype="float32")
        weights = "qwen2.5-coder-0.5b-instruct / 1.5b-instruct"
    models = {"drafter": draft, "target": target}
    parts = set(args.parts.split(","))
    records = time_layers(draft, args.rows, args.repeats, args.stack_mib << 20) if "layer" in parts else []
    if "model" in parts:
        for name, model in models.items():
            records += time_model(name, model, args.context, args.tokens, args.repeats)
    if "generate" in parts:
        from rift_hf.prompts import prompt_set

        tasks = tuple(t for t in args.tasks.split(",") if t)
        prompts = prompt_set(tokenizer, args.input_tokens, 1, tasks=tasks, sources="code")
        records += time_generate(target, draft, prompts, args.new_tokens, args.gamma, args.repeats_generate)
    result = {
        "device": "cpu",
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, {cpu_name()}",
        "date": datetime.date.today().isoformat(),
        "weights": weights,
        "context": args.context,
        "repeats": args.repeats,
        "repeats_generate": args.repeats_generate,
        "gamma": args.gamma,
        "command": "python -m benchmarks.linear " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "records": records,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    stem = "linear-dry-run" if args.dry_run else "linear-cpu"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / f"{stem}.md").write_text(markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
