"""`python -m lab train`: compressibility distillation of a preset's drafter, evaluated before and after
(`lab.recipe`). `recipe_arguments` / `recipe_options` are what `train-head` shares with it."""

from __future__ import annotations

import json
from pathlib import Path

import rift_hf
from lab.cli.arguments import compressions, number, positive_int
from lab.cli.card import TRAINED, write_cards
from rift_hf.models import PRESETS

# The extra this command needs, checked before any work: training (peft, evaluate).
EXTRA = ("training",)

HELP = "compressibility distillation of a preset's drafter, evaluated before/after"


def recipe_arguments(parser, policy_help: str, compressions_help: str, out: Path) -> None:
    """The arguments of both recipes: the preset and policy, the training prompts, the replay evaluation, where the
    Hub-ready folder and the card go."""
    parser.add_argument("--preset", default="qwen-coder", choices=sorted(PRESETS), help="model preset")
    parser.add_argument("--policy", default="rift-stat", help=policy_help)
    parser.add_argument("--compressions", default="4,8", help=compressions_help)
    parser.add_argument("--prompt-tokens", type=int, default=768, help="source tokens per training prompt")
    parser.add_argument("--answer-tokens", type=int, default=256, help="answer tokens after each training prompt")
    parser.add_argument("--window", type=positive_int, default=64, help="observation window of the policy")
    for name, default in (("input-tokens", 4096), ("new-tokens", 512), ("per-task", 8)):
        parser.add_argument(
            f"--eval-{name}", type=int, default=default, help=f"replay evaluation: {name.replace('-', ' ')}"
        )
    parser.add_argument("--gamma", type=positive_int, default=11, help="draft length in the evaluation")
    parser.add_argument(
        "--after", type=Path, help="where the replay rows after training (or with a head) go; None: <out>/replay-after"
    )
    parser.add_argument("--out", type=Path, default=out, help="Hub-ready folder: model/, eval.json")
    parser.add_argument("--card-dir", type=Path, default=Path("model_cards"), help="where the model card is written")


def recipe_options(parser, args) -> dict:
    """The keyword arguments both recipes take from `recipe_arguments` (and `--before`, `--no-replay`)."""
    names = ("policy", "prompt_tokens", "answer_tokens", "learning_rate", "window", "eval_input_tokens",
             "eval_new_tokens", "eval_per_task", "gamma")  # fmt: skip
    return {
        **{name: getattr(args, name) for name in names},
        "compressions": compressions(parser, args.compressions),
        "replay": not args.no_replay,
        "before_dir": args.before,
        "after_dir": args.after,
    }


def add_arguments(parser) -> None:
    recipe_arguments(
        parser,
        "the policy trained for (and evaluated)",
        "compressions evaluated; budgets sampled between them",
        TRAINED,
    )
    parser.add_argument("--steps", type=positive_int, default=120, help="optimiser steps (one sequence each)")
    parser.add_argument("--learning-rate", type=number(0, low_open=True), default=2e-5, help="AdamW learning rate")
    parser.add_argument(
        "--save-steps", type=positive_int, default=20, help="checkpoint interval (a rerun resumes from the last)"
    )
    parser.add_argument("--unmasked-rate", type=number(0, 1), default=0.25, help="share of steps without compression")
    parser.add_argument(
        "--alignment-weight",
        type=number(0),
        default=0.0,
        help="weight of the selection-alignment loss (prefill-window scores towards the answer's attention); 0: off",
    )
    parser.add_argument(
        "--before", type=Path, help="replay folder of the untouched drafter to resume; None: <out>/replay-before"
    )
    parser.add_argument("--no-replay", action="store_true", help="proxy evaluation only (a short hyper-parameter look)")
    parser.add_argument(
        "--teacher", choices=("self", "target"), default="target", help="distil from the target or the frozen drafter"
    )
    parser.add_argument(
        "--top-k", type=positive_int, default=64, help="target teacher: log-probs kept per position (on disk)"
    )


def run(parser, args) -> None:
    from lab.recipe import run as train

    options = recipe_options(parser, args)
    if args.policy not in rift_hf.POLICIES or args.policy == "full":
        compressing = ", ".join(p for p in rift_hf.POLICIES if p != "full")
        parser.error(f"--policy must be a compressing policy: {compressing}")
    result = train(
        args.preset,
        args.steps,
        args.out,
        **options,
        teacher=args.teacher,
        top_k=args.top_k,
        unmasked_rate=args.unmasked_rate,
        alignment_weight=args.alignment_weight,
        save_steps=args.save_steps,
    )
    if result["after"] is not None:
        write_cards(args.preset, args.out, args.card_dir)
    print(json.dumps({k: result[k] for k in ("proxy_before", "proxy_after", "train_seconds")}, indent=2))
