"""`RiftCandidateGenerator`: transformers' drafter loop with a RIFT-compressed drafter cache and statistics."""

from __future__ import annotations

import contextlib
import threading
import time

import torch
from transformers.generation.candidate_generator import (
    AssistedCandidateGenerator,
    _prepare_attention_mask,
    _prepare_position_ids,
    _prepare_token_type_ids,
)

from .._compat import CACHE
from ..attention import use_rift_attention
from ..cache import RiftCache
from ..cache.reading import read_prompt
from ..config import RiftConfig
from .compiled import CompiledDrafting
from .guide import TargetGuide
from .rounds import DraftPlan
from .stateful import VerifierCache
from .stats import RiftStats


def draft_entropy(logits: torch.Tensor) -> list[float]:
    """
    Entropy of each of the drafter's next-token distributions (`[drafted, vocab]` scores as drafting saw them).

    Tokens a logits processor removed (score -inf, e.g. EOS under `min_new_tokens`) have probability 0 and add 0
    (`entr(0) = 0`; `p * log p` would make the whole entropy nan).
    """
    return torch.special.entr(torch.softmax(logits.float(), -1)).sum(-1).tolist()


def idle_runs(correct: list[bool]) -> list[tuple[int, int]]:
    """`(accepted, drafted)` of a round starting at each of the tokens the target emitted alone, from whether the
    drafter's greedy prediction matched each: the drafts from there to the last of them (censored there), and how many
    in a row were right."""
    rounds, run = [], 0
    for i in range(len(correct) - 1, -1, -1):
        run = run + 1 if correct[i] else 0
        rounds.append((run, len(correct) - i))
    return rounds[::-1]


