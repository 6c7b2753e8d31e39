"""`RiftCandidateGenerator`: transformers' drafter loop with a RIFT-compressed drafter cache and statistics."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import torch
from transformers.generation.candidate_generator import (
    AssistedCandidateGenerator,
    _prepare_attention_mask,
    _prepare_position_ids,
    _prepare_token_type_ids,
)
from transformers.generation.logits_process import MinNewTokensLengthLogitsProcessor

from .._compat import CACHE
from ..attention import use_rift_attention
from ..cache import RiftCache
from ..cache.reading import chunk_plan, read_prompt
from ..config import RiftConfig
from ..prefill import load_prefill
from .compiled import CompiledDrafting
from .draft_length import DraftLength
from .payoff import Payoff
from .stateful import VerifierCache
from .stats import RiftStats


def draft_entropy(logits: torch.Tensor) -> list[float]:
    """
    Entropy of each of the drafter's next-token distributions (`[drafted, vocab]` scores as drafting saw them).

    Tokens a logits processor removed (score -inf, e.g. EOS under `min_new_tokens`) have probability 0 and add 0
    (`entr(0) = 0`; `p * log p` would make the whole entropy nan).
    """
    return torch.special.entr(torch.softmax(logits.float(), -1)).sum(-1).tolist()


# target -> {drafter: the last call's DraftLength}: what the cost-aware draft length learnt, for the next call.
_LEARNT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# target -> {drafter: the last call's Payoff}: what the step-aside rule learnt of the drafter's prompt pass.
_PAYOFFS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _acceptance_seen(controller: DraftLength | None) -> tuple[float, float]:
    """`(accepted, weighed)` over the draft positions a call's controller observed (decayed counts; 0, 0 before it
    drafted)."""
    seen = [] if controller is None else controller.accepted
    return sum(a for a, _ in seen), sum(w for _, w in seen)


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
        # The cost-aware draft length (`draft_length="auto"`): at most the drafter's `num_assistant_tokens`.
        self.draft_length = None
        # With it, the step-aside rule (`payoff.py`): the first two rounds time the target alone, then the call
        # either drafts or leaves the target to decode alone (`stepped_aside`).
        self.payoff: Payoff | None = None
        self.target, self.stepped_aside, self._learnt_acceptance = target, False, (0.0, 0.0)
        self._drafted_before = False  # a round of this call drafted (its first read the prompt)
        if self.rift_config.draft_length == "auto":
            longest = max(1, int(self.num_assistant_tokens))
            learnt = None if target is None else _LEARNT.get(target, {}).get(assistant_model)
            self._learnt_acceptance = _acceptance_seen(learnt)
            if learnt is not None and learnt.max_length == longest:
                self.draft_length = learnt.resume()
            else:
                self.draft_length = DraftLength(max_length=longest)
            if target is not None:
                _LEARNT.setdefault(target, weakref.WeakKeyDictionary())[assistant_model] = self.draft_length
            if target is not None and self.rift_config.step_aside:
                earlier = _PAYOFFS.get(target, {}).get(assistant_model)
                self.payoff = earlier.resume() if earlier is not None else Payoff()
                _PAYOFFS.setdefault(target, weakref.WeakKeyDictionary())[assistant_model] = self.payoff
        self._candidates_at: float | None = None
        target_cache = model_kwargs.get(CACHE)
        self.target_cache = target_cache if isinstance(target_cache, VerifierCache) else None
        # A recorded prompt forward (`generate_from`): the cache starts from it and the first draft comes from its
        # logits, so the run equals one that computed the prompt itself.
        self._first_logits = None
        from .decode import DRAFT_PREFILL

        prefill = DRAFT_PREFILL.get()
        if prefill is not None and chunk_plan(self.cache, input_ids.shape[-1], input_ids.shape[-1] - 1):
            prefill = None  # a recorded prompt forward is a whole pass: this policy reads the prompt in chunks itself
        if prefill is not None:
            scored = self.rift_config.is_scored or self.rift_config.track_attention_mass
            if scored and not prefill.serves(assistant_model, self.rift_config.window):
                raise ValueError(
                    f"The drafter's recorded prompt forward ran on the {prefill.backend!r} attention backend with "
                    f"{min(q.shape[2] for q, _, _ in prefill.queries.values()) if prefill.queries else 0} queries, "
                    f"but policy {self.rift_config.policy!r} runs on {assistant_model.config._attn_implementation!r} "
                    f"with window {self.rift_config.window}; compute the prompt cache with window >= "
                    f"{self.rift_config.window} (PromptCache.compute switches the drafter to 'rift')."
                )
            tick = time.perf_counter()
            load_prefill(self.cache, prefill)
            self.stats.prompt_load_seconds = time.perf_counter() - tick
            self._first_logits = prefill.logits
            self.payoff = None  # the drafter's prompt pass is recorded, already paid: nothing to repay

    def get_candidates(self, input_ids, **kwargs):
        if (self.payoff is not None and not self.payoff.ready) or self.stepped_aside:
            self.num_assistant_tokens = 0  # timing the target alone, or stepped aside for the rest of the call
        elif self.payoff is not None and self.payoff.estimate is None and not self._speculate(input_ids):
            self.stepped_aside = self.stats.stepped_aside = True
            self.num_assistant_tokens = 0
        elif self.draft_length is not None:
            self.num_assistant_tokens = self.draft_length.choose()
        self._round_start = input_ids.shape[-1]
        candidates = super().get_candidates(input_ids, **kwargs)
        self._candidates_at = time.perf_counter()  # the target's side of the round starts here
        return candidates

    def _update_past_and_masks(self, input_ids, *_, **__) -> bool:
        """Crop the drafter's cache to all but the last two tokens and extend its inputs, as transformers 5.23 does
        (5.25 keeps one more token and skips the crop when every draft was accepted; each crop is where the cache
        commits, and replay mirrors this loop, so it is the same on every version)."""
        if self._first_logits is None:  # after a recorded prompt forward the cache holds exactly the prompt
            keep = input_ids.shape[-1] - 2
            if self._verified_upto is not None:
                # After rounds without drafting (`draft_length="auto"`) all but the last two tokens reach past the
                # last drafting round, whose rejected drafts would otherwise stay in the cache: crop to its verified
                # tokens, and the drafter re-feeds what the target emitted alone.
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
        candidate_ids, candidate_logits = super()._generate_candidates(rest)
        return candidate_ids, torch.cat([first_scores.to(candidate_logits.dtype), candidate_logits], dim=1)

    def _generate_candidates(self, generation_args: dict):
        device = self.assistant_model.device
        if self._first_logits is None and self.cache.get_seq_length() == 0:
            self._read_prompt(generation_args[self.input_ids_key])
        _sync(device)
        tick = time.perf_counter()
        forwards, hooks = [], ()
        if self.draft_length is not None:
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
                if self._first_logits is not None:
                    candidate_ids, candidate_logits = self._draft_from_prefill(generation_args)
                else:
                    candidate_ids, candidate_logits = super()._generate_candidates(generation_args)
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
            self.draft_length.observe_idle(idle_runs((refed[0][0, :-1].argmax(-1) == ids).tolist()))
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
            self.draft_length is None
            or self.draft_length.missed == 0
            or self._first_logits is not None
            or self.generation_config.do_sample
            or not self.assistant_model._supports_logits_to_keep()
        ):
            return 0
        fed = generation_args[self.input_ids_key].shape[-1] - self.cache.get_seq_length()
        return max(0, min(self.draft_length.missed, fed - 1, 16))

    def _speculate(self, input_ids) -> bool:
        """The step-aside rule's decision (`Payoff.decide`), once the first two rounds timed the target alone."""
        go = self.payoff.decide(
            self.target,
            self.assistant_model,
            prompt_tokens=input_ids.shape[-1],
            new_tokens=max(0, self.main_model_max_length - input_ids.shape[-1]),
            max_length=self.draft_length.max_length,
            seen=self._learnt_acceptance,
            config=self.rift_config,
            measured=self.draft_length,
        )
        self.stats.payoff = self.payoff.estimate
        return go

    def update_candidate_strategy(self, input_ids, scores, num_matches):
        super().update_candidate_strategy(input_ids, scores, num_matches)
        if self._pending is not None and self._pending["drafted"]:
            self._verified_upto = self._round_start + int(num_matches)
        # A round without drafting (the length limit left no room, or the target alone was faster) still costs one
        # target step.
        pending = self._pending or {"drafted": 0, "draft_seconds": 0.0, "entropy": [], "forwards": []}
        verify = None if self._candidates_at is None else time.perf_counter() - self._candidates_at
        accepted = int(num_matches)
        reason = None
        if self.payoff is not None and (not self.payoff.ready or self.stepped_aside):
            # The step-aside rule's rounds: the target alone, timed before the decision, then for good.
            reason = "stepped aside" if self.stepped_aside else "target first"
            if not self.payoff.ready:
                self.payoff.observe_target(verify or 0.0)
        elif self.draft_length is not None:
            reason = self.draft_length.chosen[-1][1]
            if self.payoff is not None and pending["drafted"] and not self._drafted_before:
                # The call's first drafting round: its first forward read the prompt (with what a chunked pass read
                # before it), what the rule estimated.
                first = pending["forwards"][0] if pending["forwards"] else 0.0
                self.payoff.learn_pass((self.stats.prompt_read_seconds or 0.0) + first)
            self.draft_length.observe(
                pending["drafted"], accepted, pending["draft_seconds"], verify, pending["forwards"]
            )
        self.stats.record_round(
            self.cache, pending["drafted"], accepted, pending["draft_seconds"], pending["entropy"], verify, reason
        )
        self._drafted_before = self._drafted_before or bool(pending["drafted"])
        self._pending = None
        if self.draft_length is not None:
            # The next round's length is chosen afresh; between rounds (and after the call, when transformers writes a
            # heuristic schedule's length back into the drafter's generation config) it reads as the longest.
            self.num_assistant_tokens = self.draft_length.max_length
