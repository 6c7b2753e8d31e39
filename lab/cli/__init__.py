"""`python -m lab`: the lab's commands (one module per subcommand, as `rift_hf.cli`'s), beside the user's `rift-hf`
commands, through the same runner (`rift_hf.cli.run`)."""

from __future__ import annotations

from rift_hf.cli import COMMANDS as USER_COMMANDS
from rift_hf.cli import run

from . import card, compare, replay, summary, table, train, train_head
from .arguments import split_labels

__all__ = ["COMMANDS", "main", "split_labels"]

COMMANDS = {
    "models": USER_COMMANDS["models"],
    "compare": compare,
    "replay": replay,
    "train": train,
    "train-head": train_head,
    "card": card,
    "table": table,
    "push": USER_COMMANDS["push"],
    "summary": summary,
}
DESCRIPTION = (
    "The rift-hf lab: measure policies by real generation (compare) or by replay, train and publish drafters, render "
    "results; `python -m lab <command> --help` for each command."
)


def main(argv=None) -> None:
    """`python -m lab`."""
    run(argv, prog="python -m lab", commands=COMMANDS, description=DESCRIPTION)
