"""Compressibility training: masks that mimic the compressed cache, the Trainer callback, distillation."""

from .distill import (
    CompressionSampler,
    RiftCompressibilityCallback,
    RiftDistillationTrainer,
    distillation_loss,
    teacher_top_k,
)
from .masks import compressed_attention_masks, masked_attention

__all__ = [
    "CompressionSampler",
    "RiftCompressibilityCallback",
    "RiftDistillationTrainer",
    "compressed_attention_masks",
    "distillation_loss",
    "masked_attention",
    "teacher_top_k",
]