def _time_forwards(model, forwards: list) -> tuple:
    """
    Time each forward of `model` into `forwards` (one callable per forward, returning its seconds once the round has
    synchronised): host clocks on a CPU, CUDA events on a GPU (recorded asynchronously, read after the round's sync,
    so timing adds no synchronisation to the drafting path). Returns the hook handles to remove.
    """
    cuda = model.device.type == "cuda"
    started: list = []
    owner = threading.get_ident()  # hooks are the model's: another thread generating with it must not be timed here

    def before(*_):
        if threading.get_ident() != owner:
            return
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            started.append(event)
        else:
            started.append(time.perf_counter())

    def after(*_):
        if threading.get_ident() != owner:
            return
        start = started.pop()
        if cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            forwards.append(lambda: start.elapsed_time(end) / 1000)
        else:
            seconds = time.perf_counter() - start
            forwards.append(lambda: seconds)

    return model.register_forward_pre_hook(before), model.register_forward_hook(after)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class RiftCandidateGenerator(AssistedCandidateGenerator):
    """
    Drafts with `assistant_model` over a `RiftCache`; the target's cache is untouched, so output is lossless.

    Args:
        rift_config (`RiftConfig`): the drafter cache policy.
        target (*optional*): the target model; with it the cost-aware draft length carries what it learnt (costs,
            acceptance) from one `generate` call on this pair of models to the next, so only the first calibrates.
        Other arguments as `AssistedCandidateGenerator`.

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
        target=None,
    ):
        super().__init__(input_ids, assistant_model, generation_config, model_kwargs, inputs_tensor, logits_processor)
        self.rift_config = RiftConfig.coerce(rift_config)
        # The drafter gets its cache from us, not from `generate` (which would also refuse a cache plus a name).
        self.generation_config.cache_implementation = None
        self.generation_config.cache_config = None
        use_rift_attention(assistant_model, self.rift_config)
        self.cache = RiftCache(assistant_model.config, self.rift_config)
        self.cache.activate_past_recording()
        self.assistant_kwargs[CACHE] = self.cache
        self.stats = RiftStats(policy=self.rift_config.policy)
        # Sampling draws the target's random numbers per drafted token, so lengths chosen from measured time (the
        # default) make a seeded sampled call unrepeatable; fixed lengths repeat it (`RiftStats.repeatable`).
        self.stats.repeatable = not self.generation_config.do_sample or self.rift_config.draft_length == "fixed"
        # Compiled drafting (`compile=True`): the drafter's one-token forwards replay one compiled step.
        self.compiled = CompiledDrafting(assistant_model, self.cache) if self.rift_config.compile else None
        self._pending: dict | None = None
        # Tokens at the start of the drafter's cache that are the sequence's own (`_update_past_and_masks`): the last
        # drafting round's input plus its accepted drafts; entries past it hold rejected drafts.
        self._verified_upto: int | None = None
        self._round_start = 0
        # What each round drafts (`rounds.py`): the cost-aware length (`draft_length="auto"`, at most the drafter's
        # `num_assistant_tokens`) and the step-aside rule, or the drafter's own schedule.
        self.target = target
        self.plan = DraftPlan.for_call(
            self.rift_config, target, assistant_model, max(1, int(self.num_assistant_tokens))
        )
        self._candidates_at: float | None = None
        target_cache = model_kwargs.get(CACHE)
        self.target_cache = target_cache if isinstance(target_cache, VerifierCache) else None
        # A guided policy chooses from the target's attention at each verification (`guide.py`).
        self.guide = TargetGuide(target) if self.rift_config.is_guided else None
        if self.guide is not None and target is None:
            raise ValueError(f"Policy {self.rift_config.policy!r} reads the target's attention; pass target=.")

    def get_candidates(self, input_ids, **kwargs):
        prompt_tokens = input_ids.shape[-1]
        new_tokens = max(0, self.main_model_max_length - prompt_tokens)
        length = self.plan.length(self.target, self.assistant_model, self.rift_config, prompt_tokens, new_tokens)
        if length is not None:
            self.num_assistant_tokens = length
        self.stats.stepped_aside = self.plan.stepped_aside
        if self.plan.payoff is not None:
            self.stats.payoff = self.plan.payoff.estimate
        self._round_start = input_ids.shape[-1]
        candidates = super().get_candidates(input_ids, **kwargs)
        if self.guide is not None:
            self.guide.start()
        self._candidates_at = time.perf_counter()  # the target's side of the round starts here
        return candidates

    def _update_past_and_masks(self, input_ids, *_, **__) -> bool:
        """Crop the drafter's cache to all but the last two tokens and extend its inputs, as transformers 5.23 does
        (5.25 keeps one more token and skips the crop when every draft was accepted; each crop is where the cache
        commits, and replay mirrors this loop, so it is the same on every version)."""
        keep = input_ids.shape[-1] - 2
        if self._verified_upto is not None:
            # After rounds without drafting (`draft_length="auto"`) all but the last two tokens reach past the last
            # drafting round, whose rejected drafts would otherwise stay in the cache: crop to its verified tokens,
            # and the drafter re-feeds what the target emitted alone.
            keep = min(keep, self._verified_upto)
        remove = self.cache.get_seq_length() - keep
        if remove >= 0:
            self.cache.crop(-remove)
        self._extend_inputs(input_ids.shape[-1])
        return True

    def _extend_inputs(self, length: int) -> None:
        """The drafter's mask, position ids and token types extended to `length` tokens, as transformers' own
        `_update_past_and_masks` extends them (without its crop)."""
        encoder_decoder = self.assistant_model.config.is_encoder_decoder
        self.assistant_kwargs = _prepare_attention_mask(self.assistant_kwargs, length, encoder_decoder)
        self.assistant_kwargs = _prepare_position_ids(self.assistant_kwargs, length, encoder_decoder)
        self.assistant_kwargs = _prepare_token_type_ids(self.assistant_kwargs, length)

    def _generate_candidates(self, generation_args: dict):
        device = self.assistant_model.device
        if self.cache.get_seq_length() == 0:
            self._read_prompt(generation_args[self.input_ids_key])
        _sync(device)
        tick = time.perf_counter()
        forwards, hooks = [], ()
        if self.plan.draft_length is not None:
            hooks = _time_forwards(self.assistant_model, forwards)
        idle, refed = self._idle_tokens(generation_args), []
        if idle:
            # The first forward re-feeds what the target emitted alone: keep its logits there too, to see how many
            # drafts the rounds without drafting would have had accepted (`DraftLength.observe_idle`).
            kept = self.assistant_kwargs.get("logits_to_keep")  # what generate set (1), restored after the round
            self.assistant_kwargs["logits_to_keep"] = idle + 1
            hooks = (*hooks, self.assistant_model.register_forward_hook(lambda _m, _a, out: refed.append(out.logits)))
        try:
            with self.compiled or contextlib.nullcontext():
                candidate_ids, candidate_logits = self._draft(generation_args)
        finally:
            for hook in hooks:
                hook.remove()
            if idle:
                if kept is None:
                    self.assistant_kwargs.pop("logits_to_keep", None)
                else:
                    self.assistant_kwargs["logits_to_keep"] = kept
        if self.compiled is not None:
            if self.compiled.compiles != self.stats.compiles:
                forwards = []  # this round compiled the step (seconds to minutes): not what a drafted token costs
            self.stats.compiled_steps = self.compiled.steps
            self.stats.eager_steps = self.compiled.eager
            self.stats.compiles = self.compiled.compiles
        self.cache.settle()
        _sync(device)
        if idle and refed and refed[0].shape[1] == idle + 1:
            ids = generation_args[self.input_ids_key][0, -idle:].to(refed[0].device)
            self.plan.draft_length.observe_idle(idle_runs((refed[0][0, :-1].argmax(-1) == ids).tolist()))
        drafted = candidate_ids.shape[1] - generation_args[self.input_ids_key].shape[1]
        if self.target_cache is not None:
            self.target_cache.pending_drafts = drafted
        entropy = draft_entropy(candidate_logits[0])
        self._pending = {
            "drafted": drafted,
            "draft_seconds": time.perf_counter() - tick,
            "entropy": entropy,
            "forwards": [f() for f in forwards],
        }
        return candidate_ids, candidate_logits

    def _draft(self, generation_args: dict):
        """This round's drafts: the drafter's own `generate` over its compressed cache."""
        return super()._generate_candidates(generation_args)

    def _read_prompt(self, ids: torch.Tensor) -> None:
        """A chunked prompt pass (`prompt_chunk`): all but the prompt's last token read into the cache in chunks (the
        drafter's own `generate` then feeds that one and drafts); nothing when the policy reads it in one forward."""
        tick = time.perf_counter()
        fed = read_prompt(self.assistant_model, self.cache, ids, ids.shape[-1] - 1)
        if fed:
            _sync(self.assistant_model.device)
            self.stats.prompt_read_seconds = time.perf_counter() - tick
            self.stats.prompt_chunks = -(-fed // self.cache.config.reading_chunk)

    def _idle_tokens(self, generation_args: dict) -> int:
        """How many of the tokens this round's first forward re-feeds the target emitted without drafts, when the
        cost-aware length has a use for the drafter's greedy predictions there (at most 16: the newest), else 0."""
        if (
            self.plan.draft_length is None
            or self.plan.draft_length.missed == 0
            or self.generation_config.do_sample
            or not self.assistant_model._supports_logits_to_keep()
        ):
            return 0
        fed = generation_args[self.input_ids_key].shape[-1] - self.cache.get_seq_length()
        return max(0, min(self.plan.draft_length.missed, fed - 1, 16))

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        if self.guide is not None:
            drafted = self._pending["drafted"] if self._pending else 0
            self.cache.guide = self.guide.finish(drafted, int(num_matches))
        super().update_candidate_strategy(input_ids, scores, num_matches)
        if self._pending is not None and self._pending["drafted"]:
            self._verified_upto = self._round_start + int(num_matches)
        # A round without drafting (the length limit left no room, or the target alone was faster) still costs one
        # target step.
        pending = self._pending or {"drafted": 0, "draft_seconds": 0.0, "entropy": [], "forwards": []}
        verify = None if self._candidates_at is None else time.perf_counter() - self._candidates_at
        accepted = int(num_matches)
        reason = self.plan.observe(
            pending["drafted"], accepted, pending["draft_seconds"], verify, pending["forwards"],
            self.stats.prompt_read_seconds or 0.0,
        )  # fmt: skip
        self.stats.record_round(
            self.cache, pending["drafted"], accepted, pending["draft_seconds"], pending["entropy"], verify, reason
        )
        self._pending = None
        if self.plan.draft_length is not None:
            # The next round's length is chosen afresh; between rounds (and after the call, when transformers writes a
            # heuristic schedule's length back into the drafter's generation config) it reads as the longest.
            self.num_assistant_tokens = self.plan.draft_length.max_length
