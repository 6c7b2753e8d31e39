"""Tensor kernels of rift-hf, installed as `rift_hf.kernels`.

Every function here has a PyTorch reference (`reference.py`) with the same signature and meaning; callers use
the public names below, which pick the fastest implementation available for the tensors' device.
"""

from .reference import block_scores, indexed_attention, pool_scores, window_attention_scores

__all__ = ["block_scores", "indexed_attention", "pool_scores", "window_attention_scores"]
