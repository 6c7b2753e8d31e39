"""The drafter's prompt pass: seconds and KV peak of the whole pass, the chunked pass, and the floor beneath both.

    python -m benchmarks.drafter_prompt_pass --input-tokens 4096,16384,32000 --passes 2

Per input length (one `repo` prompt of that length), the drafter reads the prompt (all but its last token, as the
assisted loop leaves it) into a `RiftCache` of the policy `auto` picks for that length, in one of these passes:

- `full`: one forward over the prompt (`prompt_chunk=0`, the default before 2026-12-07);
- `chunked@...`: `prompt_chunk` / `prompt_budget` as labelled (`rift_hf.cache.reading`);
- `floor`: the same weights over every token in chunks of 1,024 with attention reduced to nothing (an attention
  function that returns zeros): the cost no pass that runs the drafter's weights over every token can go below.

`peak_kv_bytes` is the drafter's KV (working sets and store: the used rows of the cache's tensors) at its largest, read
off the cache just before each commit (`RiftCache.peak_bytes`), the final choice of the working set included;
`full_kv_bytes` what a plain `DynamicCache` holds after the prompt. Passes interleave (A B C, then C B A) and each row
is one pass; the table gives the mean and range over passes. Record: `benchmarks/results/drafter-prompt-pass.json`.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lab.cli import split_labels
from lab.cli.arguments import sources
from lab.records import machine, write_record
from lab.tables import pipe_table
from rift_hf import RiftCache, RiftConfig
from rift_hf.attention import use_rift_attention
from rift_hf.cache.reading import read_prompt
from rift_hf.models import load_preset
from rift_hf.policies import label_fields
from rift_hf.prompts import prompt_set

OUT = Path("benchmarks/results")
PASSES = ("full", "chunked@prompt_chunk=1024", "chunked@prompt_chunk=1024,prompt_budget=2048", "floor")
FLOOR = "rift-floor"


def _no_attention(module, query, key, value, attention_mask, **_):
    """An attention function that attends nothing: zeros in the output's shape `[B, L, H_q, D]`."""
    return query.new_zeros(query.shape[0], query.shape[2], query.shape[1], query.shape[3]), None


