"""Long inputs measured end to end: prompt forwards computed once, then target outputs, replays and decode-phase runs.

    python -m benchmarks.long_inputs prefill --input-tokens 16384 --per-task 8
    python -m benchmarks.long_inputs speed --input-tokens 16384 --per-task 2 --out benchmarks/results/long/...

`prefill` records each prompt's two forwards (`rift_hf.prefill.PromptCache`: the target over the prompt without its
last token, the drafter over the whole prompt) into `$RIFT_HF_HOME/prefills/` (GBs at 32K: not in the repository),
then decodes the target alone from its record (`generate_from`) and saves that greedy output where
`python -m lab replay` reads target outputs (`--targets`, dtype in the name). Replay (`python -m lab replay ...
--prefills`) and `speed` start from those records instead of paying a long prefill per run. Every stage resumes:
what is on disk is not computed again.

`speed` runs, per prompt and in one process, the target alone and each assisted setting from the same records, timing
the decode phase only (`generate_from`), and appends one JSON row per run to `<out>/rows.jsonl` as it finishes
(`--resume` continues a file; without it a run starts afresh). `--passes N` runs each prompt's settings N times,
every other pass in reverse order; the tables sum the passes, so a drift of the host's speed weighs every setting
alike. The prompt forwards' own costs are recorded once per prompt (`prefill_seconds`). `table` renders a `speed`
folder (and writes `<folder>/table.md`); `make main` is `speed` at ~4K inputs followed by `table`. `matched` compares
two drafting settings prompt by prompt, also at matched host speed (`cost_matched`: this CPU's speed drifts between a
prompt's runs).
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import statistics
from pathlib import Path

import torch
from tqdm.auto import tqdm

from lab.cli import split_labels
from lab.cli.arguments import sources
from lab.records import machine, policy_config
from rift_hf import RiftConfig
from rift_hf.attention import use_rift_attention
from rift_hf.models import PRESETS, fix_draft_length, load_preset
from rift_hf.prefill import PromptCache, prefill_folder, prefills_root
from rift_hf.prompts import prompt_set
from rift_hf.replay import (
    TargetOutput,
    _eos_ids,
    cached_target_output,
    save_target_output,
    target_output_path,
)

TARGETS = Path("benchmarks/results/targets")


def has_prompt_cache(folder: Path) -> bool:
    """Whether `folder` holds a prompt's recorded forwards (the drafter's file is written last)."""
    return (folder / "draft.safetensors").is_file()


def ensure_prompt_cache(target, draft, prompt, folder: Path, window: int) -> PromptCache:
    """The prompt's cache from `folder`, computed and saved there first when missing."""
    if has_prompt_cache(folder):
        cache = PromptCache.load(folder)
        if cache.draft.backend == "rift":  # recorded as PromptCache.compute records it: on the "rift" backend
            use_rift_attention(draft, RiftConfig(policy="rift-stat", window=window))
        return cache
    cache = PromptCache.compute(target, prompt.input_ids, draft, window=window)
    cache.save(folder, prompt=prompt.name, target=target.name_or_path, draft=draft.name_or_path, date=_today())
    return cache


def _today() -> str:
    return datetime.date.today().isoformat()


