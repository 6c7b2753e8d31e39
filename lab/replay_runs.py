"""`python -m lab replay`: the records of `compare` (AL, retention and its spread, rescorings, peak KV) measured by
exact replay of cached target outputs (`rift_hf.replay`), resumable row by row."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import torch

from lab.records import (
    TARGETS,
    Experiment,
    check_resumable,
    machine,
    read_compare,
    record_json,
    row_settings,
    rows_reference,
    stats_row,
    summarise,
    update_summary,
)
from lab.tables import markdown_table
from rift_hf.attention import use_rift_attention
from rift_hf.config import RiftConfig
from rift_hf.prefill import load_prefill_file, prefill_folder
from rift_hf.replay import (
    cached_target_output,
    capture_prefill,
    load_target_output,
    replay,
    save_target_output,
    target_output,
    target_output_path,
)


def replay_models(preset: str, dtype: str = "float32") -> tuple:
    """
    `(target or None, drafter, tokenizer)` for `replay_compare(models=...)`: a real preset's drafter in `dtype` and its
    tokenizer, the target left unloaded (it loads only if a target output is missing); other presets (tiny-random)
    load both in `dtype`.
    """
    from rift_hf.models import PRESETS, load_model, load_preset

    if preset not in PRESETS:
        return load_preset(preset, dtype=getattr(torch, dtype))
    from transformers import AutoTokenizer

    from rift_hf.models import ensure_local

    target_spec, draft_spec = PRESETS[preset]
    return None, load_model(draft_spec, getattr(torch, dtype)), AutoTokenizer.from_pretrained(ensure_local(target_spec))


def replay_compare(
    experiment: Experiment,
    compressions,
    out_dir: Path,
    *,
    dtype: str = "float32",
    target_dtype: str = "bfloat16",
    targets_dir: Path = TARGETS,
    summary_path: Path | None = None,
    models: tuple | None = None,
    cached_only: bool = False,
    prefills: Path | None = None,
) -> list[dict]:
    """
    `python -m lab compare`'s records (AL, retention and its per-prompt spread, rescorings, peak KV) of the experiment's
    policies at each compression, measured by replay.

    Target outputs are read from (or computed once into) `targets_dir`, keyed by preset, prompt, length and dtype.
    Every replayed (compression, prompt, policy) is appended to `<out_dir>/<compression>x/rows.jsonl` as it finishes,
    so a killed run continues where it stopped. The drafter's prompt forward runs once per prompt and is shared by
    every policy (`capture_prefill`; all policies then use the "rift" attention backend when any policy scores).
    One `compare.json` per compression is written (`"method": "replay"`), and its records are upserted into
    `summary.json`. Timing fields are left empty: teacher-forced forwards do not time real drafting. `models` reuses
    loaded `(target or None, drafter, tokenizer)`. With `cached_only`, prompts whose target output is not cached yet
    are left out (and named) instead of computed. With the experiment's `budget_tokens`, the budget is that many tokens
    for every prompt (E3's fixed budget across input lengths) instead of `1/compression` of it: `compressions` is then
    ignored and the rows go to `<out_dir>/<budget_tokens>tok/`. With `prefills`, the drafter's prompt forward is read
    from a prompt cache saved there (`rift_hf.prefill.prefill_folder`) where one exists.
    """
    from tqdm.auto import tqdm

    from rift_hf.generation.guide import target_attention
    from rift_hf.models import PRESETS, fix_draft_length, load_model
    from rift_hf.prompts import describe_sources

    preset, policies, new_tokens, budget_tokens = (
        experiment.preset, experiment.policies, experiment.new_tokens, experiment.budget_tokens
    )  # fmt: skip
    # A size is a compression (budget = 1/size of the prompt) or, with budget_tokens, the budget itself in tokens.
    sizes = [budget_tokens] if budget_tokens is not None else list(compressions)

    def folder(size) -> str:
        return f"{size}tok" if budget_tokens is not None else f"{size:g}x"

    target, draft, tokenizer = replay_models(preset, dtype) if models is None else models
    fix_draft_length(draft, gamma=experiment.gamma)
    prompts = experiment.prompts(tokenizer)
    records = []
    cached = {p.name: cached_target_output(targets_dir, preset, p.name, p.input_ids, new_tokens, target_dtype)
              for p in prompts}  # fmt: skip
    if cached_only:
        missing = [p.name for p in prompts if cached[p.name] is None]
        if missing:
            print(f"replay: no cached target output yet for {', '.join(missing)}; left out (--cached-only)")
        prompts = [p for p in prompts if p.name not in missing]
        if not prompts:
            raise ValueError(f"No prompt has a cached target output under {targets_dir}; run without --cached-only.")
    for prompt in prompts:
        record = cached[prompt.name]
        if record is None:
            path = target_output_path(targets_dir, preset, prompt.name, prompt.input_ids, new_tokens, target_dtype)
            if target is None:
                target = load_model(PRESETS[preset][0], getattr(torch, target_dtype))
            record = target_output(target, prompt.input_ids, new_tokens, min_new_tokens=new_tokens)
            save_target_output(record, path, preset=preset, prompt=prompt.name, dtype=target_dtype)
            record = load_target_output(path, prompt.input_ids)
        records.append(record)
    configs = {(size, q): RiftConfig.coerce(experiment.config(q, size)) for size in sizes for q in policies}
    # One attention backend for every policy, so that all of them can start from one recorded prefill per prompt.
    scored = next((c for c in configs.values() if c.is_scored or c.track_attention_mass), None)
    if scored is not None:
        use_rift_attention(draft, scored)
    largest_window = max(c.window for c in configs.values())
    done: dict[float, dict] = {}
    for size in sizes:
        done[size] = {}
        rows_path = Path(out_dir) / folder(size) / "rows.jsonl"
        if rows_path.exists():
            for line in rows_path.read_text().splitlines():
                row = json.loads(line)
                done[size][row["prompt"], row["policy"]] = row
    # Regimes interleaved (the first prompt of each task, then the second ...), so a partial run covers them all.
    rank = {p.name: sum(q.task == p.task for q in prompts[:i]) for i, p in enumerate(prompts)}
    for prompt in prompts:
        for (size, policy), config in configs.items():
            if (prompt.name, policy) in done[size]:
                where = str(Path(out_dir) / folder(size) / "rows.jsonl")
                check_resumable(done[size][prompt.name, policy], row_settings(config, prompt.tokens), where)
    todo = [
        (prompt, record, compression, policy)
        for prompt, record in sorted(zip(prompts, records, strict=True), key=lambda pair: rank[pair[0].name])
        for compression in sizes
        for policy in policies
        if (prompt.name, policy) not in done[compression]
    ]
    prefill, prefill_of = None, None  # one prompt's recorded prefill at a time (~100s of MB at 4K tokens)
    guide, guide_of = None, None  # a guided policy's: the target's attention at every verification, one prompt's
    for prompt, record, compression, policy in tqdm(todo, desc="replay"):
        # An uncompressed cache does not depend on the compression: its row at another compression is reused.
        same = [done[c][prompt.name, policy] for c in sizes if (prompt.name, policy) in done[c]]
        if same and not configs[compression, policy].policy_type.compresses:
            row = same[0]
        else:
            if prefill_of != prompt.name:
                prefill, prefill_of = None, prompt.name
                saved = None if prefills is None else prefill_folder(prefills, preset, prompt, draft.dtype)
                if saved is not None and (saved / "draft.safetensors").is_file():
                    prefill = load_prefill_file(saved / "draft.safetensors", draft.device)[0]
                if prefill is None or not prefill.serves(draft, largest_window):
                    prefill = capture_prefill(draft, record, largest_window)
            extra = {}
            if configs[compression, policy].is_guided:
                if guide_of != prompt.name:
                    if target is None:
                        target = load_model(PRESETS[preset][0], getattr(torch, target_dtype))
                    guide_of = prompt.name
                    guide = target_attention(target, record.sequence, record.prompt_ids.shape[1] - 1)
                extra["guide"] = guide
            tick = time.perf_counter()
            stats = replay(draft, record, configs[compression, policy], prefill=prefill, **extra)
            row = {
                **stats_row(prompt, policy, stats, record.output_ids.shape[1], configs[compression, policy]),
                "replay_seconds": time.perf_counter() - tick,
            }
        rows_path = Path(out_dir) / folder(compression) / "rows.jsonl"
        rows_path.parent.mkdir(parents=True, exist_ok=True)
        with rows_path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")
        done[compression][prompt.name, policy] = row
    results = []
    added = {compression for _, _, compression, _ in todo}
    for compression in sizes:
        run_dir = Path(out_dir) / folder(compression)
        if compression not in added and (run_dir / "compare.json").is_file():
            # Nothing new: the folder's own compare.json stands if it holds every row asked for (re-rendering it would
            # stamp its rows with this run's machine and date).
            existing = read_compare(run_dir / "compare.json")
            if {(p.name, q) for p in prompts for q in policies} <= {
                (r["prompt"], r["policy"]) for r in existing["runs"]
            }:
                results.append(existing)
                continue
        # The policies asked for, then any other one the folder already holds for every prompt (a run that continues
        # a folder with fewer policies must not drop the others from compare.json).
        held = dict.fromkeys(policy for _, policy in done[compression])
        kept = [
            *policies,
            *(q for q in held if q not in policies and all((p.name, q) in done[compression] for p in prompts)),
        ]
        runs = [done[compression][p.name, policy] for p in prompts for policy in kept]
        result = {
            "experiment": experiment.name,
            "method": "replay",
            **experiment.settings(prompts, compression),
            "prompts": len(prompts),
            "sources": describe_sources(experiment.sources),
            "dtype": f"drafter {dtype}, target {target_dtype}",
            "machine": machine(),
            "date": datetime.date.today().isoformat(),
            "summary": summarise(runs, kept),
            "runs": runs,
        }
        (run_dir / "compare.json").write_text(record_json({**result, "runs": rows_reference(runs)}))
        (run_dir / "compare.md").write_text(markdown_table(result))
        if summary_path is not None:
            update_summary(result, experiment.name, summary_path)
        results.append(result)
    return results
