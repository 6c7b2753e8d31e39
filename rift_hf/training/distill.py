"""Compressibility distillation with the `Trainer` users already have.

`RiftCompressibilityCallback` samples, per optimizer step, the shape of the compressed cache to train under (prefill
boundary, budget, policy shape) or an unmasked step; `RiftDistillationTrainer.compute_loss` builds the masks that
shape gives on each sequence (`masks.py`) and minimises KL(teacher || drafter) on the positions after the boundary.
A callback cannot see inputs or change the loss (transformers' `CallbackHandler`), hence the split.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import Trainer, TrainerCallback

from ..config import RiftConfig
from .masks import compressed_attention_masks, masked_attention


@dataclass
class CompressionSampler:
    """
    Ranges to sample the training-time cache from.

    Args:
        boundary: the prefill boundary P as a fraction of the sequence, sampled uniformly in this range.
        budget: the budget as a fraction of the prefill, sampled uniformly in this range (0.125-0.25 = 8x-4x).
        policies: policy shapes to sample from (`swa`, `rift-stat`, `rift-stat-block`, `rift-dyn`, ...).
        unmasked_rate: share of steps trained without masks, so full-cache acceptance does not drop.
        overrides: further `RiftConfig` fields (window, block_size, delta, n_sink ...).
    """

    boundary: tuple[float, float] = (0.5, 0.8)
    budget: tuple[float, float] = (0.125, 0.25)
    policies: tuple[str, ...] = ("rift-stat", "rift-stat-block", "rift-dyn", "swa")
    unmasked_rate: float = 0.2
    overrides: dict = field(default_factory=dict)
    seed: int = 0
    current: tuple[float, RiftConfig | None] = (0.5, None)

    def __post_init__(self):
        for name in ("boundary", "budget"):
            lo, hi = getattr(self, name)
            if not 0.0 < lo <= hi < 1.0:
                raise ValueError(f"`{name}` must be a range (lo, hi) with 0 < lo <= hi < 1, got {(lo, hi)}.")
        if not 0.0 <= self.unmasked_rate <= 1.0:
            raise ValueError(f"`unmasked_rate` must lie in [0, 1], got {self.unmasked_rate}.")
        for policy in self.policies:
            RiftConfig(policy=policy, **self.overrides)  # validates names and fields now, not mid-training
        self._rng = random.Random(self.seed)

    def sample(self) -> tuple[float, RiftConfig | None]:
        boundary = self._rng.uniform(*self.boundary)
        if self._rng.random() < self.unmasked_rate:
            self.current = (boundary, None)
        else:
            policy = self._rng.choice(self.policies)
            config = RiftConfig(policy=policy, budget=self._rng.uniform(*self.budget), **self.overrides)
            self.current = (boundary, config)
        return self.current


class RiftCompressibilityCallback(TrainerCallback):
    """Samples a cache shape at the start of every optimizer step (read by `RiftDistillationTrainer`)."""

    def __init__(self, sampler: CompressionSampler):
        self.sampler = sampler

    def on_step_begin(self, args, state, control, **kwargs):
        self.sampler.sample()


def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, start: int) -> torch.Tensor:
    """Mean over positions `>= start` of KL(teacher || student) of the next-token distributions (`[T, V]` each)."""
    teacher = F.log_softmax(teacher_logits[start:].float(), dim=-1)
    student = F.log_softmax(student_logits[start:].float(), dim=-1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


class RiftDistillationTrainer(Trainer):
    """
    A `Trainer` whose loss is KL(teacher || drafter under compressed-cache masks) after the prefill boundary.

    Args:
        sampler (`CompressionSampler`): shared with a `RiftCompressibilityCallback` (added automatically).
        teacher (`PreTrainedModel`, *optional*): the target (same vocabulary) or a frozen copy of the drafter; when
            `None`, a batch may carry precomputed `teacher_logits` (`[B, T, V]`), else the drafter's own unmasked
            logits are the teacher (self-distillation).
    """

    def __init__(self, *args, sampler: CompressionSampler, teacher=None, **kwargs):
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if not any(isinstance(c, RiftCompressibilityCallback) for c in callbacks):
            callbacks.append(RiftCompressibilityCallback(sampler))
        super().__init__(*args, callbacks=callbacks, **kwargs)
        self.sampler = sampler
        self.teacher = teacher
        if teacher is not None:
            teacher.eval().requires_grad_(False)

    def _teacher_logits(self, model, input_ids, inputs, index):
        if "teacher_logits" in inputs:
            return inputs["teacher_logits"][index]
        with torch.no_grad():
            source = self.teacher if self.teacher is not None else model
            return source(input_ids).logits[0]

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        input_ids = inputs["input_ids"]
        fraction, config = self.sampler.current
        losses = []
        for index in range(input_ids.shape[0]):
            ids = input_ids[index : index + 1]
            boundary = min(max(1, int(fraction * ids.shape[1])), ids.shape[1] - 1)
            masks = compressed_attention_masks(model, ids, boundary, config) if config is not None else None
            teacher = self._teacher_logits(model, ids, inputs, index)
            with masked_attention(masks):
                student = model(ids).logits[0]
            losses.append(distillation_loss(student, teacher, boundary))
        loss = torch.stack(losses).mean()
        return (loss, {"loss": loss}) if return_outputs else loss
