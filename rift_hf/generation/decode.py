"""Decode-phase runs: `generate` from a recorded prompt forward, so a long prompt's prefill is paid once, not per run.

`generate_from(target, prompt_cache, ...)` loads the target's record (the prompt without its last token) into a fresh
`DynamicCache` and, in assisted generation, hands the drafter's record (the whole prompt and its last logits) to the
candidate generator: transformers' own (a `DynamicCache` drafter) or rift's (`cache_implementation="rift"`: each policy
compresses its own copy exactly as after its own prompt forward, and drafts its first token from the recorded logits).
Only `generate` itself is timed, so the seconds returned are the decode phase.

transformers' assisted loop feeds the whole sequence in its first target forward even when the target's cache already
holds the prompt (it would then be read twice, at shifted positions); inside `generate_from` that first forward is cut
to what the cache does not hold, as plain `generate` does for a cache passed in. Greedy decoding only (the first draft
is the argmax of the recorded logits); calls on the same target must not run concurrently (the cut is set on the
target instance for the duration of the call).
"""

from __future__ import annotations

import time

import torch
from transformers import DynamicCache

from .._compat import CACHE
from ..prefill import Prefill, PromptCache, load_prefill


class RecordedCache(DynamicCache):
    """The target's recorded prompt forward, passed to `generate` as its cache, with the drafter's record beside it
    (`draft`): what `generate_from` hands to the candidate generator, explicitly, through the one cache argument
    `generate` takes (transformers' own drafter loop starts its `DynamicCache` from it, rift's generator compresses
    it as after its own prompt forward)."""

    def __init__(self, config, draft: Prefill | None = None):
        super().__init__(config=config)
        self.draft = draft


def recorded_draft(cache) -> Prefill | None:
    """The drafter's recorded prompt forward a `generate_from` call passed with the target's cache, or None."""
    return cache.draft if isinstance(cache, RecordedCache) else None


def target_cache(target, prompt_cache: PromptCache, draft: Prefill | None = None) -> RecordedCache:
    """A fresh cache holding the target's recorded prompt forward (and `draft`, the drafter's, beside it)."""
    cache = RecordedCache(target.config.get_text_config(decoder=True), draft)
    load_prefill(cache, prompt_cache.target)
    return cache


def generate_from(target, prompt_cache: PromptCache, *, assistant_model=None, **generate_kwargs):
    """
    `target.generate(prompt_cache.input_ids, ...)` started from the recorded prompt forwards.

    Args:
        target: the model that recorded `prompt_cache.target`.
        prompt_cache (`PromptCache`): the prompt's records (`PromptCache.compute`); with `assistant_model` it must hold
            the drafter's (`draft`).
        assistant_model: the drafter, for assisted generation (transformers' own, or rift's with
            `cache_implementation="rift"`).
        generate_kwargs: passed to `generate` (greedy: `do_sample=True` is refused).

    Returns:
        `(output, seconds)`: what `generate` returned (the prompt and the new tokens) and its wall-clock time.
    """
    if generate_kwargs.get("do_sample") or (
        generate_kwargs.get("do_sample") is None and target.generation_config.do_sample
    ):
        raise ValueError(
            "generate_from decodes greedily (the first draft is the recorded argmax); pass do_sample=False."
        )
    given = sorted({"past_key_values", CACHE} & set(generate_kwargs))
    if given:
        raise ValueError(f"generate_from builds the target's cache from the prompt cache; drop `{given[0]}`.")
    if assistant_model is not None and prompt_cache.draft is None:
        raise ValueError(
            "This prompt cache holds no drafter record; compute it with PromptCache.compute(target, ids, draft=...)."
        )
    if prompt_cache.target.tokens != prompt_cache.input_ids.shape[1] - 1:
        raise ValueError(
            f"The target record holds {prompt_cache.target.tokens} tokens, not the prompt's "
            f"{prompt_cache.input_ids.shape[1]} minus the last one; compute it with PromptCache.compute."
        )
    cache = target_cache(target, prompt_cache, prompt_cache.draft if assistant_model is not None else None)
    ids = prompt_cache.input_ids.to(target.device)
    if assistant_model is not None:
        _cut_first_forward(target, cache)
    try:
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        tick = time.perf_counter()
        with torch.no_grad():
            out = target.generate(
                ids, assistant_model=assistant_model, do_sample=False, **{CACHE: cache}, **generate_kwargs
            )
        if target.device.type == "cuda":
            torch.cuda.synchronize(target.device)
        seconds = time.perf_counter() - tick
    finally:
        target.__dict__.pop("prepare_inputs_for_generation", None)
    return out, seconds


def _cut_first_forward(target, cache) -> None:
    """Make the assisted loop's first target forward feed only what `cache` does not hold yet (an instance attribute,
    removed by `generate_from`)."""
    prepare = type(target).prepare_inputs_for_generation

    def prepare_inputs(input_ids, *args, next_sequence_length=None, is_first_iteration=False, **kwargs):
        if is_first_iteration and next_sequence_length is None and kwargs.get(CACHE) is cache:
            next_sequence_length = input_ids.shape[1] - cache.get_seq_length()
        return prepare(
            target,
            input_ids,
            *args,
            next_sequence_length=next_sequence_length,
            is_first_iteration=is_first_iteration,
            **kwargs,
        )

    target.prepare_inputs_for_generation = prepare_inputs
