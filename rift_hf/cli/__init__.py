"""`rift-hf` command line: what a user runs with the installed package. One module per subcommand
(`rift_hf/cli/<command>.py`: its `HELP`, `add_arguments(parser)` and `run(parser, args)`); `demo` parses its own
arguments (`rift_hf.demo.app`). The lab's commands (`LAB_COMMANDS`: the runners, recipes, tables and plots behind our
records) run from a clone as `python -m lab <command>` (`lab/cli`), through the same `run` with more commands."""

from __future__ import annotations

import json
import sys

import rift_hf

from . import models, push
from .parser import Parser

__all__ = ["COMMANDS", "LAB_COMMANDS", "main", "parser", "run"]

COMMANDS = {"models": models, "push": push}
# The lab's commands (`python -m lab <command>` from a clone of the repository), named here to point there.
LAB_COMMANDS = ("compare", "replay", "train", "train-head", "card", "table", "summary")
DESCRIPTION = (
    "rift-hf: speculative decoding with a compressed drafter cache. Install real model pairs (models), try policies "
    "live (demo), publish a drafter (push); `rift-hf <command> --help` for each command. Measuring policies, training "
    "drafters and rendering results run from a clone: `python -m lab <command>`."
)
DEMO_HELP = "the Gradio app comparing policies live (rift-hf demo --help)"


def parser(prog: str = "rift-hf", commands: dict | None = None, description: str = DESCRIPTION) -> Parser:
    """Every subcommand's arguments (`commands`, default `COMMANDS`), in the order `--help` lists them."""
    commands = COMMANDS if commands is None else commands
    root = Parser(prog=prog, description=description)
    root.add_argument("--version", action="version", version=f"rift-hf {rift_hf.__version__}")
    sub = root.add_subparsers(dest="command", required=True, parser_class=Parser)
    root.commands = {}  # name -> its parser: a command's errors name the command (`python -m lab replay: error ...`)
    for name, command in commands.items():
        if name == "push":
            sub.add_parser("demo", help=DEMO_HELP)
        description = getattr(command, "DESCRIPTION", None)
        root.commands[name] = sub.add_parser(name, help=command.HELP, description=description)
        command.add_arguments(root.commands[name])
    return root


def main(argv=None) -> None:
    """`rift-hf`."""
    run(argv)


def run(argv=None, prog: str = "rift-hf", commands: dict | None = None, description: str = DESCRIPTION) -> None:
    """Parse `argv` against `commands` and run the one named. A user's mistake that surfaces while a command runs (a
    file that is not there, or not JSON) ends with one line on stderr and exit status 2, as argparse's own usage
    errors do."""
    try:
        _run(argv, prog, COMMANDS if commands is None else commands, description)
    except (FileNotFoundError, IsADirectoryError, json.JSONDecodeError, UnicodeDecodeError) as err:
        what = f"{err.filename}: {err.strerror}" if isinstance(err, OSError) and err.filename else str(err)
        if isinstance(err, (json.JSONDecodeError, UnicodeDecodeError)):
            what = f"a file given is not JSON ({err})"
        print(f"{prog}: error: {what}", file=sys.stderr)
        raise SystemExit(2) from None


def _run(argv, prog: str, commands: dict, description: str) -> None:
    from ..extras import MissingExtra, require

    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] == ["demo"]:
            require("demo", f"{prog} demo")
            from rift_hf.demo.app import main as demo_main

            return demo_main(argv[1:])
        if argv[:1] and argv[0] in LAB_COMMANDS and argv[0] not in commands:
            print(
                f"{prog}: error: `{argv[0]}` is one of the lab's commands, which measure policies, train drafters and "
                f"render results from a clone of the repository: run `python -m lab {' '.join(argv)}` there (the "
                "library itself replays your own prompts: rift_hf.replay).",
                file=sys.stderr,
            )
            raise SystemExit(2)
        root = parser(prog, commands, description)
        args = root.parse_args(argv)
        command = commands[args.command]
        if getattr(command, "EXTRA", None):  # before any work: nothing computed, nothing written
            require(command.EXTRA[0], f"{prog} {args.command}", *command.EXTRA[1:])
        command.run(root.commands[args.command], args)
    except MissingExtra as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        raise SystemExit(2) from None
