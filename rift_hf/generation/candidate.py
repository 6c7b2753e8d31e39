"""`RiftCandidateGenerator`: transformers' drafter loop with a RIFT-compressed drafter cache and statistics."""

from __future__ import annotations

import time

import torch
from transformers.generation.candidate_generator import AssistedCandidateGenerator

from ..cache import RiftCache
from ..config import RiftConfig
from .stats import RiftStats


def use_rift_attention(model, config: RiftConfig) -> None:
    """Switch `model` to the "rift" attention backend when the policy needs the queries it sees."""
    if not (config.is_scored or config.track_attention_mass):
        return
    if model.config._attn_implementation == "rift":
        return
    try:
        model.set_attn_implementation("rift")
    except (ValueError, NotImplementedError) as err:
        raise ValueError(
            f"Policy {config.policy!r} needs the 'rift' attention backend, which {type(model).__name__} cannot use "
            f"({err}); choose 'swa' or 'full', or load the model with attn_implementation='rift'."
        ) from err


def draft_entropy(logits: torch.Tensor) -> list[float]:
    """
    Entropy of each of the drafter's next-token distributions (`[drafted, vocab]` scores as drafting saw them).

    Tokens a logits processor removed (score -inf, e.g. EOS under `min_new_tokens`) have probability 0 and add 0
    (`entr(0) = 0`; `p * log p` would make the whole entropy nan).
    """
    return torch.special.entr(torch.softmax(logits.float(), -1)).sum(-1).tolist()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RiftCandidateGenerator(AssistedCandidateGenerator):
    """
    Drafts with `assistant_model` over a `RiftCache`; the target's cache is untouched, so output is lossless.

    Args:
        rift_config (`RiftConfig`): the drafter cache policy. Other arguments as `AssistedCandidateGenerator`.

    After `generate`, `rift_hf.last_stats(target)` returns the `RiftStats` this generator recorded.
    """

    def __init__(
        self,
        input_ids,
        assistant_model,
        generation_config,
        model_kwargs,
        inputs_tensor=None,
        logits_processor=None,
        rift_config: RiftConfig | None = None,
    ):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        self.rift_config = RiftConfig.coerce(rift_config)
        # The drafter gets its cache from us, not from `generate` (which would also refuse a cache plus a name).
        self.generation_config.cache_implementation = None
        self.generation_config.cache_config = None
        use_rift_attention(assistant_model, self.rift_config)
        self.cache = RiftCache(assistant_model.config, self.rift_config)
        self.cache.activate_past_recording()
        self.assistant_kwargs["past_key_values"] = self.cache
        self.stats = RiftStats(policy=self.rift_config.policy)
        self._pending: dict | None = None
        target_cache = model_kwargs.get("past_key_values")
        self.target_cache = target_cache if isinstance(target_cache, RiftCache) and target_cache.verifier else None

    def _generate_candidates(self, generation_args: dict):
        device = self.assistant_model.device
        _sync(device)
        tick = time.perf_counter()
        candidate_ids, candidate_logits = super()._generate_candidates(generation_args)
        self.cache.settle()
        _sync(device)
        drafted = candidate_ids.shape[1] - generation_args[self.input_ids_key].shape[1]
        if self.target_cache is not None:
            self.target_cache.pending_drafts = drafted
        entropy = draft_entropy(candidate_logits[0])
        self._pending = {"drafted": drafted, "draft_seconds": time.perf_counter() - tick, "entropy": entropy}
        return candidate_ids, candidate_logits

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        super().update_candidate_strategy(input_ids, scores, num_matches)
        # A round without drafting (the length limit left no room) still costs one target step.
        pending = self._pending or {"drafted": 0, "draft_seconds": 0.0, "entropy": []}
        self.stats.record_round(
            self.cache, pending["drafted"], int(num_matches), pending["draft_seconds"], pending["entropy"]
        )
        self._pending = None
