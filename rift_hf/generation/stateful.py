"""Lossless assisted generation for stateful targets (linear attention / SSM layers), opt-in through rift.

transformers refuses such targets: verification runs the drafted tokens through the target, and a rejection
leaves its recurrent state advanced past the accepted tokens. With `cache_implementation="rift"` the target gets a
`VerifierCache` (a full `RiftCache` whose states roll back) and two small instance-level wrappers:

- `forward` feeds the verified tokens and the drafts as two chunks of one verification, so the cache snapshots the
  states between them (the split costs a second forward call, not extra tokens);
- `prepare_inputs_for_generation` lets the next verification start where the cache really is: after a rejection
  the cache restores the snapshot, and the accepted drafts are re-fed at the head of the next verification.

Capturing per-position states inside the verification pass would avoid the re-feed, but it needs each layer's
kernel (GatedDeltaNet chunked scan, Mamba2 SSD) to expose intermediate states; restore-and-advance works for all.
"""

from __future__ import annotations

import functools

import torch

from .._compat import CACHE, pop_cache
from ..cache import RiftCache


def needs_verifier(model) -> bool:
    """Whether `model` as a target has layers whose state a rollback cannot crop."""
    from transformers.cache_utils import get_layer_types_and_kwargs

    layer_types, _ = get_layer_types_and_kwargs(model.config.get_text_config(decoder=True))
    return bool(getattr(model, "_is_stateful", False)) or "linear_attention" in layer_types


class VerifierCache(RiftCache):
    """
    A stateful target's cache in assisted generation: full (nothing is compressed), rolled back by restoring the
    states snapshotted after each round's verified tokens. `pending_drafts`, set by the candidate generator, is the
    number of drafted tokens at the end of the next forward, which `split_forward` feeds as a second chunk so the
    states can be snapshotted between them.
    """

    def __init__(self, config):
        super().__init__(config, {"policy": "full"})
        self.pending_drafts: int | None = None


def verifier_cache(model) -> VerifierCache:
    """A `VerifierCache` for `model`, with the model's wrappers installed."""
    cache = VerifierCache(model.config)
    if not getattr(model, "_rift_verifier", False):
        model.forward = _split_forward(model.forward)
        model.prepare_inputs_for_generation = _resume_from_cache(model.prepare_inputs_for_generation)
        model._rift_verifier = True
    return cache


def _resume_from_cache(prepare):
    @functools.wraps(prepare)
    def prepare_inputs_for_generation(input_ids, *args, next_sequence_length=None, **kwargs):
        cache = kwargs.get(CACHE)
        if isinstance(cache, VerifierCache) and next_sequence_length is not None:
            next_sequence_length = input_ids.shape[1] - cache.get_seq_length()
        return prepare(input_ids, *args, next_sequence_length=next_sequence_length, **kwargs)

    return prepare_inputs_for_generation


def _split_forward(forward):
    @functools.wraps(forward)
    def split_forward(input_ids=None, attention_mask=None, position_ids=None, logits_to_keep=0, **kwargs):
        cache = pop_cache(kwargs)  # `past_key_values` before transformers 5.24, `cache` from it on
        drafts = None
        if isinstance(cache, VerifierCache):
            drafts, cache.pending_drafts = cache.pending_drafts, None
        if not drafts or input_ids is None or drafts >= input_ids.shape[1]:
            return forward(
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                logits_to_keep=logits_to_keep,
                **{CACHE: cache},
                **kwargs,
            )
        verified = input_ids.shape[1] - drafts
        past = cache.get_seq_length()
        head = forward(
            input_ids=input_ids[:, :verified],
            attention_mask=None if attention_mask is None else attention_mask[:, : past + verified],
            position_ids=None if position_ids is None else position_ids[..., :verified],
            logits_to_keep=0,
            **{CACHE: cache},
            **kwargs,
        )
        tail = forward(
            input_ids=input_ids[:, verified:],
            attention_mask=attention_mask,
            position_ids=None if position_ids is None else position_ids[..., verified:],
            logits_to_keep=0,
            **{CACHE: cache},
            **kwargs,
        )
        logits = torch.cat([head.logits, tail.logits], dim=1)
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            logits = logits[:, -logits_to_keep:]
        tail.logits = logits
        return tail

    return split_forward