def run_prefill(args) -> None:
    from rift_hf.generation.decode import generate_from

    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    prompts = _prompts(tokenizer, args)
    for prompt in tqdm(prompts, desc="prompt forwards"):
        folder = prefill_folder(args.prefills, args.preset, prompt, target.dtype)
        record = cached_target_output(
            args.targets, args.preset, prompt.name, prompt.input_ids, args.new_tokens, target.dtype
        )
        if record is not None and has_prompt_cache(folder):
            continue
        cache = None  # the previous prompt's records go before the next are made (GBs at 32K)
        cache = ensure_prompt_cache(target, draft, prompt, folder, args.window)
        if record is None:
            n = args.new_tokens
            out, seconds = generate_from(target, cache, max_new_tokens=n, min_new_tokens=n)
            path = target_output_path(args.targets, args.preset, prompt.name, prompt.input_ids, n, target.dtype)
            output = TargetOutput(
                prompt_ids=prompt.input_ids,
                output_ids=out[:, prompt.tokens :].cpu(),
                max_new_tokens=n,
                min_new_tokens=n,
                eos_token_id=_eos_ids(target.generation_config),
                pad_token_id=target.generation_config.pad_token_id,
                seconds=seconds,
            )
            save_target_output(
                output,
                path,
                preset=args.preset,
                prompt=prompt.name,
                dtype=str(target.dtype).removeprefix("torch."),
                by="benchmarks.long_inputs prefill (decode phase from the recorded prompt forward)",
                prefill_seconds=cache.target.seconds,
                machine=machine(),
            )


def _prompts(tokenizer, args) -> list:
    prompts = prompt_set(tokenizer, args.input_tokens, args.per_task, tasks=args.tasks, sources=args.sources)
    # Regimes interleaved (the first prompt of each task, then the second ...), so a partial run covers both.
    rank = {p.name: sum(q.task == p.task for q in prompts[:i]) for i, p in enumerate(prompts)}
    return sorted(prompts, key=lambda p: rank[p.name])


# Generation-config fields of the drafter that a setting may override after `@` (the rest are RiftConfig fields).
DRAFTING = ("num_assistant_tokens", "num_assistant_tokens_schedule", "assistant_confidence_threshold")


def split_drafting(setting: str) -> tuple[str, dict]:
    """`transformers@assistant_confidence_threshold=0.4` -> (`transformers`, its drafter generation-config fields);
    RiftConfig overrides stay in the label (`page-round@draft_length=auto,assistant_confidence_threshold=0.4` ->
    `page-round@draft_length=auto` and the threshold)."""
    name, _, overrides = setting.partition("@")
    kept, drafting = [], {}
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        if key in DRAFTING:
            drafting[key] = json.loads(value) if key != "num_assistant_tokens_schedule" else value
        else:
            kept.append(item)
    return name + ("@" + ",".join(kept) if kept else ""), drafting


SETTINGS = ("target", "transformers", "full", "page-round", "page-round@budget=2048", "rift-dyn@tokens_ahead=128")