def _floor_seconds(draft, ids: torch.Tensor, chunk: int = 1024) -> float:
    """The drafter's weights over `ids` in chunks, no cache, attention reduced to nothing."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FLOOR, _no_attention)
    AttentionMaskInterface.register(FLOOR, sdpa_mask)
    before = draft.config._attn_implementation
    draft.set_attn_implementation(FLOOR)
    try:
        tick = time.perf_counter()
        with torch.no_grad():
            for start in range(0, ids.shape[1], chunk):
                stop = min(start + chunk, ids.shape[1])
                positions = torch.arange(start, stop)[None]
                draft(input_ids=ids[:, start:stop], position_ids=positions, use_cache=False, logits_to_keep=1)
        return time.perf_counter() - tick
    finally:
        draft.set_attn_implementation(before)


def _read(draft, ids: torch.Tensor, fields: dict) -> tuple[float, int, RiftCache]:
    """Seconds and KV peak of the drafter reading `ids[:, :-1]` into a cache of `auto` with `fields`."""
    config = RiftConfig(**fields)
    use_rift_attention(draft, config.fitted(ids.shape[1]))
    cache = RiftCache(draft.config, config)
    cache.activate_past_recording()
    tick = time.perf_counter()
    with torch.no_grad():
        if not read_prompt(draft, cache, ids, ids.shape[1] - 1):
            draft(input_ids=ids[:, :-1], past_key_values=cache, use_cache=True, logits_to_keep=1)
            cache.settle()  # the first commit: the working set chosen from the whole pass
    seconds = time.perf_counter() - tick
    return seconds, cache.peak_bytes, cache


def full_kv_bytes(draft, tokens: int) -> int:
    """Bytes a plain cache holds for `tokens` tokens in every full-attention layer of `draft`."""
    text = draft.config.get_text_config(decoder=True)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    element = torch.empty(0, dtype=draft.dtype).element_size()
    return 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * tokens * element


def run(args) -> dict:
    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    del target
    gc.collect()
    rows = []
    for length in args.input_tokens:
        prompt = prompt_set(tokenizer, length, 1, tasks=("repeat",), sources=args.sources)[0]
        ids = prompt.input_ids
        order = [(i, args.passes_run if i % 2 == 0 else args.passes_run[::-1]) for i in range(args.passes)]
        for i, these in order:
            for label in tqdm(these, desc=f"{ids.shape[1]} tokens, pass {i + 1}"):
                row = {"input_tokens": ids.shape[1], "pass": label, "run": i, "prompt": prompt.name}
                if label == "floor":
                    row["seconds"] = _floor_seconds(draft, ids[:, :-1])
                    row["peak_kv_bytes"] = 0
                else:
                    fields = {k: v for k, v in label_fields(label).items() if k != "policy"}
                    if label == "full":
                        fields["prompt_chunk"] = 0  # the whole prompt in one forward
                    seconds, peak, cache = _read(draft, ids, fields)
                    row.update(seconds=seconds, peak_kv_bytes=peak, policy=cache.config.policy)
                    row["settings"] = {"prompt_chunk": cache.config.reading_chunk, "budget": cache.config.budget}
                    row["settings"]["prompt_budget"] = cache.config.prompt_budget
                    del cache
                row["full_kv_bytes"] = full_kv_bytes(draft, ids.shape[1] - 1)
                rows.append(row)
                gc.collect()
    return {
        "what": "the drafter's prompt pass (all but the prompt's last token) into the default policy's cache",
        "preset": args.preset,
        "dtype": args.dtype,
        "machine": machine(),
        "threads": torch.get_num_threads(),
        "date": datetime.date.today().isoformat(),
        "command": "python -m benchmarks.drafter_prompt_pass " + " ".join(args.argv),
        "rows": rows,
    }


def table(record: dict) -> str:
    """Per input length and pass: seconds (mean, range over runs), x the full pass, x the floor, KV peak / full."""
    rows = record["rows"]
    body = []
    for length in dict.fromkeys(r["input_tokens"] for r in rows):
        mine = [r for r in rows if r["input_tokens"] == length]
        mean = {
            p: statistics.mean(r["seconds"] for r in mine if r["pass"] == p)
            for p in dict.fromkeys(r["pass"] for r in mine)
        }
        for label, seconds in mean.items():
            runs = [r["seconds"] for r in mine if r["pass"] == label]
            peak = max(r["peak_kv_bytes"] for r in mine if r["pass"] == label)
            full = mine[0]["full_kv_bytes"]
            body.append(
                [
                    length,
                    label,
                    f"{seconds:.1f} ({min(runs):.1f}-{max(runs):.1f})",
                    f"{seconds / mean['full']:.2f}x" if "full" in mean else "-",
                    f"{seconds / mean['floor']:.2f}x" if "floor" in mean else "-",
                    "-" if label == "floor" else f"{peak / 2**20:.0f} MiB ({peak / full:.2f}x)",
                ]
            )
    head = (
        f"{record['preset']} drafter, {record['dtype']}, {record['machine']}, {record['date']}; "
        f"{len({r['run'] for r in rows})} interleaved runs per pass. KV peak against a plain cache of the prompt.\n\n"
    )
    headers = ["input tokens", "pass", "seconds", "x full pass", "x floor", "KV peak (x full cache)"]
    return head + pipe_table(headers, body) + "\n"


def main(argv=None) -> None:
    import sys

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--input-tokens", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 16384, 32000])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--sources", default="repo", type=sources)
    parser.add_argument("--settings", dest="passes_run", type=split_labels, default=list(PASSES))
    parser.add_argument("--passes", type=int, default=2, help="interleaved runs of every pass")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--name", default="drafter-prompt-pass")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    record = run(args)
    write_record(args.out, args.name, record, table(record))


if __name__ == "__main__":
    main()
