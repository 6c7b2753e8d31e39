"""auto (the default): not a policy but the rule that names one by prompt length, once the cache sees the prompt.

Below `LONG_PROMPT` tokens it is page-round; from there on rift-dyn with scores carried 128 tokens forward and an int4
store. Measured by exact replay on our pair (qwen-coder, 16 prompts at 4x, repeat / continue; docs/results/scoring.md
and docs/results/long-inputs.md; page-round's figures from before it chose again inside a round, `rechoose_after`): at
~4K page-round keeps 0.99 / 0.96 of the full cache's AL where rift-dyn@tokens_ahead=128 keeps 1.00 / 0.87; at ~16K the
two tie (page-round 1.006 / 0.989, rift-dyn with an int4 store 1.016 / 0.972); at ~32K page-round keeps 0.93 / 0.99
and rift-dyn with an int4 store 1.10 / 0.98, with less drafter memory (its working set plus store 0.53x the full
cache's, page-round 0.60x). What page-round misses at 32K is where the drafter reads next, not its page summaries:
carrying scores forward holds it. In real runs (8 prompts, bf16, this CPU, the cost-aware length) rift-dyn with the
int4 store ran 1.82x the target alone at ~16K (page-round 1.73x) and 1.60x at ~32K (page-round 1.45x):
docs/results/long-inputs.md, "The default by prompt length".

`RiftConfig.fitted(prompt_length)` makes the choice: a config of the chosen policy, with that policy's own defaults.
Before that a config naming `auto` has no policy object (`RiftConfig.policy_object` says to fit it first); what is known
of it is what both choices share, as class attributes here (`RiftConfig.policy_type`): both score, keep a store (so a
cache built before the prompt gets store layers) and keep it in int4; it may set only the fields both read (`params`),
and it is valid only if it is valid for each choice (`check`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from .base import StorePolicy, register_resolver

# Prompts of at least this many tokens get rift-dyn: between ~16K, where the two tie, and ~32K, where page-round loses.
LONG_PROMPT = 16384


@register_resolver
class Auto:
    """Picks page-round or rift-dyn by prompt length (`choice`); what both share is known before (the attributes)."""

    name: ClassVar[str] = "auto"
    mode: ClassVar[type] = StorePolicy  # the base both choices have, which decides a cache's layer class
    compresses: ClassVar[bool] = True
    scored: ClassVar[bool] = True
    keeps_store: ClassVar[bool] = True
    retrieves: ClassVar[bool] = False
    store_dtype: ClassVar[str] = "int4"  # what `store_dtype="auto"` becomes: both keep an int4 store
    params: ClassVar[frozenset[str]] = frozenset({"window"})  # the only policy field both read
    # What a config naming `auto` holds in the fields a chosen policy fills (saved configs hold these); `fitted`
    # replaces them with the choice's own.
    block_size: ClassVar[int] = 16
    pages_ahead: ClassVar[int] = 0
    rechoose_after: ClassVar[int] = 0

    @staticmethod
    def choice(prompt_length: int) -> dict:
        """The policy and its fields for a prompt of `prompt_length` tokens."""
        if prompt_length >= LONG_PROMPT:
            return {"policy": "rift-dyn", "tokens_ahead": 128}
        return {"policy": "page-round"}

    @classmethod
    def choices(cls) -> dict[int, dict]:
        """Each choice, keyed by a prompt length it is made for (the longest below `LONG_PROMPT`, and `LONG_PROMPT`)."""
        return {length: cls.choice(length) for length in (LONG_PROMPT - 1, LONG_PROMPT)}

    @classmethod
    def resolve(cls, config, prompt_length: int):
        """`config` (naming `auto`) as the config of the policy chosen for `prompt_length` tokens."""
        unset = {"block_size": None, "pages_ahead": None, "rechoose_after": None}  # the chosen policy's own
        return dataclasses.replace(config, **unset, **cls.choice(prompt_length))

    @classmethod
    def check(cls, config) -> None:
        """Raise unless `config` (naming `auto`) is valid for each choice, its budget included where it is in tokens."""
        for length, chosen in cls.choices().items():
            try:
                cls.resolve(config, length)
            except ValueError as err:
                which = f"{'>=' if length >= LONG_PROMPT else '<'} {LONG_PROMPT}"
                raise ValueError(
                    f"policy='auto' resolves to {chosen['policy']!r} for prompts of {which} tokens, and there: {err}"
                ) from None