def run_speed(args) -> None:
    from rift_hf import last_stats
    from rift_hf.generation.decode import generate_from

    target, draft, tokenizer = load_preset(args.preset, dtype=args.dtype)
    if args.linear == "weight-major":  # both models' small-batch linear layers as weight @ x.T (rift_hf.speedups)
        from rift_hf.speedups import weight_major_linear

        weight_major_linear(target)
        weight_major_linear(draft)
    if args.attention == "sdpa_gqa":  # several queries over a mask attend the key/value heads in place (speedups.py)
        from rift_hf.speedups import gqa_attention

        gqa_attention(target)
        gqa_attention(draft)
    fix_draft_length(target, draft, gamma=args.gamma)
    for name, value in args.draft_options.items():
        setattr(draft.generation_config, name, value)
        setattr(target.generation_config, name, value)
    prompts = _prompts(tokenizer, args)
    rows_path = args.out / "rows.jsonl"
    rows_path.parent.mkdir(parents=True, exist_ok=True)
    if rows_path.exists() and not args.resume:
        rows_path.unlink()  # a fresh measurement (--resume continues the file instead)
    earlier = [json.loads(line) for line in rows_path.read_text().splitlines()] if rows_path.exists() else []
    done = {(r["prompt"], r["setting"], r.get("pass", 0)) for r in earlier}
    # Every other pass runs a prompt's settings in reverse (A B C, C B A): a drift of the host's speed that is linear in
    # time then weighs every setting alike once the passes are summed (`_read_rows`).
    order = [(i, args.settings if i % 2 == 0 else args.settings[::-1]) for i in range(args.passes)]
    todo = [(p, s, i) for p in prompts for i, these in order for s in these if (p.name, s, i) not in done]
    if not args.drop_prefills:
        # The missing prompt forwards first, each beside the two models alone: at ~32K in fp32 one computed after
        # another prompt's runs in the same process ran out of 24 GB (2026-12-06); the runs then load them from disk.
        # (With --drop-prefills each is still computed where its runs start, so that one at a time is on disk.)
        for prompt in {p.name: p for p, _, _ in todo}.values():
            folder = prefill_folder(args.prefills, args.preset, prompt, target.dtype)
            if not has_prompt_cache(folder):
                ensure_prompt_cache(target, draft, prompt, folder, args.window)
                gc.collect()
    cache, cached_for = None, None
    alone = {r["prompt"]: r["new_ids"] for r in earlier if r["setting"] == "target"}  # the target alone's new tokens
    for prompt, setting, run_pass in tqdm(todo, desc="decode-phase runs"):
        if cached_for != prompt.name:
            folder = prefill_folder(args.prefills, args.preset, prompt, target.dtype)
            cache = None  # the previous prompt's records go before the next are made (GBs at 32K)
            cache, cached_for = ensure_prompt_cache(target, draft, prompt, folder, args.window), prompt.name
            if args.drop_prefills:
                import shutil

                shutil.rmtree(folder, ignore_errors=True)  # held in memory for this prompt's runs
        gen = {"max_new_tokens": args.new_tokens, "min_new_tokens": args.new_tokens}
        row = {"prompt": prompt.name, "task": prompt.task, "setting": setting, "input_tokens": prompt.tokens}
        row["pass"] = run_pass
        label, drafting = split_drafting(setting)
        # All of them restored after the run: the heuristic schedule writes its last length back into the config.
        saved = {name: getattr(draft.generation_config, name) for name in DRAFTING}
        for name, value in drafting.items():
            setattr(draft.generation_config, name, value)
        try:
            if label == "target":
                out, seconds = generate_from(target, cache, **gen)
            elif label == "transformers":
                forwards = []
                handle = target.register_forward_pre_hook(lambda *_, f=forwards: f.append(1))
                try:
                    out, seconds = generate_from(target, cache, assistant_model=draft, **gen)
                finally:
                    handle.remove()
                row.update(rounds=len(forwards), al=args.new_tokens / len(forwards))
            else:
                config = policy_config(label, args.budget, args.window, args.delta, None)
                out, seconds = generate_from(
                    target, cache, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen
                )
        finally:
            for name, value in saved.items():
                setattr(draft.generation_config, name, value)
        if label not in ("target", "transformers"):
            stats = last_stats(target)
            row.update(
                reasons=[r.get("reason") for r in stats.rounds],
                rounds=len(stats.rounds),
                al=stats.acceptance_length,
                accepted=[r["accepted"] for r in stats.rounds],
                drafted=[r["drafted"] for r in stats.rounds],
                draft_seconds=sum(r["draft_seconds"] for r in stats.rounds),
                # per round, to price a simulated controller as measured (benchmarks/draft_length_traces.py)
                round_draft_seconds=[round(r["draft_seconds"], 4) for r in stats.rounds],
                round_verify_seconds=[round(r.get("verify_seconds") or 0.0, 4) for r in stats.rounds],
                policy=stats.policy,
                budget=stats.budget,
                peak_kv_bytes=stats.peak_kv_bytes,
                peak_store_bytes=stats.peak_store_bytes,
                rescorings=len(stats.rescorings),
                # inside `seconds`: the drafter's record loaded into its cache (a real run pays it in its prefill)
                prompt_load_seconds=stats.prompt_load_seconds,
            )
        new = out[0, prompt.tokens :].cpu().tolist()
        if setting == "target":
            alone[prompt.name] = new
        row.update(
            output_tokens=len(new),
            seconds=seconds,
            tokens_per_s=len(new) / seconds,
            same_as_target=None if prompt.name not in alone else new == alone[prompt.name],
            new_ids=new,
            prefill_seconds={"target": cache.target.seconds, "draft": cache.draft.seconds},
            gamma=args.gamma,
            linear=args.linear,
            attention={"target": target.config._attn_implementation, "draft": draft.config._attn_implementation},
            dtype=str(target.dtype).removeprefix("torch."),
            machine=machine(),
            threads=torch.get_num_threads(),
            date=_today(),
        )
        with rows_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def speed_table(folder: Path) -> str:
    """
    Per setting, over the prompts of a `speed` folder: decode tokens/s (new tokens over the decode phase), speed-up
    over the target alone and over transformers' own assisted generation (the first `transformers` setting, with or
    without options after `@`; mean of per-prompt ratios, range), AL, retention (AL over the full RiftCache's on the
    same prompt, same run), drafter KV peak, output = target alone. With several prompts per regime, the same per
    regime after.
    """
    rows = _read_rows(folder)
    prefill = [r["prefill_seconds"] for r in rows if r["setting"] == "target"]
    first = rows[0]
    lengths = sorted({r["input_tokens"] for r in rows})
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    tasks = list(dict.fromkeys(r["task"] for r in rows))

    head = (
        f"{len(prompts)} prompts ({', '.join(tasks)}), {lengths[0]}-{lengths[-1]} "
        f"input tokens, {first['output_tokens']} new tokens, gamma <= {first['gamma']}, {first['dtype']}, "
        f"{first.get('linear', 'torch')} linear layers, target attention "
        f"{first.get('attention', {}).get('target', 'sdpa')}, "
        f"{first['machine']}, {', '.join(sorted({r['date'] for r in rows}))}. Decode phase only: each prompt's "
        f"forwards were recorded once (target {_cell([p['target'] for p in prefill], '{:.0f}')} s, drafter "
        f"{_cell([p['draft'] for p in prefill], '{:.0f}')} s) and every run started from them. Drafting share: the "
        "drafter's time over the decode phase's (the rest is the target's verification and the loop).\n\n"
    )
    passes = max(len(r["passes"]) for r in rows)
    if passes > 1:
        drift = [
            max(p["seconds"] for p in r["passes"]) / min(p["seconds"] for p in r["passes"]) - 1
            for r in rows
            if r["setting"] == "target" and len(r["passes"]) > 1
        ]
        head += f"{passes} passes per prompt, every other one in reverse order (tokens/s over all of them)"
        if drift:
            head += "; the target alone's seconds on a prompt differed between its passes by "
            head += f"{_cell([100 * d for d in drift], '{:.1f}')}% (the host's drift)"
        head += ".\n\n"
    text = head + _speed_rows(rows)
    if len(prompts) > len(tasks) > 1:  # several prompts in each of several regimes
        for task in tasks:
            mine = [r for r in rows if r["task"] == task]
            text += f"\n`{task}` ({len({r['prompt'] for r in mine})} prompts):\n\n" + _speed_rows(mine)
    return text


