"""Reading a prompt in chunks: the drafter's prompt pass in bounded memory (`RiftConfig.prompt_chunk`).

Without it the drafter reads the whole prompt in one forward, holding every key and value at full precision, and its
attention over the prompt costs time quadratic in the prompt. In chunks, each chunk's queries attend the layer's
working set (sinks, what the policy keeps so far, the recent window) plus the chunk itself, each chunk's keys and
values go to the store where the policy keeps one, and the policy chooses the working set again after each chunk by
its own rule. A store policy reads with a smaller working set (`prompt_budget`) and chooses its real one from the
store once the prompt is read; a policy without a store can only keep what it kept while reading, so it reads with
its budget. The drafter then holds at most its working set plus one chunk at full precision (and the store).

The drafter's keys and values after the prompt are then approximate (its later tokens attended only what the working
set held); the target verifies every draft, so this costs acceptance, never correctness. Linear-attention, SSM and
sliding-window layers are unchanged by it: they read the chunks as they would the whole prompt.

A retrieval policy (`page-retrieval`), which keeps every token by design, reads the prompt in one forward.
`read_prompt(model, cache, input_ids, upto)` runs the chunks; `RiftCandidateGenerator` and replay call it before the
drafter's first forward, which then feeds the rest of the prompt as usual.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .._compat import CACHE
from ..budget import tokens as budget_tokens


@dataclass
class PromptReading:
    """A prompt being read in chunks into a `RiftCache` (`cache.reading`): its length, and the final `(budget, recent,
    n_select)` the reading sizes stand in for until `end_reading` (set once the cache resolves its budget)."""

    length: int
    final: tuple | None = None


def begin_reading(cache, prompt_length: int) -> None:
    """The next forwards feed a prompt of `prompt_length` tokens into `cache` in chunks: the budget is resolved for the
    whole prompt, the working set kept at the reading sizes (`reading_sizes`) and chosen again after every chunk
    (`RiftCache.commit_chunk`) until `end_reading`."""
    if cache.get_seq_length():
        raise RuntimeError("A prompt is read in chunks into an empty cache; this one already holds tokens.")
    cache.reading = PromptReading(prompt_length)


def end_reading(cache) -> None:
    """The prompt is read: every compressed layer of `cache` gets its final working set, chosen afresh at the final
    sizes (from its store) where it read with smaller ones."""
    reading, cache.reading = cache.reading, None
    if reading is None or reading.final is None:
        return
    resized = reading.final != (cache.budget, cache.recent, cache.n_select)
    cache.budget, cache.recent, cache.n_select = reading.final
    if resized:
        for layer in cache.rift_layers:
            layer.selected, layer.compressed = None, False
        cache.commit_chunk()


def chunk_plan(cache, prompt_length: int, upto: int) -> int:
    """The chunk size `cache` reads a prompt of `prompt_length` tokens with (its first `upto` tokens fed in chunks),
    or 0 when it reads the prompt in one forward: chunks off, nothing compressed, or a prompt the budget would keep
    whole or that fits in one chunk."""
    config = cache.config.fitted(prompt_length)
    chunk, policy = config.reading_chunk, config.policy_object
    # A retrieval policy (page-retrieval) keeps every token and has each query gather its own rows: a chunk of queries
    # would gather a chunk's worth of copies, so it reads the prompt in one forward.
    if not chunk or not cache.rift_layers or cache.get_seq_length() or not policy.compresses or policy.retrieves:
        return 0
    budget = config.resolve_budget(prompt_length)
    if budget == float("inf") or prompt_length <= budget or upto <= chunk:
        return 0
    return chunk


def reading_sizes(config, prompt_length: int, budget: int, recent: int, n_select: int) -> tuple[int, int, int]:
    """`(budget, recent, n_select)` while reading a prompt of `prompt_length` tokens whose final sizes are given: a
    store policy's `prompt_budget` (at most its budget), laid out by the policy's own rule; the final sizes otherwise
    (a policy without a store keeps only what it kept while reading)."""
    policy = config.policy_object
    if not config.keeps_store or policy.retrieves or config.prompt_budget is None:
        return budget, recent, n_select
    tokens = policy.round_budget(max(budget_tokens(config.prompt_budget, prompt_length), config.n_sink + config.window))
    if tokens >= budget:
        return budget, recent, n_select
    reading_recent = config.recent_tokens(tokens)
    return tokens, reading_recent, policy.round_selection(tokens - reading_recent - config.n_sink)


def read_prompt(model, cache, input_ids: torch.Tensor, upto: int, attention_mask: torch.Tensor | None = None) -> int:
    """
    Feed `input_ids[:, :upto]` (`[1, T]`, the whole prompt; its length is what a fractional budget is a fraction of)
    through `model` into the empty `cache` in chunks, the cache choosing its working set after each (`chunk_plan`).
    Returns the number of tokens fed: 0 when the cache reads the prompt in one forward (nothing is done then), else
    `upto`; the caller feeds the rest as it would have fed the whole prompt.
    """
    prompt_length = input_ids.shape[-1]
    chunk = chunk_plan(cache, prompt_length, upto)
    if not chunk:
        return 0
    begin_reading(cache, prompt_length)
    try:
        with torch.no_grad():
            for start in range(0, upto, chunk):
                stop = min(start + chunk, upto)
                kwargs = {}
                if attention_mask is not None:
                    kwargs["attention_mask"] = attention_mask[:, :stop]
                model(
                    input_ids=input_ids[:, start:stop].to(model.device),
                    position_ids=torch.arange(start, stop, device=model.device)[None],
                    **{CACHE: cache},
                    use_cache=True,
                    logits_to_keep=1,
                    **kwargs,
                )
                cache.commit_chunk()
    finally:
        end_reading(cache)
    return upto
