"""Compressibility training: masks that mimic the compressed cache, the Trainer callback, distillation."""

from .distill import (
    CompressionSampler,
    RiftCompressibilityCallback,
    RiftDistillationTrainer,
    distillation_loss,
    teacher_top_k,
)
from .head import head_examples, head_recall, train_selection_head
from .masks import compressed_attention_masks, masked_attention

__all__ = [
    "CompressionSampler",
    "RiftCompressibilityCallback",
    "RiftDistillationTrainer",
    "compressed_attention_masks",
    "distillation_loss",
    "head_examples",
    "head_recall",
    "masked_attention",
    "teacher_top_k",
    "train_selection_head",
]
