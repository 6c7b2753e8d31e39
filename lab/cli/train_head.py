"""`python -m lab train-head`: fit a selection head for a policy (the drafter untouched), evaluated before and after
(`lab.head_recipe`)."""

from __future__ import annotations

import json
from pathlib import Path

from lab.cli.arguments import number, positive_int
from lab.cli.card import write_cards
from lab.cli.train import recipe_arguments, recipe_options

# The extra this command needs, checked before any work: training (peft, evaluate).
EXTRA = ("training",)

HELP = "fit a selection head (how the scorer reads the queries; drafter untouched), evaluated before/after"
TRAINED = Path.home() / ".cache" / "rift-hf" / "trained" / "qwen-coder-selection-head"


def add_arguments(parser) -> None:
    policy = "the policy fitted for (one that scores with its queries)"
    recipe_arguments(parser, policy, "compressions evaluated", TRAINED)
    parser.add_argument("--epochs", type=positive_int, default=8, help="passes over the training sequences")
    parser.add_argument(
        "--learning-rate", type=number(0, low_open=True), default=3e-2, help="Adam learning rate (cosine decay)"
    )
    parser.add_argument(
        "--delta", type=positive_int, default=128, help="rift-dyn's rescoring interval (examples and evaluation)"
    )
    parser.add_argument("--before", type=Path, help="replay folder of the drafter without a head to resume")
    parser.add_argument("--no-replay", action="store_true", help="proxy (selection recall) only")
    parser.add_argument(
        "--refresh-points",
        action="store_true",
        help="fit on rift-dyn's refresh points too (decode queries, the next --delta tokens' attention), not the "
        "prefill alone",
    )


def run(parser, args) -> None:
    from lab.head_recipe import run_head

    try:
        result = run_head(
            args.preset,
            args.out,
            **recipe_options(parser, args),
            epochs=args.epochs,
            delta=args.delta,
            refresh=args.refresh_points,
        )
    except ValueError as err:
        parser.error(str(err))
    if result["after"] is not None:
        write_cards(args.preset, args.out, args.card_dir)
    print(json.dumps({k: result[k] for k in ("recall_before", "recall_after", "fit_seconds")}, indent=2))
