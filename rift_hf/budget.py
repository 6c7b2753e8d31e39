"""One place a budget becomes sizes: a token count or a fraction of the prompt turned into tokens, a config fitted to
a short prompt, and the working set's layout (sinks, the recent window, the selection) a cache is built with.

`RiftConfig.fitted` and `RiftConfig.resolve_budget` are these functions; the cache and the prompt pass call `layout`.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from .policies import is_resolver, policy_class
from .storage import Quantizer

# The drafter reads a prompt in chunks of this many tokens by default (`RiftConfig.prompt_chunk`)...
DEFAULT_CHUNK = 1024
# ... where that was measured to keep retention within 0.02 of one forward's (16 prompts each at ~4K and at ~16K, by
# replay); at ~32K (8 prompts, bf16) it lost 0.19 in `repeat` (docs/results/prompt-pass.md), so a longer prompt is
# read in one forward unless `prompt_chunk` (or `prompt_budget`, the chunked pass's working set) is set.
CHUNKED_UP_TO = 16385


def tokens(budget: int | float, prompt_length: int) -> int:
    """`budget` in tokens: an int is a count, a float a fraction of a `prompt_length`-token prompt (at least 1)."""
    return budget if isinstance(budget, int) else max(1, int(budget * prompt_length))


def fit(config, prompt_length: int):
    """
    `config` for a prompt of `prompt_length` tokens. `auto` becomes the policy it picks for that length, with that
    policy's own defaults; a prompt longer than `CHUNKED_UP_TO` is read in one forward unless `prompt_chunk` or
    `prompt_budget` is set. A fractional budget can be smaller than the observation window (or a block) on a short
    prompt; the window and block size then shrink to fit it (and `n_sink` to below it), so the defaults work on any
    prompt. An int budget is checked at construction and never changed.
    """
    if is_resolver(config.policy):
        return fit(policy_class(config.policy).resolve(config, prompt_length), prompt_length)
    if config.prompt_chunk is None and config.prompt_budget is None and prompt_length > CHUNKED_UP_TO:
        config = dataclasses.replace(config, prompt_chunk=0)
    policy = policy_class(config.policy)
    if not policy.compresses or isinstance(config.budget, int):
        return config
    budget = tokens(config.budget, prompt_length)
    room = max(1, budget - config.n_sink)
    window = min(config.window, room) if policy.scored else config.window
    block_size = min(config.block_size, room) if "block_size" in policy.params else config.block_size
    if (window, block_size) == (config.window, config.block_size) and config.n_sink < budget:
        return config
    return dataclasses.replace(config, window=window, block_size=block_size, n_sink=min(config.n_sink, budget - 1))


def resolve(config, prompt_length: int) -> int | float:
    """The budget in tokens for a prompt of `prompt_length` tokens, validated (a short prompt's may be too small for
    the config as given: `fit` it first); `math.inf` for a policy that does not compress."""
    if is_resolver(config.policy):
        config = fit(config, prompt_length)
    policy = config.policy_object
    if not policy.compresses:
        return math.inf
    budget = tokens(config.budget, prompt_length)
    policy.check_budget(budget)
    return policy.round_budget(budget)


def layout(config, prompt_length: int, like: torch.Tensor) -> tuple:
    """`(config, budget, recent, n_select)` for a prompt of `prompt_length` tokens: the config fitted to it, the
    budget in tokens (inf for the full cache), the recent window and the selection's size. With `kv_equal_bytes` the
    budget is bytes: the selection's full-precision rows become as many `kv_dtype` rows as fit in their bytes (counted
    as if the model ran in `kv_equal_bytes`' dtype if it names one); `like` is a key tensor of the model's."""
    config = fit(config, prompt_length)
    budget = resolve(config, prompt_length)
    if budget == math.inf:
        return config, budget, 0, 0
    recent = config.recent_tokens(budget)
    n_select = budget - recent - config.n_sink
    if config.kv_equal_bytes:
        if config.kv_equal_bytes is not True:
            like = like.new_zeros(1, 1, 1, like.shape[-1], dtype=getattr(torch, config.kv_equal_bytes))
        keys, values = (
            Quantizer(like, config.kv_dtype, config.kv_group_size, per_channel)
            for per_channel in (True, False)  # keys per channel, values per token
        )
        ratio = 2 * like.shape[-1] * like.element_size() / (keys.row_bytes(like) + values.row_bytes(like))
        n_select = config.policy_object.round_selection(keys.unpadded(int(n_select * ratio)))
        budget = config.n_sink + recent + n_select
    return config, budget, recent, n_select
