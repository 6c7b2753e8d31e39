"""Markdown tables for results files and docs, written by tabulate (GitHub's pipe format)."""

from __future__ import annotations

from tabulate import tabulate


def pipe_table(headers: list[str], rows: list[list]) -> str:
    """A GitHub-flavoured markdown table; cells are shown as given (already formatted strings stay as they are)."""
    return tabulate([[str(c) for c in row] for row in rows], headers=headers, tablefmt="github", disable_numparse=True)
