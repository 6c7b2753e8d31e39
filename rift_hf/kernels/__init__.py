"""Tensor kernels of rift-hf, installed as `rift_hf.kernels`.

Every function has a PyTorch reference (`reference.py`) and, where it pays, a Triton kernel (`triton_ops.py`) with
the same signature and meaning. The public names below use the Triton kernel for CUDA tensors and the reference
elsewhere; `RIFT_HF_KERNELS=triton` forces the kernels (e.g. on CPU under `TRITON_INTERPRET=1`), `=torch` the
references.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from . import reference
from .reference import block_scores, pool_scores, retrieved_attention

__all__ = [
    "block_scores",
    "indexed_attention",
    "pool_scores",
    "retrieved_attention",
    "uses_triton",
    "window_attention_scores",
]

_HAS_TRITON = importlib.util.find_spec("triton") is not None


def uses_triton(tensor: torch.Tensor) -> bool:
    """Whether the public functions run the Triton kernel for `tensor`."""
    mode = os.environ.get("RIFT_HF_KERNELS", "auto")
    if mode not in ("auto", "triton", "torch"):
        raise ValueError(f"RIFT_HF_KERNELS must be 'auto', 'triton' or 'torch', got {mode!r}.")
    if mode == "torch" or not _HAS_TRITON:
        if mode == "triton":
            raise ValueError("RIFT_HF_KERNELS=triton but triton is not installed: pip install 'rift-hf[triton]'.")
        return False
    return mode == "triton" or tensor.is_cuda


def _triton():
    # Imported on first use: TRITON_INTERPRET is read when the kernels are decorated.
    from . import triton_ops

    return triton_ops


def window_attention_scores(query, key, scale, sinks=None):
    """SnapKV window scores `[B, H_kv, T]`; see `reference.window_attention_scores`."""
    impl = _triton() if uses_triton(query) else reference
    return impl.window_attention_scores(query, key, scale, sinks)


def indexed_attention(query, key, value, index, scale, sinks=None):
    """Attention over per-head selected store rows `[B, H_q, L, D]`; see `reference.indexed_attention`."""
    impl = _triton() if uses_triton(query) else reference
    return impl.indexed_attention(query, key, value, index, scale, sinks)
