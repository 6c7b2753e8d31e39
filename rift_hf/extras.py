"""Optional dependencies, checked before any work: a command that needs an extra says which, up front.

`pip install rift-hf` installs what the cache and `generate` need; the rest comes in extras (`pyproject.toml`):
`bench` (comparisons and replays: `evaluate` for the AL metric, matplotlib for plots, `gguf` to convert the preset
models), `demo` (Gradio), `training`, `quanto` (quantised stores), `triton` (GPU kernels).
"""

from __future__ import annotations

import importlib.util

EXTRAS = {
    "bench": ("evaluate", "matplotlib", "gguf"),
    "demo": ("gradio", "pandas", "matplotlib"),
    "training": ("peft", "evaluate"),
    "quanto": ("optimum.quanto",),
    "triton": ("triton",),
}


class MissingExtra(ImportError):
    """An optional dependency is missing; the message names the extra that installs it."""


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a parent package missing, or a broken one
        return False


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of `extra` (or those of them named in `modules`) that cannot be imported."""
    return [m for m in (modules or EXTRAS[extra]) if not _installed(m)]


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise `MissingExtra` (naming `pip install "rift-hf[<extra>]"`) unless `extra`'s modules (or `modules` of it)
    are installed; `what` is what needs them, for the message."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtra(
            f'{what} needs the {extra!r} extra (missing: {", ".join(absent)}): pip install "rift-hf[{extra}]"'
        )
