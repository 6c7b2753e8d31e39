"""Replay a sample of committed replay rows again and check they come out the same: the behaviour check for a change
to the cache, the policies or replay itself (a refactor must leave every accepted count as it was).

    python -m benchmarks.replay_check benchmarks/results/E1/qwen-coder/replay-4096in-512tok-8per-task/4x \
        --per-task 1 --policies full,swa,snapkv,rift-stat,rift-dyn,page-retrieval,page-round@pages_ahead=2 \
        --out benchmarks/results/replay_check-4096in.json

The folder's `compare.json` gives the setting (preset, prompt set, drafting protocol, compression, dtypes); the first
`--per-task` prompts of each task are replayed (only those whose target output is cached) into a scratch folder, and
each (prompt, policy) row, the full cache's included, is compared with the committed one: per-round accepted counts,
rescorings and AL exactly.
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
from pathlib import Path

from lab.cli import split_labels
from lab.records import ADDED_LATER, TARGETS, Experiment, machine
from lab.replay_runs import replay_compare

COMPARED = ("rounds", "accepted", "rescorings", "al", "output_tokens")


def check(folder: Path, policies: list[str], per_task: int, targets: Path = TARGETS) -> dict:
    setting = json.loads((folder / "compare.json").read_text())
    policies = ["full", *(p for p in policies if p != "full")]  # retention is relative to the full cache's rows
    committed = {
        (r["prompt"], r["policy"]): r for r in map(json.loads, (folder / "rows.jsonl").read_text().splitlines())
    }
    unknown = sorted({p for p in policies} - {policy for _, policy in committed})
    if unknown:
        raise SystemExit(f"{folder} holds no rows for {', '.join(unknown)}; pick among its policies.")
    experiment = Experiment(
        preset=setting["preset"], policies=tuple(policies), input_tokens=setting["input_tokens"],
        new_tokens=setting["new_tokens"], per_task=per_task, tasks=setting.get("tasks"), sources=setting["sources"],
        gamma=setting["gamma"], window=setting["window"], delta=setting["delta"], extra=_extra(setting, committed),
        budget_tokens=setting.get("budget_tokens"), name="replay-check",
    )  # fmt: skip
    drafter, target = (part.split()[1] for part in setting["dtype"].split(", "))
    with tempfile.TemporaryDirectory() as scratch:
        result = replay_compare(
            experiment,
            [setting["compression"]],
            Path(scratch),
            dtype=drafter,
            target_dtype=target,
            targets_dir=targets,
            cached_only=True,
        )[0]
    rows = []
    for run in result["runs"]:
        before = committed.get((run["prompt"], run["policy"]))
        differs = [k for k in COMPARED if before is None or before[k] != run[k]]
        rows.append({"prompt": run["prompt"], "policy": run["policy"], "al": run["al"], "differs": differs})
    return {
        "folder": str(folder),
        "date": datetime.date.today().isoformat(),
        "machine": machine(),
        "compared": list(COMPARED),
        "same": sum(not r["differs"] for r in rows),
        "rows": rows,
    }


def _extra(setting: dict, committed: dict) -> dict | None:
    """The fields every policy ran with: the folder's own, and what rows written before a default changed ran with
    (`ADDED_LATER`: the prompt read in one forward) unless their settings say otherwise."""
    extra = dict(setting.get("extra") or {})
    rows = list(committed.values())
    for name, before in ADDED_LATER.items():
        if name not in extra and not any(name in r.get("settings", {}) for r in rows):
            extra[name] = before
    return {k: v for k, v in extra.items() if v is not None} or None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path, help="a replay folder holding compare.json and rows.jsonl")
    parser.add_argument("--policies", required=True, help="comma-separated policy labels held by the folder")
    parser.add_argument("--per-task", type=int, default=1)
    parser.add_argument("--targets", type=Path, default=TARGETS, help="where the target outputs are cached")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    report = check(args.folder, split_labels(args.policies), args.per_task, args.targets)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{report['same']} of {len(report['rows'])} rows replay identically")
    for row in report["rows"]:
        if row["differs"]:
            print(f"  {row['prompt']} {row['policy']}: differs in {', '.join(row['differs'])}")
    if report["same"] != len(report["rows"]):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
