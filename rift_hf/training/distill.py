"""Compressibility distillation with the `Trainer` users already have.

`RiftCompressibilityCallback` samples, per optimizer step, the shape of the compressed cache to train under (prefill
boundary, budget, policy shape) or an unmasked step; `RiftDistillationTrainer.compute_loss` builds the masks that
shape gives on each sequence (`masks.py`) and minimises KL(teacher || drafter) on the positions after the boundary.
A callback cannot see inputs or change the loss (transformers' `CallbackHandler`), hence the split.
"""

from __future__ import annotations

import hashlib
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm
from transformers import Trainer, TrainerCallback

from ..config import RiftConfig, policy_fields, policy_settings
from ..policies import policy_class
from .masks import compressed_attention_masks, masked_attention
from .selection import alignment_loss, captured_attention

logger = logging.getLogger(__name__)


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
        for policy in self.policies:  # validates names and fields now, not mid-training
            RiftConfig(**policy_settings(policy, self.overrides))
        unread = set(self.overrides) & policy_fields() - {f for p in self.policies for f in policy_class(p).params}
        if unread:
            raise ValueError(
                f"No sampled policy ({', '.join(self.policies)}) reads {', '.join(sorted(unread))}; drop it from "
                "`overrides`, or sample a policy that does."
            )
        self._rng = random.Random(self.seed)

    def sample(self) -> tuple[float, RiftConfig | None]:
        boundary = self._rng.uniform(*self.boundary)
        if self._rng.random() < self.unmasked_rate:
            self.current = (boundary, None)
        else:
            policy = self._rng.choice(self.policies)
            config = RiftConfig(
                **policy_settings(policy, {"budget": self._rng.uniform(*self.budget), **self.overrides})
            )
            self.current = (boundary, config)
        return self.current


class RiftCompressibilityCallback(TrainerCallback):
    """Samples a cache shape at the start of every optimizer step (read by `RiftDistillationTrainer`)."""

    def __init__(self, sampler: CompressionSampler):
        self.sampler = sampler

    def on_step_begin(self, args, state, control, **kwargs):
        self.sampler.sample()


def distillation_loss(student_logits: torch.Tensor, teacher, start: int) -> torch.Tensor:
    """
    Mean over positions `>= start` of KL(teacher || student) of the next-token distributions.

    `teacher` is either dense logits `[T, V]` or a top-k pair `(indices [T, k], log_probs [T, k])` from
    `teacher_top_k`; the top-k teacher is renormalised over its k tokens (the tail's mass is dropped).
    """
    student = F.log_softmax(student_logits[start:].float(), dim=-1)
    if isinstance(teacher, (tuple, list)):
        indices, log_probs = teacher
        if indices.shape[0] != student_logits.shape[0] or int(indices.max()) >= student.shape[-1]:
            raise ValueError(
                f"Teacher top-k of shape {tuple(indices.shape)} (largest token id {int(indices.max())}) does not fit "
                f"drafter logits {tuple(student_logits.shape)}: the teacher must share the drafter's tokenizer and "
                "see the same sequence."
            )
        log_probs = log_probs[start:].float()
        log_probs = log_probs - log_probs.logsumexp(dim=-1, keepdim=True)
        picked = student.gather(-1, indices[start:].long())
        return (log_probs.exp() * (log_probs - picked)).sum(-1).mean()
    if teacher.shape != student_logits.shape:
        raise ValueError(
            f"Teacher logits {tuple(teacher.shape)} and drafter logits {tuple(student_logits.shape)} differ: the "
            "teacher must share the drafter's vocabulary (slice padded vocabulary rows off first)."
        )
    teacher = F.log_softmax(teacher[start:].float(), dim=-1)
    return F.kl_div(student, teacher, log_target=True, reduction="batchmean")


def teacher_top_k(teacher, sequences: list[torch.Tensor], k: int, path: Path | None = None) -> list[tuple]:
    """
    The teacher's top-k next-token log-probabilities for every position of every sequence, computed once.

    With `path` (a `.safetensors` file) they are written there and read back on the next call for the same teacher,
    sequences and k; a file made for anything else is recomputed and overwritten. Returns one
    `(indices [T, k], log_probs [T, k])` pair per sequence, for `distillation_loss` or a dataset's
    `teacher_top_k_indices` / `teacher_top_k_log_probs` fields.
    """
    if not isinstance(k, int) or k < 1:
        raise ValueError(f"`k` must be a positive int (try 64), got {k!r}.")
    digest = hashlib.sha256(str(k).encode())
    digest.update(str(getattr(teacher.config, "_name_or_path", "")).encode())
    for sequence in sequences:
        digest.update(sequence.cpu().numpy().tobytes())
    fingerprint = digest.hexdigest()
    if path is not None and Path(path).exists():
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("fingerprint") == fingerprint:
                return [(f.get_tensor(f"indices.{i}"), f.get_tensor(f"log_probs.{i}")) for i in range(len(sequences))]
        logger.info("Teacher cache %s was made for other sequences, teacher or k; recomputing it.", path)
    device = next(teacher.parameters()).device
    pairs = []
    with torch.no_grad():
        for sequence in tqdm(sequences, desc="teacher top-k"):
            logits = teacher(sequence[None].to(device)).logits[0].float()
            values, indices = logits.log_softmax(-1).topk(k, dim=-1)
            pairs.append((indices.to(torch.int32).cpu(), values.to(torch.float16).cpu()))
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tensors = {}
        for i, (indices, values) in enumerate(pairs):
            tensors[f"indices.{i}"], tensors[f"log_probs.{i}"] = indices.contiguous(), values.contiguous()
        save_file(tensors, str(path), metadata={"fingerprint": fingerprint, "k": str(k)})
    return pairs


