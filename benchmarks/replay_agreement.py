"""Replay against real assisted runs on real weights: per policy and prompt, AL and rounds both ways.

    python -m benchmarks.replay_agreement --input-tokens 1024 --new-tokens 128 --per-task 1 \
        --policies full,snapkv,rift-dyn --out benchmarks/results/replay_agreement-1k.json
    python -m benchmarks.replay_agreement --table benchmarks/results/replay_agreement-1k.json \
        --readme docs/results/replay.md

The target's greedy output is computed (or read from the replay cache) once per prompt; each policy then runs once
through real `generate(assistant_model=...)` and once through `rift_hf.replay`, with the drafter in `--dtype` and the
target in `--target-dtype`. Where the real run's output differs from the target's own greedy output (bf16
verification of chunks rounds differently), its AL is not the replayed one; the record says so per run. Written
after every run, so a partial file is usable; a rerun with the same `--out` and setting skips the runs it holds.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import rift_hf
from lab.cli import split_labels
from lab.records import machine, policy_config
from lab.tables import pipe_table
from rift_hf.models import PRESETS, fix_draft_length, load_model, load_preset
from rift_hf.prompts import prompt_set
from rift_hf.replay import load_target_output, replay, save_target_output, target_output, target_output_path


def markdown(result: dict) -> str:
    """The agreement runs as a markdown table, with the setting they ran in."""
    # A resumed file holds runs of several sessions: each run carries its machine and date (older ones: the file's).
    machines = (
        ", ".join(dict.fromkeys(r.get("machine", result["machine"]) for r in result["runs"])) or result["machine"]
    )
    dates = ", ".join(sorted({r.get("date", result["date"]) for r in result["runs"]})) or result["date"]
    head = (
        f"{result['preset']}, {result['compression']:g}x, ~{result['input_tokens']} source tokens, "
        f"{result['new_tokens']} new tokens, gamma={result['gamma']}, drafter {result['drafter_dtype']}, target "
        f"{result['target_dtype']}, {machines}, {dates}\n\n"
    )
    headers = [
        "prompt", "policy", "AL real", "AL replay", "rounds equal", "real output = target greedy", "real s", "replay s",
    ]  # fmt: skip
    rows = [
        [
            f"{r['prompt']} ({r['input_tokens']} tok)",
            r["policy"],
            f"{r['al_real']:.2f}",
            f"{r['al_replay']:.2f}",
            "yes" if r["same_rounds"] else f"no, from round {r['first_differing_round']}",
            "yes" if r["real_output_is_target_greedy"] else "no",
            f"{r['real_seconds']:.0f}",
            f"{r['replay_seconds']:.0f}",
        ]
        for r in result["runs"]
    ]
    return head + pipe_table(headers, rows) + "\n"


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen-coder", choices=["tiny-random", *sorted(PRESETS)])
    parser.add_argument("--input-tokens", type=int, default=1024)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--compression", type=float, default=4.0)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--delta", type=int, default=128)
    parser.add_argument("--policies", default="full,snapkv,rift-dyn")
    parser.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="drafter dtype")
    parser.add_argument("--target-dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--targets", type=Path, default=Path("benchmarks/results/targets"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/replay_agreement.json"))
    parser.add_argument("--table", type=Path, help="only render this result file as markdown")
    parser.add_argument("--readme", type=Path, help="with --table: write it into this file's block (--block)")
    parser.add_argument("--block", default="replay-agreement", help="with --readme: the <!-- NAME:start --> block")
    args = parser.parse_args(argv)
    if args.table:
        from lab.tables import write_into_readme

        text = markdown(json.loads(args.table.read_text()))
        if args.readme:
            write_into_readme(text, args.readme, args.block)
        print(text)
        return {}
    from transformers import AutoTokenizer

    from rift_hf.models import ensure_local

    if args.preset == "tiny-random":  # random fp32 models: the mechanics only (tests)
        target, draft, tokenizer = load_preset(args.preset)
    else:
        target_spec, draft_spec = PRESETS[args.preset]
        target = load_model(target_spec, getattr(torch, args.target_dtype))
        draft = load_model(draft_spec, getattr(torch, args.dtype))
        tokenizer = AutoTokenizer.from_pretrained(ensure_local(target_spec))
    fix_draft_length(target, draft, gamma=11)
    prompts = prompt_set(tokenizer, args.input_tokens, args.per_task)
    result = {key: getattr(args, key) for key in ("preset", "input_tokens", "new_tokens", "compression", "delta")}
    result |= {"drafter_dtype": args.dtype, "target_dtype": args.target_dtype, "machine": machine()}
    result |= {"date": datetime.date.today().isoformat(), "gamma": 11, "window": args.window, "runs": []}
    if args.out.exists():  # resume: the same setting keeps its runs, another one is refused rather than mixed in
        previous = json.loads(args.out.read_text())
        setting = [k for k in result if k not in ("machine", "date", "runs") and previous.get(k) != result[k]]
        if setting:
            raise SystemExit(f"{args.out} holds runs of another setting ({', '.join(setting)}); choose another --out.")
        # Runs written before runs carried their own machine and date keep the file's.
        result["runs"] = [{"machine": previous["machine"], "date": previous["date"], **r} for r in previous["runs"]]
    done = {(run["prompt"], run["policy"]) for run in result["runs"]}
    policies = split_labels(args.policies)
    progress = tqdm(total=len(prompts) * len(policies), initial=len(done), desc="agreement runs")
    gen = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens, "do_sample": False}
    for prompt in prompts:
        path = target_output_path(
            args.targets, args.preset, prompt.name, prompt.input_ids, args.new_tokens, args.target_dtype
        )
        if not path.exists():
            record = target_output(target, prompt.input_ids, args.new_tokens, min_new_tokens=args.new_tokens)
            save_target_output(record, path, preset=args.preset, prompt=prompt.name, dtype=args.target_dtype)
        record = load_target_output(path, prompt.input_ids)
        for policy in policies:
            if (prompt.name, policy) in done:
                continue
            config = policy_config(policy, 1.0 / args.compression, args.window, args.delta, None)
            tick = time.perf_counter()
            out = target.generate(
                prompt.input_ids.to(target.device),
                assistant_model=draft,
                cache_implementation="rift",
                cache_config=config,
                **gen,
            )
            real_seconds = time.perf_counter() - tick
            real = rift_hf.last_stats(target)
            tick = time.perf_counter()
            replayed = replay(draft, record, config)
            replay_seconds = time.perf_counter() - tick
            real_rounds = [r["accepted"] for r in real.rounds]
            replay_rounds = [r["accepted"] for r in replayed.rounds]
            first = next((i for i, (a, b) in enumerate(zip(real_rounds, replay_rounds, strict=False)) if a != b), None)
            result["runs"].append(
                {
                    "prompt": prompt.name,
                    "input_tokens": prompt.tokens,
                    "policy": policy,
                    "real_output_is_target_greedy": bool(torch.equal(out.cpu(), record.sequence)),
                    "al_real": real.acceptance_length,
                    "al_replay": replayed.acceptance_length,
                    "al_ratio": replayed.acceptance_length / real.acceptance_length,
                    "rounds_real": len(real_rounds),
                    "rounds_replay": len(replay_rounds),
                    "same_rounds": real_rounds == replay_rounds,
                    "first_differing_round": first,
                    "real_seconds": real_seconds,
                    "replay_seconds": replay_seconds,
                    "machine": result["machine"],
                    "date": result["date"],
                }
            )
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=2) + "\n")
            progress.update()
            tqdm.write(json.dumps(result["runs"][-1]))
    return result


if __name__ == "__main__":
    main()
