"""What every experiment writes: the machine line, the resume log of `compare`, per-policy summaries through the
acceptance-length metric, and `summary.json` upkeep."""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
from collections import Counter
from pathlib import Path

import torch

import rift_hf
from rift_hf.config import RiftConfig, policy_settings
from rift_hf.policies import label_fields, policy_class

# A `compare` label that is no policy: transformers' own assisted generation with a full (DynamicCache) drafter.
TRANSFORMERS = "transformers"
METRIC = Path(rift_hf.__file__).resolve().parent / "metrics" / "acceptance_length"
# Where the lab keeps its records, relative to the repository root (commands run from there): the one place such a
# path is written (`RESULTS / "targets"` holds replay's target outputs, `RESULTS / "summary.json"` the headlines).
RESULTS = Path("benchmarks/results")
TARGETS = RESULTS / "targets"
SUMMARY = RESULTS / "summary.json"
# Where a user's runs go unless told (`python -m lab compare` / `replay`): never into the current directory's tree.
USER_HOME = Path(os.environ.get("RIFT_HF_HOME", Path.home() / ".cache" / "rift-hf"))
USER_RESULTS = USER_HOME / "results"
USER_TARGETS = USER_HOME / "targets"
SUMMARY_KEYS = ("experiment", "method", "preset", "policy", "compression", "input_tokens", "output_tokens")
# What every row written before rows named their settings (2026-12-05) ran with, where a default changed since: such a
# row is compared on these, so it is never resumed under a label that now means something else.
SETTINGS_BEFORE = {"rechoose_after": 0}
# Settings rows began to record later than others (2026-12-07), and what every row without them ran with: the drafter
# read the prompt in one forward.
ADDED_LATER = {"prompt_chunk": 0, "prompt_budget": None}


@dataclasses.dataclass(frozen=True)
class Experiment:
    """
    What a `compare` or `replay` run measures, shared by both runners and by the training recipes' evaluation: the
    model preset, the policy labels (`rift-dyn@delta=16`), the prompt set (`input_tokens`, `per_task`, `tasks`,
    `sources`, as `rift_hf.prompts.prompt_set` takes them), the drafting protocol (`gamma` drafts per round, constant
    schedule, `new_tokens` per prompt) and the fields every policy is given: `window`, `delta`, `extra` (further
    `RiftConfig` fields) and `budget_tokens` (a budget of that many tokens for every prompt instead of a share of it).
    `name` is the experiment's key in `summary.json`.
    """

    preset: str
    policies: tuple[str, ...]
    input_tokens: int
    new_tokens: int
    per_task: int
    tasks: tuple[str, ...] | None = None
    sources: object = "code"
    gamma: int = 11
    window: int = 64
    delta: int = 128
    extra: dict | None = None
    budget_tokens: int | None = None
    name: str = "main"

    def __post_init__(self):
        object.__setattr__(self, "policies", tuple(self.policies))
        if self.tasks is not None:
            object.__setattr__(self, "tasks", tuple(self.tasks))
        if self.budget_tokens is not None and (
            isinstance(self.budget_tokens, bool) or not isinstance(self.budget_tokens, int)
        ):
            raise TypeError(
                f"budget_tokens must be an int (tokens kept per layer) or None, got {self.budget_tokens!r}."
            )

    def prompts(self, tokenizer) -> list:
        from rift_hf.prompts import prompt_set

        return prompt_set(tokenizer, self.input_tokens, self.per_task, tasks=self.tasks, sources=self.sources)

    def config(self, policy: str, compression: float | None) -> dict:
        """`policy`'s RiftConfig fields: its budget is `budget_tokens`, or else `1 / compression` of the prompt."""
        budget = self.budget_tokens if self.budget_tokens is not None else 1.0 / compression
        return policy_config(policy, budget, self.window, self.delta, self.extra)

    def settings(self, prompts, compression: float | None) -> dict:
        """The fields every record of this experiment carries (the regimes as the prompts name them)."""
        return {
            "preset": self.preset,
            "compression": compression if self.budget_tokens is None else None,
            "budget_tokens": self.budget_tokens,
            "extra": self.extra or {},
            "gamma": self.gamma,
            "window": self.window,
            "delta": self.delta,
            "input_tokens": self.input_tokens,
            "new_tokens": self.new_tokens,
            "tasks": list(dict.fromkeys(p.task for p in prompts)),
        }