def _read_rows(folder: Path) -> list[dict]:
    """
    The rows of a `speed` folder (`<folder>/rows.jsonl`), one per prompt and setting, in the order they first ran. The
    passes of a `--passes` run are merged: tokens/s over all of them (seconds and drafting seconds summed: with every
    other pass reversed, a drift of the host's speed that is linear in time weighs every setting alike), AL averaged,
    the output equal to the target alone's only if every pass's was; the rows merged are kept in `passes`.
    """
    merged = {}
    for line in (Path(folder) / "rows.jsonl").read_text().splitlines():
        row = json.loads(line)
        key = (row["prompt"], row["setting"])
        if key not in merged:
            merged[key] = dict(row, passes=[row])
            continue
        into = merged[key]
        parts = into["passes"]
        parts.append(row)
        into["seconds"] = sum(p["seconds"] for p in parts)
        into["tokens_per_s"] = sum(p["output_tokens"] for p in parts) / into["seconds"]
        if row.get("draft_seconds") is not None:
            into["draft_seconds"] = sum(p["draft_seconds"] for p in parts)
        if row.get("al") is not None:
            into["al"] = statistics.mean(p["al"] for p in parts)
        same = [p.get("same_as_target") for p in parts]
        into["same_as_target"] = None if None in same else all(same)
    return list(merged.values())


