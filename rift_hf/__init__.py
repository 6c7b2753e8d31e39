"""rift-hf: RIFT drafter KV-cache compression for speculative decoding in Hugging Face transformers.

`import rift_hf` registers (additively) the "rift" attention backend and the `cache_implementation="rift"` name.
"""

from ._compat import check_transformers as _check_transformers

_check_transformers()  # before anything touches transformers' private generate methods

# ruff: noqa: E402
from . import attention as _attention
from .cache import RiftCache, RiftLayer, RiftRetrievalLayer, RiftSelectLayer, RiftStateLayer, RiftStoreLayer
from .config import POLICIES, PRESETS, RiftConfig, preset
from .generation import RiftCandidateGenerator, RiftStats, last_stats
from .generation import apply as _apply_patches
from .policies import Policy, calibrate_thresholds, register
from .policies.selection_head import SelectionHead
from .speedups import gqa_attention, weight_major_linear

__version__ = "0.1.0"


def metric_path(name: str = "acceptance_length") -> str:
    """
    Where the installed `evaluate` metric lives, for `evaluate.load(rift_hf.metric_path())` (acceptance length and
    retention as SPEED-Bench defines them; its card is the folder's README.md).
    """
    from pathlib import Path

    path = Path(__file__).resolve().parent / "metrics" / name
    if not (path / f"{name}.py").is_file():
        known = sorted(p.name for p in path.parent.iterdir() if p.is_dir() and not p.name.startswith("_"))
        raise ValueError(f"No rift-hf metric {name!r}; available: {', '.join(known)}.")
    return str(path)


_attention.register()
_apply_patches()

__all__ = [
    "POLICIES",
    "PRESETS",
    "RiftCache",
    "RiftCandidateGenerator",
    "RiftConfig",
    "RiftLayer",
    "RiftRetrievalLayer",
    "RiftSelectLayer",
    "RiftStateLayer",
    "RiftStoreLayer",
    "RiftStats",
    "Policy",
    "SelectionHead",
    "calibrate_thresholds",
    "last_stats",
    "metric_path",
    "preset",
    "register",
    "gqa_attention",
    "weight_major_linear",
]
