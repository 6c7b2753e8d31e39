"""`rift-hf` command line. One module per subcommand (`rift_hf/cli/<command>.py`: its `HELP`, `add_arguments(parser)`
and `run(parser, args)`), what several of them parse alike in `arguments`; the runners, tables and plots they call
live in `rift_hf.experiments`. `demo` parses its own arguments (`rift_hf.demo.app`)."""

from __future__ import annotations

import json
import sys

import rift_hf

from . import card, compare, models, push, replay, summary, table, train, train_head
from .arguments import Parser, split_labels

__all__ = ["COMMANDS", "main", "parser", "split_labels"]

COMMANDS = {
    "models": models,
    "compare": compare,
    "replay": replay,
    "train": train,
    "train-head": train_head,
    "card": card,
    "table": table,
    "push": push,
    "summary": summary,
}
DESCRIPTION = (
    "rift-hf: speculative decoding with a compressed drafter cache. Measure policies by real generation (compare) or "
    "by replay, train and publish drafters, render results; `rift-hf <command> --help` for each command."
)
DEMO_HELP = "the Gradio app comparing policies live (rift-hf demo --help)"


def parser() -> Parser:
    """Every subcommand's arguments, in the order `rift-hf --help` lists them."""
    root = Parser(prog="rift-hf", description=DESCRIPTION)
    root.add_argument("--version", action="version", version=f"rift-hf {rift_hf.__version__}")
    sub = root.add_subparsers(dest="command", required=True, parser_class=Parser)
    root.commands = {}  # name -> its parser: a command's errors name the command (`rift-hf replay: error ...`)
    for name, command in COMMANDS.items():
        if name == "train":
            sub.add_parser("demo", help=DEMO_HELP)
        description = getattr(command, "DESCRIPTION", None)
        root.commands[name] = sub.add_parser(name, help=command.HELP, description=description)
        command.add_arguments(root.commands[name])
    return root


def main(argv=None) -> None:
    """`rift-hf`: a user's mistake that surfaces while a command runs (a file that is not there, or not JSON) ends
    with one line on stderr and exit status 2, as argparse's own usage errors do."""
    try:
        _main(argv)
    except (FileNotFoundError, IsADirectoryError, json.JSONDecodeError, UnicodeDecodeError) as err:
        what = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.filename else str(err)
        if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)):
            what = f"a file given is not JSON ({err})"
        print(f"rift-hf: error: {what}", file=sys.stderr)
        raise SystemExit(2) from None


def _main(argv=None) -> None:
    from ..extras import MissingExtra, require

    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["demo"]:
            require("demo", "rift-hf demo")
            from rift_hf.demo.app import main as demo_main

            return demo_main(argv[1:])
        root = parser()
        args = root.parse_args(argv)
        command = COMMANDS[args.command]
        if getattr(command, "EXTRA", None):  # before any work: nothing computed, nothing written
            require(command.EXTRA[0], f"rift-hf {args.command}", *command.EXTRA[1:])
        command.run(root.commands[args.command], args)
    except MissingExtra as err:
        print(f"rift-hf: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