def stats_row(prompt, policy: str, stats, output_tokens: int, config: dict | RiftConfig) -> dict:
    """One prompt's record of a policy run with `config`, from the run's `RiftStats`, as both runners write it
    (`compare` adds its timings and lossless checks, replay its own seconds)."""
    return {
        "prompt": prompt.name,
        "task": prompt.task,
        "policy": policy,
        "settings": row_settings(config, prompt.tokens),
        "input_tokens": prompt.tokens,
        "output_tokens": output_tokens,
        "budget": stats.budget,
        "al": stats.acceptance_length,
        "rounds": len(stats.rounds),
        "accepted": [r["accepted"] for r in stats.rounds],
        "rescorings": len(stats.rescorings),
        "rescoring_events": stats.rescorings,
        "attention_mass": stats.attention_mass,
        "peak_kv_bytes": stats.peak_kv_bytes,
        "peak_store_bytes": stats.peak_store_bytes,
    }


def row_settings(config: dict | RiftConfig, prompt_tokens: int) -> dict:
    """
    What a row records of the policy that ran a prompt of `prompt_tokens` tokens: its name (`auto` resolved), every
    field it reads and the dtypes it keeps rows in, defaults included, so a row says what it measured after a default
    has changed.
    """
    fitted = RiftConfig.coerce(config).fitted(prompt_tokens)
    fields = sorted(policy_class(fitted.policy).params) + ["store_dtype", "kv_dtype", *ADDED_LATER]
    settings = {"policy": fitted.policy, **{name: getattr(fitted, name) for name in fields}}
    policy = policy_class(fitted.policy)
    # The chunk in effect (a default of None means 1024 or 0); none where the prompt is read whole all the same.
    settings["prompt_chunk"] = fitted.reading_chunk if policy.compresses and not policy.retrieves else 0
    return settings


def check_resumable(row: dict, settings: dict, where: str) -> None:
    """Raise if a row read back to resume a run was written with other settings than its label has now."""
    named = label_fields(row["policy"])  # a field the label names was set, whatever the default was then
    held = row.get("settings", {k: v for k, v in SETTINGS_BEFORE.items() if k not in named})
    held = {**{k: v for k, v in ADDED_LATER.items() if k not in named}, **held}
    differ = sorted(k for k in held.keys() & settings.keys() if held[k] != settings[k])
    if differ:
        then = ", ".join(f"{k}={held[k]!r}" for k in differ)
        now = ", ".join(f"{k}={settings[k]!r}" for k in differ)
        label = row["policy"] + ("," if "@" in row["policy"] else "@")
        raise ValueError(
            f"{where} holds {row['policy']!r} on {row['prompt']} written with {then}, and the label now means {now} (a "
            f"default changed). Name the setting in the label (`{label}{differ[0]}={settings[differ[0]]}` measures the "
            "new one beside the old rows), or pass another --out."
        )


