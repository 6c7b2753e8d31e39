"""`python -m lab table`: a `compare.json`, a replay run's rows or folders as markdown (retention per regime, staleness,
estimated speed), with plots and README blocks (`lab.tables`, `.plots`)."""

from __future__ import annotations

import json
from pathlib import Path

from lab.cli.arguments import policy_labels
from lab.records import read_compare
from lab.tables import (
    estimate_table,
    markdown_table,
    regime_rows,
    regime_table,
    regime_wide_table,
    rows_table,
    speedup_by_regime_table,
    staleness_rows,
    staleness_table,
    write_into_readme,
)

HELP = "render a compare.json or a replay rows.jsonl as markdown (and into a README)"


def add_arguments(parser) -> None:
    parser.add_argument(
        "result",
        type=Path,
        nargs="+",
        help="a compare.json written by python -m lab compare or replay, a replay run's rows.jsonl, or a replay run's "
        "folder (retention per compression, policy and regime, with its per-prompt spread); several replay folders "
        "(E3's input lengths) give one wide table side by side, and with --plot <their parent>/retention-by-input.png",
    )
    parser.add_argument("--readme", type=Path, help="also write the table into this README's compare block")
    parser.add_argument(
        "--wide", action="store_true", help="a replay folder: one row per policy, one column per compression and regime"
    )
    parser.add_argument(
        "--common-prompts",
        action="store_true",
        help="a replay folder: only the prompts with a row for every policy shown, per compression (a run still in "
        "progress compared like with like)",
    )
    parser.add_argument(
        "--by-task",
        action="store_true",
        help="a replay folder's retention table: one cell per prompt task over every family (summarize apart from "
        "continue) instead of per family and regime",
    )
    parser.add_argument("--block", default="compare", help="with --readme: the <!-- NAME:start --> block to fill")
    parser.add_argument(
        "--by-regime",
        action="store_true",
        help="a compare.json: speed-up over the target alone per policy and regime (mean, then each prompt)",
    )
    parser.add_argument(
        "--plot",
        action="store_true",
        help="also write <result>.png (a folder: <folder>/retention.png, per prompt; with --staleness staleness.png)",
    )
    parser.add_argument(
        "--staleness",
        action="store_true",
        help="a replay folder (E2, replayed with --attention-mass): AL first vs second half of the output and the kept "
        "share of full-cache attention mass first vs last quarter, per policy and regime",
    )
    parser.add_argument(
        "--policies",
        default=None,
        help="a replay folder: only these comma-separated policy labels, in the folder's order (default: all)",
    )
    parser.add_argument(
        "--estimate",
        type=Path,
        metavar="STEP_JSON",
        help="a replay folder: estimate end-to-end speed from its AL and the timings of `python -m benchmarks.step` "
        "(drafter ms per drafted token in the assisted loop, the target's step and verification)",
    )


def run(parser, args) -> None:
    for path in args.result:
        if not path.is_file() and not path.is_dir():
            parser.error(f"{path} does not exist")
        if path.is_dir() and not any(path.glob("*x/rows.jsonl")) and not any(path.glob("*tok/rows.jsonl")):
            parser.error(f"{path} holds no <compression>x/ or <budget>tok/rows.jsonl (a replay run's folder)")
    chosen = [p for p in policy_labels(parser, args.policies) if p != "full"] if args.policies else None
    if len(args.result) > 1:
        table = _side_by_side(parser, args, chosen)
    elif args.result[0].is_dir():
        table = _folder(parser, args, args.result[0], chosen)
    else:
        table = _file(parser, args, args.result[0])
    if args.readme:
        write_into_readme(table, args.readme, args.block)
    print(table)


def _side_by_side(parser, args, chosen) -> str:
    """Several replay folders (E3's input lengths): one wide retention table, and their plot by input length."""
    if not all(folder.is_dir() for folder in args.result):
        parser.error("several results go side by side only as replay folders (e.g. E3's input lengths)")
    if args.estimate or args.staleness or args.by_regime:
        parser.error("--estimate, --staleness and --by-regime take one result; several folders give retention")
    if args.plot:
        from lab.plots import plot_input_sweep

        rows = [r for folder in args.result for r in regime_rows(folder, chosen, args.common_prompts, args.by_task)]
        plot_input_sweep(rows, args.result[0].parent / "retention-by-input.png")
    return regime_wide_table(args.result, chosen, args.common_prompts, args.by_task)


def _folder(parser, args, folder: Path, chosen) -> str:
    """One replay folder: retention per regime (or wide), staleness, or the speed estimate."""
    if (args.common_prompts or args.by_task) and (args.estimate or args.staleness):
        parser.error("--common-prompts and --by-task apply to a replay folder's retention table")
    if args.estimate and args.staleness:
        parser.error("--estimate and --staleness are two different tables; pass one")
    if args.estimate:
        table = estimate_table(folder, json.loads(args.estimate.read_text()), chosen)
    elif args.staleness:
        table = staleness_table(folder, chosen)
    else:
        table = (regime_wide_table if args.wide else regime_table)(folder, chosen, args.common_prompts, args.by_task)
    if args.plot and args.staleness:
        from lab.plots import plot_staleness

        plot_staleness(staleness_rows(folder, chosen), folder / "staleness.png")
    elif args.plot:
        from lab.plots import plot_regimes

        plot_regimes(regime_rows(folder, chosen, args.common_prompts, args.by_task), folder / "retention.png")
    return table


def _file(parser, args, path: Path) -> str:
    """A replay run's rows.jsonl, or a compare.json (overall or by regime, and its plot)."""
    if args.common_prompts or args.by_task:
        parser.error("--common-prompts and --by-task apply to a replay folder's retention table, not to a file")
    if path.suffix == ".jsonl":
        return rows_table([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
    result = read_compare(path)
    if args.plot:
        from lab.plots import plot_compare

        plot_compare(result, path.with_suffix(".png"))
    return speedup_by_regime_table(result) if args.by_regime else markdown_table(result)