def _cell(values, fmt="{:.2f}") -> str:
    """Mean (min-max) of per-prompt values; the value alone for one prompt, `-` for none."""
    if not values:
        return "-"
    mean = fmt.format(statistics.mean(values))
    return mean if len(values) == 1 else f"{mean} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _speed_rows(rows: list[dict]) -> str:
    """`speed_table`'s table over `rows` (one per prompt and setting)."""
    from lab.tables import pipe_table

    by = {(r["prompt"], r["setting"]): r for r in rows}
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))
    settings = list(dict.fromkeys(r["setting"] for r in rows))
    assisted = next((s for s in settings if s.partition("@")[0] == "transformers"), None)

    def ratios(setting, over, key="tokens_per_s"):
        pairs = [(by.get((p, setting)), by.get((p, over))) for p in prompts]
        return [a[key] / b[key] for a, b in pairs if a and b and a.get(key) and b.get(key)]

    full = "full" if "full" in settings else None
    table = []
    for setting in settings:
        mine = [by[p, setting] for p in prompts if (p, setting) in by]
        kv = [r["peak_kv_bytes"] + r.get("peak_store_bytes", 0) for r in mine if r.get("peak_kv_bytes") is not None]
        rift = setting != "target" and setting.partition("@")[0] != "transformers"
        table.append(
            [
                setting,
                _cell([r["tokens_per_s"] for r in mine]),
                _cell(ratios(setting, "target")) + "x",
                _cell(ratios(setting, assisted)) + "x" if assisted else "-",
                _cell([r["al"] for r in mine if r.get("al")]),
                _cell(ratios(setting, full, "al")) if full and rift else "-",
                _cell([b / 2**20 for b in kv], "{:.0f}") + " MiB" if kv else "-",
                _cell([r["draft_seconds"] / r["seconds"] for r in mine if r.get("draft_seconds") is not None]),
                f"{sum(bool(r['same_as_target']) for r in mine)}/{len(mine)}",
            ]
        )
    headers = [
        "setting", "tokens/s", "vs target alone", "vs transformers' assisted", "AL", "retention", "drafter KV peak",
        "drafting share", "output = target alone",
    ]  # fmt: skip
    return pipe_table(headers, table) + "\n"