def record_json(record) -> str:
    """A record as JSON text that stays small and diffs by line: one top-level key per line, a list of dicts one
    item per line (a list of dicts alone: one per line), every value compact (a per-prompt row of `compare.json` is one
    line, as in `rows.jsonl`)."""
    if isinstance(record, list) and all(isinstance(item, dict) for item in record):
        return "[\n" + ",\n".join(f"  {json.dumps(item)}" for item in record) + "\n]\n"
    if not isinstance(record, dict):
        return json.dumps(record) + "\n"
    lines = []
    for key, value in record.items():
        if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
            items = ",\n".join(f"    {json.dumps(item)}" for item in value)
            lines.append(f"  {json.dumps(key)}: [\n{items}\n  ]")
        else:
            lines.append(f"  {json.dumps(key)}: {json.dumps(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def rows_reference(runs: list[dict]) -> dict:
    """What a replay folder's `compare.json` keeps in place of its per-prompt rows, which are already in the
    `rows.jsonl` beside it (the resume log): the prompts and policies, in order, and each row's retention as
    `summarise` gave it (`read_compare` reads them back)."""
    prompts, policies = list(dict.fromkeys(r["prompt"] for r in runs)), list(dict.fromkeys(r["policy"] for r in runs))
    if [(r["prompt"], r["policy"]) for r in runs] != [(p, q) for p in prompts for q in policies]:
        raise ValueError("A replay's rows must hold every policy for every prompt, prompt by prompt.")
    retention = [r.get("retention") for r in runs]
    return {"rows": "rows.jsonl", "prompts": prompts, "policies": policies, "retention": retention}


def read_compare(path: Path) -> dict:
    """A `compare.json` with its per-prompt rows in `runs`: a replay folder's are read from its `rows.jsonl` (the last
    row written for each prompt and policy, as a resumed run takes it), in the order its `runs` reference names."""
    result = json.loads(Path(path).read_text())
    ref = result.get("runs")
    if isinstance(ref, dict):
        rows_path = Path(path).parent / ref["rows"]
        rows = {(r["prompt"], r["policy"]): r for r in map(json.loads, rows_path.read_text().splitlines())}
        keys = [(prompt, policy) for prompt in ref["prompts"] for policy in ref["policies"]]
        result["runs"] = [{**rows[key], "retention": ratio} for key, ratio in zip(keys, ref["retention"], strict=True)]
    return result


def write_record(out: Path, name: str, record: dict, table: str) -> None:
    """A benchmark's record as `<out>/<name>.json` and its table as `<out>/<name>.md` (the folder made first); prints
    the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / f"{name}.md").write_text(table)
    print(table)


def machine() -> str:
    """The accelerator's name, or the CPU's: architecture, model, widest matrix instructions, threads. Machines of one
    name differ (an AVX2 AMD CPU and an AMX Xeon ran this project's CPU figures), so records say which one ran."""
    if torch.cuda.is_available():
        return torch.cuda.get_device_name()
    return f"{platform.machine()}, {cpu_name()}, {torch.get_num_threads()} threads (CPU)"


def cpu_name() -> str:
    """The CPU's model name with its widest matrix instructions (AMX, AVX-512, AVX2) on Linux, else what `platform`
    knows."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or "unknown CPU"
    first = info.split("\n\n", 1)[0].splitlines()  # the first processor's fields
    fields = {key.strip(): value.strip() for key, _, value in (line.partition(":") for line in first)}
    name = " ".join(fields.get("model name", "unknown CPU").split())
    flags = set(fields.get("flags", "").split())
    widest = next((label for flag, label in (("amx_bf16", "AMX"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))
                   if flag in flags), None)  # fmt: skip
    return f"{name} ({widest})" if widest else name


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
        from rift_hf.replay import prompt_digest

        row = self.rows.get((prompt.name, label))
        return row if row is not None and row.get("prompt_sha") == prompt_digest(prompt.input_ids) else None

    def output(self, prompt, row: dict) -> torch.Tensor:
        """The whole sequence (prompt + new tokens) a logged row generated."""
        new = torch.tensor([row["new_ids"]], dtype=prompt.input_ids.dtype)
        return torch.cat([prompt.input_ids.cpu(), new], dim=1)

    def add(self, prompt, record: dict, output: torch.Tensor) -> None:
        from rift_hf.replay import prompt_digest

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
                    "al": column_mean(rows, "al"),
                    **dict.fromkeys(("retention", "retention_mean", "retention_min", "retention_max")),
                    "draft_ms_per_token": None,
                    "rescore_share": None,
                    "tokens_per_s": column_mean(rows, "tokens_per_s"),
                    "speedup": column_mean(rows, "speedup"),
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
                "draft_ms_per_token": column_mean(rows, "draft_ms_per_token"),
                "rescore_share": column_mean(rows, "rescore_share"),
                "tokens_per_s": column_mean(rows, "tokens_per_s"),
                "speedup": column_mean(rows, "speedup"),
                # None where nothing was generated (replay): there is no output to compare.
                "lossless": None
                if all("same_as_full_drafter" not in r for r in rows)
                else all(r.get("same_as_full_drafter") in (True, None) for r in rows),
            }
        )
    return summary


def policy_config(label: str, budget, window: int, delta: int, extra: dict | None) -> dict:
    """`rift-dyn@delta=16` -> `{"policy": "rift-dyn", ..., "delta": 16}` (values parsed as JSON where possible).
    Measurements draft a fixed length (`draft_length="fixed"`, as acceptance is measured); `@draft_length=auto` asks
    for the cost-aware length of the default settings."""
    overrides = label_fields(label)
    # The run's window, delta and extra fields go to the policies that read them (the others refuse a field they
    # ignore); a label's own overrides go as written.
    shared = {"budget": budget, "window": window, "delta": delta, "draft_length": "fixed", **(extra or {})}
    return {**policy_settings(overrides["policy"], shared), **overrides}


def column_mean(rows: list[dict], key: str, scale: float = 1.0):
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
            "rescorings": column_mean(rows, "rescorings"),
            "peak_kv_mib": column_mean(rows, "peak_kv_bytes", 2**20),
            "peak_store_mib": column_mean(rows, "peak_store_bytes", 2**20),
            "speedup": column_mean(rows, "speedup"),
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
    path.write_text(record_json(records))


def rebuild_summary(path: Path) -> list[dict]:
    """Re-derive every record of `summary.json` from the `compare.json` files under its folder (order kept)."""
    for result_path in sorted(path.parent.rglob("compare.json")):
        result = read_compare(result_path)
        update_summary(result, result.get("experiment", "main"), path)
    return json.loads(path.read_text())
