"""Markdown tables of experiment results (summary.json, replay rows, step costs) and the README block writer."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from tabulate import tabulate

from lab.records import column_mean, staleness
from rift_hf.prompts import TASKS


def pipe_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table; cells are shown as given (already formatted strings stay as they are)."""
    return tabulate([[str(c) for c in row] for row in rows], headers=headers, tablefmt="github", disable_numparse=True)


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


def task_cell(row: dict) -> str:
    """
    The cell a replay row falls in by its prompt's own task, pooled over families: a broad prompt
    (`<split>:<task>:<source>`, reported under `<family>/<regime>`) and a prompt named `<task>:<source>` go to
    `<task>` (`summarize` apart from `continue`); a name without a known task keeps the row's cell.
    """
    return next((field for field in row["prompt"].split(":") if field in TASKS), row["task"])


def regime_rows(
    run_dir: Path, policies: list[str] | None = None, common: bool = False, by_task: bool = False
) -> list[dict]:
    """
    Per compression (`<run_dir>/<c>x/rows.jsonl`, or a fixed budget: `<N>tok/rows.jsonl`), policy and regime (task)
    of a replay run: the per-prompt retention (AL over the same prompt's `full` AL) over the prompts that have both
    rows, as mean, min, median and max, with the mean input length, AL, peak working-set (KV) bytes and peak store
    bytes. Policies in the order first written (only `policies`, when given), compressions ascending. With `common`,
    only the prompts that have a row for every policy shown at that compression count (a run still in progress,
    compared like with like). With `by_task`, cells are the prompts' own tasks (`task_cell`: summarise apart from
    continue) instead of their regimes.
    """
    out = []
    for size, rows in _replay_rows(run_dir):
        if by_task:
            rows = [{**r, "task": task_cell(r)} for r in rows]
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
                        "input_tokens": column_mean(mine, "input_tokens"),
                        "retention": statistics.mean(ratios),
                        "retention_min": min(ratios),
                        "retention_median": statistics.median(ratios),
                        "retention_max": max(ratios),
                        "per_prompt": ratios,
                        "al": statistics.mean(r["al"] for r in mine),
                        "full_al": statistics.mean(full[r["prompt"]] for r in mine),
                        "peak_store_mib": column_mean(mine, "peak_store_bytes", 2**20),
                        "peak_kv_mib": column_mean(mine, "peak_kv_bytes", 2**20),
                    }
                )
    return out


def regime_table(run_dir: Path, policies: list[str] | None = None, common: bool = False, by_task: bool = False) -> str:
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
        for r in regime_rows(run_dir, policies, common, by_task)
    ]
    return pipe_table(headers, rows) + "\n"


def regime_wide_table(
    run_dirs: Path | list[Path], policies: list[str] | None = None, common: bool = False, by_task: bool = False
) -> str:
    """`regime_rows` as one row per policy and one column per compression and regime: mean retention, per-prompt
    range and prompt count. Several replay folders (E3's input lengths) go side by side, each column headed by its
    mean input length."""
    dirs = [run_dirs] if isinstance(run_dirs, (str, Path)) else list(run_dirs)
    cells, columns = {}, {}
    for run_dir in dirs:
        rows = regime_rows(run_dir, policies, common, by_task)
        inputs = column_mean(rows, "input_tokens")
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
    from lab.plots import al_by_position

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