def cost_matched(folder: Path, a: str, b: str) -> str:
    """
    Setting `a` over setting `b`, per prompt of a `speed` folder: tokens/s as measured, and at matched host speed.
    A prompt's runs are a minute or more apart and this host's speed drifted by up to 20% between them (the same
    rounds take longer in one row than in the other), so the ratio is also scaled by how much dearer `a`'s rounds
    were than `b`'s rounds of the same size: the median seconds (drafting plus verification, each row's first round
    left out) of the rounds drafting the longest length that both rows drafted at least 3 times. Without such rounds a
    prompt's matched ratio is `-`. Means per task follow the table.
    """
    from lab.tables import pipe_table

    rows = _read_rows(folder)
    by = {(r["prompt"], r["setting"]): r for r in rows}
    drafting = sorted({r["setting"] for r in rows if "round_draft_seconds" in r})
    for setting in (a, b):
        if setting not in drafting:
            raise ValueError(
                f"{folder} has no rows of {setting!r} with per-round seconds; name two of its rift settings: "
                f"{drafting} (the target alone and transformers' own assisted generation record no rounds)."
            )

    def seconds_by_length(row) -> dict:
        out = {}
        for part in row["passes"]:
            rounds = zip(part["drafted"], part["round_draft_seconds"], part["round_verify_seconds"], strict=True)
            for k, draft, verify in list(rounds)[1:]:
                out.setdefault(k, []).append(draft + verify)
        return out

    body, per_task = [], {}
    for prompt in dict.fromkeys(r["prompt"] for r in rows):
        ra, rb = by.get((prompt, a)), by.get((prompt, b))
        if not ra or not rb:
            continue
        measured = ra["tokens_per_s"] / rb["tokens_per_s"]
        sa, sb = seconds_by_length(ra), seconds_by_length(rb)
        shared = [k for k in sa if k and k in sb and len(sa[k]) >= 3 and len(sb[k]) >= 3]
        matched = factor = None
        if shared:
            k = max(shared)
            factor = statistics.median(sa[k]) / statistics.median(sb[k])
            matched = measured * factor
        per_task.setdefault(ra["task"], []).append((measured, matched))
        cells = [f"{factor:.3f}", f"{matched:.3f}"] if shared else ["-", "-"]
        body.append([prompt, f"{measured:.3f}", *cells])
    text = f"`{a}` over `{b}` ({Path(folder).name}):\n\n"
    text += pipe_table(["prompt", "measured", "a's rounds / b's (same size)", "at matched host speed"], body) + "\n"
    for task, pairs in per_task.items():
        matched = [m for _, m in pairs if m is not None]
        text += f"- `{task}`: measured mean {statistics.mean(x for x, _ in pairs):.3f} over {len(pairs)} prompts; "
        text += (
            f"at matched host speed {statistics.mean(matched):.3f} over the {len(matched)} with shared rounds\n"
            if matched
            else "no prompt with shared rounds\n"
        )
    return text


