"""Overhead per verification round of rift's stateful-target rollback.

Compares, on the same prompt and drafter (random weights built from configs, CPU):
- `rift`: a stateful target (Qwen3-Next layout) through `cache_implementation="rift"` (split verification,
  restore and re-feed of accepted drafts);
- `unsafe`: the same target through transformers' own assisted loop with its refusal bypassed (no rollback: the
  timing floor, whose output is not guaranteed correct);
- `attention`: a non-stateful Llama target of the same width and depth through transformers' own loop.

    python -m benchmarks.stateful_overhead     # writes benchmarks/results/stateful_overhead.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM

import rift_hf  # noqa: F401  (registers cache_implementation="rift")
from rift_hf.models import fix_draft_length

WIDTH = dict(
    vocab_size=512,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=8,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=4096,
    tie_word_embeddings=False,
)


def build(model_type: str, seed: int, **fields):
    torch.manual_seed(seed)
    config = AutoConfig.for_model(model_type, **WIDTH, **fields)
    model = AutoModelForCausalLM.from_config(config).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model


def perturbed(model, noise: float):
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p) * noise * (p.std() if p.numel() > 1 else 1.0))
    fix_draft_length(other, gamma=6)
    return other


def run(target, draft, ids, new_tokens, repeats, **kwargs):
    """Median seconds of `repeats` generations and the number of verification rounds (target forward calls)."""
    calls = []
    handle = target.register_forward_hook(lambda *_: calls.append(1))
    seconds = []
    try:
        for _ in range(repeats):
            calls.clear()
            tick = time.perf_counter()
            with torch.no_grad():
                out = target.generate(ids, assistant_model=draft, max_new_tokens=new_tokens, do_sample=False, **kwargs)
            seconds.append(time.perf_counter() - tick)
    finally:
        handle.remove()
    seconds = sorted(seconds)[len(seconds) // 2]
    return out, {"seconds": seconds, "rounds": len(calls), "seconds_per_round": seconds / len(calls)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/stateful_overhead.json"))
    args = parser.parse_args(argv)
    layers = dict(
        num_hidden_layers=4, layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"]
    )
    stateful = build(
        "qwen3_next",
        0,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        **layers,
    )
    attention = build("llama", 0, num_hidden_layers=4)
    ids = torch.randint(3, WIDTH["vocab_size"], (1, args.prompt), generator=torch.Generator().manual_seed(0))
    results = {}
    reference = stateful.generate(ids, max_new_tokens=args.new_tokens, do_sample=False)
    draft = perturbed(stateful, 0.05)
    out, results["rift"] = run(
        stateful,
        draft,
        ids,
        args.new_tokens,
        args.repeats,
        cache_implementation="rift",
        cache_config={"policy": "full"},
    )
    results["rift"]["same_as_target_greedy"] = bool(torch.equal(out, reference))
    # The unsafe floor: same target and drafter, transformers' loop without rollback.
    stateful._is_stateful = False
    try:
        out, results["unsafe"] = run(stateful, draft, ids, args.new_tokens, args.repeats)
    finally:
        del stateful._is_stateful
    results["unsafe"]["same_as_target_greedy"] = bool(torch.equal(out, reference))
    attention_draft = perturbed(attention, 0.05)
    _, results["attention"] = run(attention, attention_draft, ids, args.new_tokens, args.repeats)
    results["overhead_per_round_vs_unsafe"] = (
        results["rift"]["seconds_per_round"] / results["unsafe"]["seconds_per_round"] - 1
    )
    payload = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads (CPU)",
        "dtype": "float32",
        "prompt_tokens": args.prompt,
        "new_tokens": args.new_tokens,
        "gamma": 6,
        "repeats": args.repeats,
        "results": results,
        "note": "random weights; a round is one target forward call (rift splits it into two chunks internally)",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(payload, indent=2) + "\n")
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