class RiftDistillationTrainer(Trainer):
    """
    A `Trainer` whose loss is KL(teacher || drafter under compressed-cache masks) after the prefill boundary.

    Args:
        sampler (`CompressionSampler`): shared with a `RiftCompressibilityCallback` (added automatically).
        teacher (`PreTrainedModel`, *optional*): the target (same vocabulary) or a frozen copy of the drafter; when
            `None`, a batch may carry precomputed teacher outputs: `teacher_top_k_indices` and
            `teacher_top_k_log_probs` (`[B, T, k]`, from `teacher_top_k`) or dense `teacher_logits` (`[B, T, V]`);
            else the drafter's own unmasked logits are the teacher (self-distillation). A batch may also carry
            `boundary` (`[B]`, the prompt length of each sequence): the compressed cache then starts there, as at
            inference after that prompt, instead of at the sampler's sampled fraction.
        alignment_weight (`float`, defaults to 0): weight of the selection-alignment loss (`selection.py`) added on
            every step; needs `boundary` and `future_attention` (`[B, L, H_kv, P]`, from `future_attention` with the
            sampler's window and n_sink) in each batch.
    """

    def __init__(self, *args, sampler: CompressionSampler, teacher=None, alignment_weight: float = 0.0, **kwargs):
        callbacks = list(kwargs.pop("callbacks", None) or [])
        if not any(isinstance(c, RiftCompressibilityCallback) for c in callbacks):
            callbacks.append(RiftCompressibilityCallback(sampler))
        super().__init__(*args, callbacks=callbacks, **kwargs)
        self.sampler = sampler
        self.teacher = teacher
        if alignment_weight < 0:
            raise ValueError(f"`alignment_weight` must be >= 0, got {alignment_weight}.")
        self.alignment_weight = alignment_weight
        self.alignment_log: list[float] = []  # the alignment loss of every sequence trained on, in order
        if alignment_weight:
            from ..attention import use_rift_attention

            # The loss reads the queries and keys the "rift" backend sees; rift-stat needs that backend too.
            use_rift_attention(self.model, RiftConfig(**policy_settings("rift-stat", sampler.overrides)))
        if teacher is not None:
            teacher.eval().requires_grad_(False)

    def _teacher_logits(self, model, input_ids, inputs, index):
        if "teacher_top_k_indices" in inputs:
            return inputs["teacher_top_k_indices"][index], inputs["teacher_top_k_log_probs"][index]
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
            boundary = int(inputs["boundary"][index]) if "boundary" in inputs else int(fraction * ids.shape[1])
            boundary = min(max(1, boundary), ids.shape[1] - 1)
            masks = compressed_attention_masks(model, ids, boundary, config) if config is not None else None
            teacher = self._teacher_logits(model, ids, inputs, index)
            if not self.alignment_weight:
                with masked_attention(masks):
                    student = model(ids).logits[0]
                losses.append(distillation_loss(student, teacher, boundary))
                continue
            if "future_attention" not in inputs or "boundary" not in inputs:
                raise ValueError(
                    "alignment_weight > 0 needs `boundary` and `future_attention` in every batch "
                    "(rift_hf.training.selection.future_attention)."
                )
            with masked_attention(masks), captured_attention() as captured:
                student = model(ids).logits[0]
            shape = RiftConfig(**policy_settings("rift-stat", self.sampler.overrides))  # the scorer's settings
            aligned = alignment_loss(
                captured, inputs["future_attention"][index], boundary, shape.window, shape.n_sink, shape.pool,
                shape.pool_kernel,
            )  # fmt: skip
            self.alignment_log.append(float(aligned.detach()))
            losses.append(distillation_loss(student, teacher, boundary) + self.alignment_weight * aligned)
        loss = torch.stack(losses).mean()
        return (loss, {"loss": loss}) if return_outputs else loss
