"""The argument parser of `rift-hf` and of the lab's `python -m lab`: defaults shown once in `--help`, errors in one
line."""

from __future__ import annotations

import argparse


class DefaultsFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """`--help` with each default once: none added where the help already says it, or where there is none."""

    def _get_help_string(self, action) -> str:
        if action.default is None or "default" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """Subcommand parsers that print their defaults in `--help`."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):
        """One line on stderr (`--help` shows the usage), exit status 2."""
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")
