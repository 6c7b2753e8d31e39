"""`python -m lab compare`: policies side by side on a real model preset, by real generation (speed and AL)."""

from __future__ import annotations

import datetime
import json
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

import rift_hf
from lab.records import (
    TRANSFORMERS,
    Experiment,
    RunLog,
    check_resumable,
    machine,
    record_json,
    row_settings,
    stats_row,
    summarise,
    update_summary,
)
from lab.tables import markdown_table

LINEARS = ("torch", "weight-major")  # how small-batch linear layers are computed (`compare --linear`)
DEFAULT_POLICIES = ("full", "swa", "snapkv", "rift-stat", "rift-dyn", "page-retrieval", "page-round")


def _timed_generate(model, ids, **kwargs):
    ids = ids.to(model.device)
    tick = time.perf_counter()
    with torch.no_grad():
        out = model.generate(ids, do_sample=False, **kwargs)
    if out.device.type == "cuda":
        torch.cuda.synchronize(out.device)
    return out, time.perf_counter() - tick


def compare(
    experiment: Experiment,
    compression: float,
    out_dir: Path,
    dtype: str = "bfloat16",  # or "auto" (`rift_hf.models.resolve_dtype`; the CLI's default)
    *,
    models: tuple | None = None,
    summary_path: Path | None = None,
    reuse: dict | None = None,
    resume: bool = False,
    targets_dir: Path | None = None,
    linear: str = "torch",
) -> dict:
    """
    Run the experiment's policies side by side on the same prompts, by real generation; returns (and writes) the
    records.

    A policy may carry a label after `@` with `key=value` overrides, e.g. `rift-dyn@delta=16` (E4's Δ sweep);
    the experiment's `extra` holds `RiftConfig` fields for every policy (e.g. `track_attention_mass`, ada thresholds);
    its `budget_tokens` fixes the budget in tokens instead of `1/compression` of the prompt; `models` reuses loaded
    `(target, draft, tokenizer)`; `reuse`, a dict shared between calls, keeps every generation by (prompt, length,
    config) so a later call with the same run (the target alone, `full`, an unchanged policy) reads it back instead of
    generating again (`full` ignores budget and Δ). Every generation is also appended to `<out_dir>/runs.jsonl` as it
    finishes (with its new token ids); with `resume`, a run of the same setting reads those back, so a killed run
    continues where it stopped and a later run can add policies or prompts (without it the log starts afresh). With
    `targets_dir`, the target's own output of each prompt is also saved where `python -m lab replay` looks for it.
    `linear="weight-major"` computes both models' small-batch linear layers as `weight @ x.T` on a CPU
    (`rift_hf.speedups.weight_major_linear`; recorded in the settings). Replay's target outputs must come from torch's
    own linear layers, so `targets_dir` with it is a ValueError.
    """
    from rift_hf.models import fix_draft_length, load_preset, resolve_dtype
    from rift_hf.prompts import describe_sources

    if linear not in LINEARS:
        raise ValueError(f"linear must be one of {', '.join(LINEARS)}, got {linear!r}.")
    if linear != "torch" and targets_dir is not None:
        raise ValueError(
            f"targets_dir saves target outputs for replay, which must come from torch's own linear layers, but "
            f"linear={linear!r}: pass targets_dir=None, or linear='torch' to save them."
        )
    preset, policies = experiment.preset, experiment.policies
    new_tokens, gamma = experiment.new_tokens, experiment.gamma
    target, draft, tokenizer = models if models is not None else load_preset(preset, dtype=resolve_dtype(dtype))
    dtype = str(draft.dtype).removeprefix("torch.")  # what the records say: the dtype the models ran in
    if linear == "weight-major":
        from rift_hf.speedups import weight_major_linear

        weight_major_linear(target)
        weight_major_linear(draft)
    fix_draft_length(target, draft, gamma=gamma)
    prompts = experiment.prompts(tokenizer)
    settings = {
        **experiment.settings(prompts, compression),
        "dtype": dtype,
        "machine": machine(),
        **({"linear": linear} if linear != "torch" else {}),
    }
    log = RunLog(out_dir / "runs.jsonl", settings, resume=resume)
    runs = []
    gen = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens}
    if prompts and any(log.get(p, "target") is None for p in prompts):
        # One untimed call of every setting first, so that no setting absorbs the process's cold start.
        warm = prompts[0].input_ids[:, :64]
        for policy in ["target", *policies]:
            _run(policy, experiment, compression, target, draft, warm, {"max_new_tokens": 2, "min_new_tokens": 2})
    steps = len(prompts) * (len(policies) + 1)
    with tqdm(total=steps, desc="compare") as bar:
        for index, prompt in enumerate(prompts):
            prompt_key = (prompt.input_ids.cpu().numpy().tobytes(), new_tokens, gamma)
            # Settings take turns: the target alone first on one prompt, last on the next (A B C, C B A).
            order = ["target", *policies] if index % 2 == 0 else [*policies[::-1], "target"]
            done = {}  # setting -> (row, output), this prompt's
            for policy in order:
                bar.set_postfix_str(f"{prompt.name} {policy}")
                logged = log.get(prompt, policy)
                if logged is not None and policy not in ("target", TRANSFORMERS):
                    check_resumable(logged, row_settings(experiment.config(policy, compression), prompt.tokens),
                                    str(log.path))  # fmt: skip
                if logged is not None:
                    run = {k: v for k, v in logged.items() if k not in ("new_ids", "prompt_sha")}
                    done[policy] = run, log.output(prompt, logged)
                else:
                    memo = (prompt_key, "target") if policy == "target" else None
                    if policy not in ("target", TRANSFORMERS):
                        config = experiment.config(policy, compression)
                        same = {"policy": "full"} if config["policy"] == "full" else config
                        memo = (prompt_key, json.dumps(same, sort_keys=True))
                    run, out = _run(policy, experiment, compression, target, draft, prompt, gen, reuse, memo)
                    done[policy] = run, out
                    log.add(prompt, run, out)
                bar.update()
            plain_run, plain = done.pop("target")
            if targets_dir is not None:
                seconds = plain_run["seconds"]
                _save_target_output(targets_dir, preset, target, prompt, plain, seconds, new_tokens, dtype)
            full_output = done["full"][1] if "full" in done else None
            for policy in policies:  # in the policies' order, whatever order they ran in
                run, out = done[policy]
                run["same_as_target"] = bool(torch.equal(out, plain))
                if "seconds" in run:
                    run["speedup"] = plain_run["seconds"] / run.pop("seconds")
                if policy not in ("full", TRANSFORMERS):
                    run["same_as_full_drafter"] = None if full_output is None else bool(torch.equal(out, full_output))
                runs.append(run)
    summary = summarise(runs, policies)
    result = {
        "experiment": experiment.name,
        **settings,
        "prompts": len(prompts),
        "sources": describe_sources(experiment.sources),
        "date": datetime.date.today().isoformat(),
        "rift_hf": rift_hf.__version__,
        "summary": summary,
        "runs": runs,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "compare.json").write_text(record_json(result))
    update_summary(result, experiment.name, summary_path or out_dir / "summary.json")
    from lab.plots import plot_compare

    plot_compare(result, out_dir / "compare.png")
    table = markdown_table(result)
    (out_dir / "compare.md").write_text(table)
    return result


