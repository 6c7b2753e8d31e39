"""rift-hf: RIFT drafter KV-cache compression for speculative decoding in Hugging Face transformers.

`import rift_hf` registers (additively) the "rift" attention backend and the `cache_implementation="rift"` name.
"""

from ._compat import check_transformers as _check_transformers

_check_transformers()  # before anything touches transformers' private generate methods

# ruff: noqa: E402
from . import attention as _attention
from .cache import RiftCache, RiftLayer, RiftStateLayer
from .config import POLICIES, PRESETS, RiftConfig, preset
from .generation import RiftCandidateGenerator, RiftStats, last_stats
from .generation import apply as _apply_patches
from .policies import calibrate_thresholds

__version__ = "0.1.0"

_attention.register()
_apply_patches()

__all__ = [
    "POLICIES",
    "PRESETS",
    "RiftCache",
    "RiftCandidateGenerator",
    "RiftConfig",
    "RiftLayer",
    "RiftStateLayer",
    "RiftStats",
    "calibrate_thresholds",
    "last_stats",
    "preset",
]
