"""auto (the default): a policy chosen by prompt length, once the cache sees the prompt.

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

The choice is a `RiftConfig` with the chosen policy's own fields (`RiftConfig.fitted`); `auto` itself reads only the
fields both read, so a field one of them alone reads is refused here: name that policy to set it.
"""

from __future__ import annotations

from .base import StorePolicy, register

# Prompts of at least this many tokens get rift-dyn: between ~16K, where the two tie, and ~32K, where page-round loses.
LONG_PROMPT = 16384


@register
class Auto(StorePolicy):
    name = "auto"
    params = frozenset({"window"})
    store_dtype = "int4"

    @staticmethod
    def choice(prompt_length: int) -> dict:
        """The policy and its fields for a prompt of `prompt_length` tokens."""
        if prompt_length >= LONG_PROMPT:
            return {"policy": "rift-dyn", "tokens_ahead": 128}
        return {"policy": "page-round"}

    def check_budget(self, budget: int) -> None:
        """A budget in tokens must suit both policies `auto` can resolve to (the prompt's length decides which)."""
        import dataclasses

        super().check_budget(budget)
        for length in (LONG_PROMPT - 1, LONG_PROMPT):
            chosen = self.choice(length)
            try:
                dataclasses.replace(self.config, block_size=None, pages_ahead=None, rechoose_after=None, **chosen)
            except ValueError as err:
                which = ">=" if length >= LONG_PROMPT else "<"
                raise ValueError(
                    f"policy='auto' resolves to {chosen['policy']!r} for prompts of {which} {LONG_PROMPT} tokens, and "
                    f"there: {err}"
                ) from None

    def _unresolved(self, *_, **__):
        raise RuntimeError(
            "Policy 'auto' is resolved to page-round or rift-dyn once the prompt's length is known "
            "(RiftConfig.fitted); a cache asked it to select before that."
        )

    score = select = select_pages = default_rho = _unresolved
