"""The benchmark issue's experiments E1-E5, each a set of `python -m lab compare` runs recorded in `summary.json`.

    python -m benchmarks.experiments E1 E2 --preset qwen-coder            # the issue's sizes (CPU-hours here)
    python -m benchmarks.experiments all --scale small     # 1/4 of the lengths, 1 prompt/regime (~75 min, 2 cores)
    python -m benchmarks.experiments E1 --sources prose    # Shakespeare and KJV prompts, recorded as E1-prose
    python -m benchmarks.experiments E4 E5 --method replay  # AL by exact replay (python -m lab replay), no target runs
    python -m benchmarks.experiments all --preset tiny-random --scale tiny  # seconds; CI runs this so it cannot rot

E1 retention at 4x and 8x, every policy; E2 staleness (AL and attention-mass share over generation) for snapkv,
swa, rift-stat, rift-dyn; E3 input-length sweep at a fixed token budget (stat vs dyn, drafter ms/token); E4 the
rift-dyn Δ sweep with measured rescoring share; E5 rift-ada with thresholds calibrated on separate prompts from
rift-dyn (Δ = 16) rescorings, against rift-dyn. Results go to `benchmarks/results/<experiment>/<preset>/...` and records
(upserted by key) to `benchmarks/results/summary.json`. One process shares its generations between experiments
(the target alone, `full`, and any policy run with an unchanged config are generated once), so `all` costs less than
the experiments run one by one. Δ values above the output length are left out of E4 (they never rescore), and E3
generates half the output length at each input length.

`--method replay` measures AL by exact replay against cached target outputs (`rift_hf.replay`, the same AL as real
assisted runs at a fraction of the cost) into `replay-<run>-<input>in-<new>tok-<n>per-task` folders; its records carry
no timing (take that from `python -m benchmarks.step`). A replay folder resumes where a killed run stopped, and rows
copied in from another replay folder with the same prompts and settings are reused. E3 by replay keeps its budget in
tokens (`replay_compare(budget_tokens=...)`): one `replay-fixed-budget-<input>in-...` folder per input length, rows
under `<budget>tok/`; a target output cached for a longer run is cut to the length asked.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from lab.compare import compare
from lab.records import Experiment, policy_config
from rift_hf import POLICIES, RiftConfig, calibrate_thresholds

RESULTS = Path("benchmarks/results")
# The keyword arguments of a `run(...)` below that describe the experiment (the rest go to `compare` itself).
EXPERIMENT_FIELDS = ("input_tokens", "new_tokens", "per_task", "tasks", "sources", "gamma", "window", "delta", "extra",
                     "budget_tokens")  # fmt: skip
SCALES = {  # input tokens, new tokens, prompts per regime
    "paper": (4096, 512, 8),
    "small": (1024, 128, 1),
    "tiny": (96, 24, 1),
}


def al_gain(run: dict, position: int, rounds: int = 4) -> float | None:
    """Mean AL of the `rounds` rounds after `position` minus the `rounds` before it (None if either side is empty)."""
    done, before, after = run["input_tokens"], [], []
    for accepted in run["accepted"]:
        (before if done < position else after).append(accepted + 1)
        done += accepted + 1
    if not before or not after:
        return None
    return statistics.mean(after[:rounds]) - statistics.mean(before[-rounds:])


def calibration_events(result: dict) -> list[dict]:
    """Signals just before every rescoring of the rift-dyn runs, with the AL gain that rescoring bought."""
    events = []
    for run in result["runs"]:
        for event in run.get("rescoring_events", []):
            signals = event.get("signals") or {}
            events.append({**signals, "gain": al_gain(run, event["position"])})
    return events


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiments", nargs="+", help="E1 ... E5, or all")
    parser.add_argument("--preset", default="qwen-coder")
    parser.add_argument("--scale", choices=SCALES, default="paper")
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument(
        "--sources", choices=("code", "prose"), default="code", help="prompt texts: stdlib source or Shakespeare + KJV"
    )
    parser.add_argument("--new-tokens", type=int, help="override the scale's output length (e.g. a longer E2)")
    parser.add_argument("--input-tokens", type=int, help="override the scale's input length (e.g. a 4K probe on CPU)")
    parser.add_argument("--policies", help="E1 only: a comma-separated subset of the policies (default: all)")
    parser.add_argument("--prompts-per-task", type=int, help="override the scale's prompts per task (regime)")
    parser.add_argument("--compressions", default="4,8", help="E1 only: comma-separated compression ratios")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--method",
        choices=("generate", "replay"),
        default="generate",
        help="generate: real assisted runs (AL and time); replay: AL by exact replay (drafter fp32, no timing)",
    )
    parser.add_argument(
        "--target-dtype",
        choices=("bfloat16", "float32"),
        default="bfloat16",
        help="replay: dtype of the target outputs (computed once into <out>/targets, then reused)",
    )
    args = parser.parse_args(argv)
    names = ["E1", "E4", "E5", "E2", "E3"] if args.experiments == ["all"] else args.experiments
    e1_policies = args.policies.split(",") if args.policies else list(POLICIES)
    for label in e1_policies:  # a label may carry overrides: rift-dyn@delta=16
        if label.partition("@")[0] not in POLICIES:
            raise ValueError(f"--policies: unknown policy {label!r}; choose from {', '.join(POLICIES)}.")
    if args.method == "replay":
        from lab.replay_runs import replay_models

        models = replay_models(args.preset)
    else:
        from rift_hf.models import load_preset

        models = load_preset(args.preset)
    tokens, new, per_task = SCALES[args.scale]
    new = args.new_tokens or new
    tokens = args.input_tokens or tokens
    per_task = args.prompts_per_task or per_task
    overrides = (
        (f"-{tokens}in" if args.input_tokens else "")
        + (f"-{new}tok" if args.new_tokens else "")
        + (f"-{per_task}per-task" if args.prompts_per_task else "")
    )
    window = min(args.window, tokens // 16)
    common = dict(
        gamma=11,
        window=window,
        delta=128,
        dtype="float32" if args.preset == "tiny-random" else "bfloat16",
        models=models,
        reuse={},
        sources=args.sources,
    )

    suffix = "" if args.sources == "code" else f"-{args.sources}"
    scale = f"{tokens}in-{new}tok-{per_task}per-task"  # in the names of replay folders

    def run(name, tag, policies, **kwargs):
        label = name + suffix
        if args.method == "replay":
            return run_replay(label, tag, policies, **kwargs)
        options = {
            "compression": 4.0,
            "input_tokens": tokens,
            "new_tokens": new,
            "per_task": per_task,
            **common,
            **kwargs,
        }
        described = {name: options.pop(name) for name in EXPERIMENT_FIELDS if name in options}
        return compare(
            Experiment(args.preset, policies, name=label, **described),
            options.pop("compression"),
            args.out / label / args.preset / (tag + overrides),
            options.pop("dtype"),
            summary_path=args.out / "summary.json",
            **options,
        )

    def run_replay(
        label,
        tag,
        policies,
        compressions=(4.0,),
        tasks=("repeat", "continue"),
        extra=None,
        input_tokens=None,
        new_tokens=None,
        budget_tokens=None,
        sources=None,
    ):
        from lab.replay_runs import replay_compare

        length, out_tokens = input_tokens or tokens, new_tokens or new
        folder = "-".join(filter(None, ("replay", tag, f"{length}in-{out_tokens}tok-{per_task}per-task")))
        experiment = Experiment(
            args.preset,
            policies,
            length,
            out_tokens,
            per_task,
            tasks=tasks,
            sources=sources or args.sources,
            gamma=common["gamma"],
            window=window,
            delta=common["delta"],
            extra=extra,
            budget_tokens=budget_tokens,
            name=label,
        )
        results = replay_compare(
            experiment,
            compressions,
            args.out / label / args.preset / folder,
            target_dtype="float32" if args.preset == "tiny-random" else args.target_dtype,
            targets_dir=args.out / "targets",
            summary_path=args.out / "summary.json",
            models=models,
        )
        return results[0]

    for name in names:
        if name == "E1":
            compressions = [float(c) for c in args.compressions.split(",")]
            if args.method == "replay":  # one folder, a subfolder per compression, one shared prefill per prompt
                run_replay("E1" + suffix, "", e1_policies, compressions=compressions)
            else:
                for compression in compressions:
                    run("E1", f"{compression:g}x", e1_policies, compression=compression)
        elif name == "E2":
            run(
                "E2",
                "staleness",
                ["full", "snapkv", "swa", "rift-stat", "rift-dyn"],
                extra={"track_attention_mass": True},
            )
        elif name == "E3":
            for length in (tokens // 4, tokens // 2, tokens, tokens * 2):
                sizes = dict(input_tokens=length, new_tokens=new // 2, budget_tokens=max(tokens // 8, 2 * window))
                if args.method == "replay":  # replay-fixed-budget-<length>in-.../<budget>tok/
                    # Beyond the scale's length the default code set holds whole, shorter files: the long modules
                    # give every prompt the length asked for (the prompts of E1 at ~8K).
                    long = "code-long" if args.sources == "code" and length > tokens else None
                    run_replay("E3" + suffix, "fixed-budget", ["full", "rift-stat", "rift-dyn"], **sizes, sources=long)
                else:
                    run("E3", f"input-{length}", ["full", "rift-stat", "rift-dyn"], **sizes)
        elif name == "E4":
            deltas = [d for d in (16, 32, 64, 128, 256, 512, 1024) if d <= new]
            run("E4", "delta-sweep", ["full"] + [f"rift-dyn@delta={d}" for d in deltas])
        elif name == "E5":
            calibration = run("E5", "calibration", ["full", "rift-dyn@delta=16"], tasks=("continue",))
            thresholds = calibrate_thresholds(calibration_events(calibration), min_events=2)
            # By replay, beside its folders: a replay run does not overwrite the thresholds of a generated one.
            file = "thresholds.json" if args.method == "generate" else f"thresholds-replay-{scale}.json"
            (args.out / f"E5{suffix}" / args.preset).mkdir(parents=True, exist_ok=True)
            (args.out / f"E5{suffix}" / args.preset / file).write_text(json.dumps(thresholds, indent=2) + "\n")
            ada = "rift-ada@" + ",".join(f"{k}={json.dumps(v)}" for k, v in thresholds.items() if v is not None)
            RiftConfig(**policy_config(ada, 0.25, window, 128, None))  # a bad label fails now, not after the run
            run("E5", "ada-vs-dyn", ["full", "rift-dyn", ada.rstrip("@")], tasks=("repeat",))
        else:
            parser.error(f"unknown experiment {name!r}; choose from E1 ... E5 or all")


if __name__ == "__main__":
    main()