def speed_plot(folders: list[Path], out: Path, over: str = "transformers") -> Path:
    """
    Speed-up over `over` (transformers' assisted generation, or the target alone) against input length: one panel
    per regime, a line per setting through the per-length means, each prompt a point. From the `speed` folders'
    rows (the same run's `over` row for each prompt).
    """
    import matplotlib

    matplotlib.use("Agg")
    import statistics

    import matplotlib.pyplot as plt

    rows = [row for folder in folders for row in _read_rows(folder)]
    base = {(r["prompt"], r["input_tokens"], r.get("linear", "torch")): r for r in rows if r["setting"] == over}
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    fig, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False, sharey=True)
    for axis, task in zip(axes[0], tasks, strict=True):
        points: dict[str, dict[int, list[float]]] = {}
        for r in rows:
            ref = base.get((r["prompt"], r["input_tokens"], r.get("linear", "torch")))
            if r["task"] != task or r["setting"] == over or ref is None:
                continue
            label = r["setting"] + (" (weight-major)" if r.get("linear", "torch") != "torch" else "")
            ratio = r["tokens_per_s"] / ref["tokens_per_s"]
            points.setdefault(label, {}).setdefault(r["input_tokens"], []).append(ratio)
        for label, by_length in points.items():
            lengths = sorted(by_length)
            (line,) = axis.plot(lengths, [statistics.mean(by_length[n]) for n in lengths], marker="o", label=label)
            for n in lengths:
                axis.scatter([n] * len(by_length[n]), by_length[n], color=line.get_color(), s=12, alpha=0.5)
        axis.axhline(1.0, color="grey", lw=0.8, ls="--")
        axis.set(title=task, xlabel="input tokens", xscale="log", ylabel=f"speed-up over {over}")
        lengths = sorted({n for by_length in points.values() for n in by_length})
        axis.set_xticks(lengths, [f"{n / 1000:.0f}K" for n in lengths])
        axis.minorticks_off()
        axis.grid(alpha=0.3)
        if points:
            axis.legend(fontsize=7)
    first = rows[0]
    fig.suptitle(f"decode phase, {first['dtype']}, {first['machine']}, {', '.join(sorted({r['date'] for r in rows}))}")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("prefill", "speed"):
        p = sub.add_parser(name)
        p.add_argument("--preset", default="qwen-coder", choices=["tiny-random", *sorted(PRESETS)])
        p.add_argument("--input-tokens", type=int, required=True)
        p.add_argument("--new-tokens", type=int, default=256)
        p.add_argument("--per-task", type=int, default=8)
        p.add_argument("--tasks", type=lambda t: tuple(t.split(",")), default=("repeat", "continue"))
        p.add_argument("--sources", default="repo", type=sources, help="a source set, or sources separated by commas")
        p.add_argument("--window", type=int, default=64)
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
        p.add_argument("--targets", type=Path, default=TARGETS)
        p.add_argument("--prefills", type=Path, default=None, help="default: $RIFT_HF_HOME/prefills")
    speed = sub.choices["speed"]
    speed.add_argument("--settings", type=split_labels, default=list(SETTINGS))
    speed.add_argument("--budget", type=float, default=0.25, help="budget of the policies without their own")
    speed.add_argument("--gamma", type=int, default=11)
    speed.add_argument("--delta", type=int, default=128)
    speed.add_argument("--draft-options", type=json.loads, default={}, help="generation-config fields, as JSON")
    speed.add_argument(
        "--linear",
        default="torch",
        choices=["torch", "weight-major"],
        help="weight-major: small-batch linear layers as weight @ x.T on a CPU (rift_hf.speedups.weight_major_linear)",
    )
    speed.add_argument(
        "--attention",
        default="sdpa_gqa",
        choices=["sdpa", "sdpa_gqa"],
        help="sdpa_gqa: on a CPU, verifications attend the key/value heads in place (rift_hf.speedups.gqa_attention); "
        "sdpa: transformers' own, which copies them when there is a mask",
    )
    speed.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run each prompt's settings this many times, every other pass in reverse order (A B C, C B A): the "
        "tables sum the passes, so a drift of the host's speed weighs every setting alike",
    )
    speed.add_argument("--out", type=Path, required=True)
    speed.add_argument("--resume", action="store_true", help="continue <out>/rows.jsonl instead of starting afresh")
    speed.add_argument(
        "--drop-prefills", action="store_true", help="delete each prompt's recorded forwards once loaded (GBs at 32K)"
    )
    table = sub.add_parser("table", help="the decode-phase rows of a `speed` folder as a markdown table")
    table.add_argument("folder", type=Path)
    table.add_argument("--readme", type=Path, help="write the table into this file's block (--block)")
    table.add_argument("--block", default="decode-phase")
    matched = sub.add_parser("matched", help="setting A over setting B per prompt, also at matched host speed")
    matched.add_argument("folder", type=Path)
    matched.add_argument("a")
    matched.add_argument("b")
    matched.add_argument("--out", type=Path, help="default: <folder>/matched.md")
    plot = sub.add_parser("plot", help="speed-up against input length from several `speed` folders (PNG)")
    plot.add_argument("folders", type=Path, nargs="+")
    plot.add_argument("--over", default="transformers", choices=["transformers", "target"])
    plot.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "plot":
        print(speed_plot(args.folders, args.out, args.over))
        return
    if args.command == "matched":
        text = cost_matched(args.folder, args.a, args.b)
        (args.out or args.folder / "matched.md").write_text(text)
        print(text)
        return
    if args.command == "table":
        text = speed_table(args.folder)
        (args.folder / "table.md").write_text(text)
        print(text)
        if args.readme:
            from lab.tables import write_into_readme

            write_into_readme(text, args.readme, args.block)
        return
    if args.command == "speed" and args.passes < 1:
        parser.error(f"--passes must be >= 1, got {args.passes}.")
    args.prefills = args.prefills or prefills_root()
    if "OMP_NUM_THREADS" in os.environ:
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    {"prefill": run_prefill, "speed": run_speed}[args.command](args)


if __name__ == "__main__":
    main()
