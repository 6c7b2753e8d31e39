"""`python -m lab summary`: `summary.json` (every experiment's headline records) as markdown tables, a figure, a README
block."""

from __future__ import annotations

import json
from pathlib import Path

from lab.records import SUMMARY, rebuild_summary
from lab.tables import summary_table, write_into_readme

HELP = "render benchmarks/results/summary.json as markdown tables"


def add_arguments(parser) -> None:
    parser.add_argument("--path", type=Path, default=SUMMARY, help="summary.json path")
    parser.add_argument("--experiments", nargs="*", help="only these experiments (default: all)")
    parser.add_argument("--readme", type=Path, help="also write the tables into this README's experiments block")
    parser.add_argument("--plot", type=Path, help="also write the experiments' overview figure (PNG) here")
    parser.add_argument(
        "--rebuild", action="store_true", help="first re-derive summary.json from the compare.json files beside it"
    )


def run(parser, args) -> None:
    if not args.rebuild and not args.path.is_file():
        parser.error(f"{args.path} does not exist")
    records = rebuild_summary(args.path) if args.rebuild else json.loads(args.path.read_text())
    if args.plot:
        from lab.plots import plot_summary

        plot_summary(records, args.plot)
    text = summary_table(records, args.experiments)
    if args.readme:
        write_into_readme(text, args.readme, "experiments")
    print(text)
