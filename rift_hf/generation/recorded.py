"""Drafting after a recorded prompt forward (`generate_from`, `decode.py`): the lab's decode-phase runs start the
drafter from a record of its prompt pass instead of paying it per run."""

from __future__ import annotations

import time

import torch
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

from ..cache.reading import chunk_plan
from ..prefill import Prefill, load_prefill
from .candidate import RiftCandidateGenerator


class RecordedPromptGenerator(RiftCandidateGenerator):
    """
    `RiftCandidateGenerator` whose drafter cache starts from `prefill`, the drafter's recorded prompt forward (the
    whole prompt and its last logits): each policy compresses its own copy exactly as after its own prompt forward, and
    the first draft is the argmax of the recorded logits, so the run equals one that computed the prompt itself.
    The pass is already paid, so the step-aside rule has nothing to repay.
    """

    def __init__(self, input_ids, assistant_model, generation_config, model_kwargs, *args, prefill: Prefill, **kwargs):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, *args, **kwargs)
        self._first_logits = None
        if chunk_plan(self.cache, input_ids.shape[-1], input_ids.shape[-1] - 1):
            return  # a recorded prompt forward is a whole pass: this policy reads the prompt in chunks itself
        config = self.rift_config
        if (config.is_scored or config.track_attention_mass) and not prefill.serves(assistant_model, config.window):
            raise ValueError(
                f"The drafter's recorded prompt forward ran on the {prefill.backend!r} attention backend with "
                f"{min(q.shape[2] for q, _, _ in prefill.queries.values()) if prefill.queries else 0} queries, "
                f"but policy {config.policy!r} runs on {assistant_model.config._attn_implementation!r} with window "
                f"{config.window}; compute the prompt cache with window >= {config.window} (PromptCache.compute "
                "switches the drafter to 'rift')."
            )
        tick = time.perf_counter()
        load_prefill(self.cache, prefill)
        self.stats.prompt_load_seconds = time.perf_counter() - tick
        self._first_logits = prefill.logits
        self.plan.payoff = None  # the drafter's prompt pass is recorded, already paid: nothing to repay

    def _update_past_and_masks(self, input_ids, *args, **kwargs) -> bool:
        if self._first_logits is not None:  # the cache holds exactly the prompt: nothing to crop yet
            self._extend_inputs(input_ids.shape[-1])
            return True
        return super()._update_past_and_masks(input_ids, *args, **kwargs)

    def _draft(self, generation_args: dict):
        return (
            self._draft_from_prefill(generation_args)
            if self._first_logits is not None
            else super()._draft(generation_args)
        )

    def _draft_from_prefill(self, generation_args: dict):
        """The first round after a recorded prompt forward: the first draft is the argmax of its logits under the
        processors the drafter's own `generate` would apply; the drafter's `generate` continues from there."""
        ids = generation_args[self.input_ids_key]
        logits, self._first_logits = self._first_logits.to(ids.device).float(), None
        minimum, maximum = generation_args["min_new_tokens"], generation_args["max_new_tokens"]
        scores = logits
        for processor in self.logits_processor:
            scores = processor(ids, scores)
        eos = self.generation_config.eos_token_id
        eos = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        if minimum > 0 and eos:
            scores = MinNewTokensLengthLogitsProcessor(ids.shape[1], minimum, eos)(ids, scores)
        token = scores.argmax(-1, keepdim=True)
        first_ids, first_scores = torch.cat([ids, token], dim=-1), scores[:, None]
        threshold = self.generation_config.assistant_confidence_threshold
        confident = not threshold or float(scores.softmax(-1)[0, token[0, 0]]) >= threshold
        if maximum == 1 or int(token) in eos or not confident:
            return first_ids, first_scores
        self._extend_inputs(first_ids.shape[1])
        rest = {
            **generation_args,
            self.input_ids_key: first_ids,
            "min_new_tokens": max(0, minimum - 1),
            "max_new_tokens": maximum - 1,
        }
        candidate_ids, candidate_logits = super()._draft(rest)
        return candidate_ids, torch.cat([first_scores.to(candidate_logits.dtype), candidate_logits], dim=1)
