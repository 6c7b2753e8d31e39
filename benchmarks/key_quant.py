"""How much quantising the drafter's keys moves its attention: per token vs per channel, on real weights.

    python -m benchmarks.key_quant --out benchmarks/results/key-quant.json

One forward of the preset's drafter (fp32) over a prompt; for every full-attention layer, the last `--queries`
queries attend the prompt's keys as they are and as optimum-quanto round-trips them (`rift_hf.storage.Quantizer`,
per token with groups of `--group` channels, or per channel with groups of `--group` tokens); the record is the total
variation distance between the two attention distributions, averaged over query heads and queries, per layer.
"""

from __future__ import annotations

import argparse
import datetime
import json
from pathlib import Path

import torch

import rift_hf
from lab.records import machine
from rift_hf.cache import RiftLayer
from rift_hf.models import PRESETS, ensure_local, load_model
from rift_hf.prompts import build_prompt
from rift_hf.storage import Quantizer


def attention_shift(query, keys, scale, quantizer) -> float:
    """Mean total variation between softmax(q k^T) with `keys` and with their quantised round trip."""
    heads, n, dim = keys.shape[1:]
    group = query.shape[1] // heads
    q = query[0].view(heads, group, -1, dim)
    exact = torch.softmax(torch.einsum("hgld,hnd->hgln", q, keys[0]) * scale, -1)
    rough = quantizer.dequantize(quantizer.quantize(keys), tuple(keys.shape))
    approx = torch.softmax(torch.einsum("hgld,hnd->hgln", q, rough[0]) * scale, -1)
    return float(0.5 * (approx - exact).abs().sum(-1).mean())


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder", choices=sorted(PRESETS))
    parser.add_argument("--source", default="textwrap", help="standard-library module the prompt is built from")
    parser.add_argument("--input-tokens", type=int, default=2048)
    parser.add_argument("--queries", type=int, default=32, help="latest queries that attend")
    parser.add_argument("--dtypes", default="int4,int8")
    parser.add_argument("--group", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/key-quant.json"))
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    _, draft_spec = PRESETS[args.preset]
    draft = load_model(draft_spec, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(ensure_local(draft_spec))
    draft.set_attn_implementation("rift")  # hands each layer's queries to the cache
    ids = build_prompt(tokenizer, args.source, "repeat", args.input_tokens).input_ids
    caught = {}
    observe = RiftLayer.observe

    def catch(layer, query, key, scale, sinks):
        caught[layer.layer_idx] = (query[:, :, -args.queries :].clone(), key.clone(), scale)
        return observe(layer, query, key, scale, sinks)

    RiftLayer.observe = catch
    try:
        with torch.no_grad():
            cache = rift_hf.RiftCache(draft.config, {"policy": "rift-dyn", "budget": 10 * ids.shape[1]})
            draft(ids, past_key_values=cache, use_cache=True)
    finally:
        RiftLayer.observe = observe
    runs = []
    for dtype in args.dtypes.split(","):
        for per_channel in (False, True):
            shifts = []
            for query, keys, scale in (caught[i] for i in sorted(caught)):
                keys = keys[:, :, : keys.shape[2] // args.group * args.group]  # whole groups either way
                shifts.append(attention_shift(query, keys, scale, Quantizer(keys, dtype, args.group, per_channel)))
            runs.append(
                {
                    "dtype": dtype,
                    "keys": "per channel" if per_channel else "per token",
                    "mean": sum(shifts) / len(shifts),
                    "max": max(shifts),
                    "per_layer": shifts,
                }
            )
            print(f"{dtype} {runs[-1]['keys']}: total variation mean {runs[-1]['mean']:.3f}, max {runs[-1]['max']:.3f}")
    result = {
        "preset": args.preset,
        "prompt": f"repeat:{args.source}",
        "input_tokens": ids.shape[1],
        "queries": args.queries,
        "group": args.group,
        "drafter_dtype": "float32",
        "machine": machine(),
        "date": datetime.date.today().isoformat(),
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