def _run(policy, experiment, compression, target, draft, prompt, gen, memo=None, key=None) -> tuple[dict, torch.Tensor]:
    """One generation of `policy` (`target`: the target alone; `transformers`: its own assisted generation, the
    drafter on a `DynamicCache`; else a rift policy) on `prompt` (a `Prompt`, or token ids for a warm-up), as the row
    `compare` records (its `seconds` become the `speedup` once the target alone's are known) and the output."""
    ids = prompt if isinstance(prompt, torch.Tensor) else prompt.input_ids
    if policy == "target":
        out, seconds, _ = _generate(memo, key, target, ids, **gen)
        return {"prompt": getattr(prompt, "name", ""), "policy": "target", "seconds": seconds}, out.cpu()
    if policy == TRANSFORMERS:
        forwards = []
        handle = target.register_forward_pre_hook(lambda *_: forwards.append(1))
        try:
            out, seconds = _timed_generate(target, ids, assistant_model=draft, **gen)
        finally:
            handle.remove()
        new = out.shape[1] - ids.shape[1]
        row = {"prompt": getattr(prompt, "name", ""), "task": getattr(prompt, "task", ""), "policy": TRANSFORMERS,
               "input_tokens": ids.shape[1], "output_tokens": new, "al": new / len(forwards), "rounds": len(forwards),
               "tokens_per_s": new / seconds, "seconds": seconds}  # fmt: skip
        return row, out.cpu()
    config = experiment.config(policy, compression)
    out, seconds, stats = _generate(
        memo, key, target, ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen
    )
    out = out.cpu()
    if isinstance(prompt, torch.Tensor):  # a warm-up: nothing recorded
        return {}, out
    output_tokens = out.shape[1] - prompt.tokens
    row = {
        **stats_row(prompt, policy, stats, output_tokens, config),
        # Decode rounds only: the first round also holds the drafter's prefill.
        "draft_ms_per_token": stats.decode_ms_per_draft_token,
        "rescore_share": stats.rescore_seconds / stats.draft_seconds if stats.draft_seconds else 0.0,
        "tokens_per_s": output_tokens / seconds,
        "seconds": seconds,
    }
    return row, out


def _save_target_output(root: Path, preset: str, target, prompt, plain, seconds: float, new_tokens: int, dtype: str):
    """The target-alone generation of `compare` (greedy, `new_tokens` forced) as replay's cached target output."""
    from rift_hf.replay import TargetOutput, _eos_ids, save_target_output, target_output_path

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
        save_target_output(record, path, preset=preset, prompt=prompt.name, dtype=dtype, by="python -m lab compare")


def _generate(memo: dict | None, key, model, ids, **kwargs):
    """`_timed_generate` plus the run's `RiftStats`, kept in `memo` under `key` (and read back from it) when given."""
    if memo is not None and key in memo:
        return memo[key]
    out, seconds = _timed_generate(model, ids, **kwargs)
    result = out, seconds, rift_hf.last_stats(model) if "assistant_model" in kwargs else None
    if memo is not None:
        memo[key] = result
    return result
