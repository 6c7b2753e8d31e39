"""Whether speculation can repay the drafter's prompt pass: the default steps aside when it cannot.

Before its first draft the drafter must read the whole prompt, which costs a fraction of the target's own prompt
forward (about 0.3x for a drafter a third the target's size on a CPU, more as attention grows with the prompt). Only
the tokens generated afterwards can repay it: each saves the target step it replaces, less what drafting and
verification cost. With a long prompt and few new tokens nothing repays it, and assisted generation ends up slower
than the target alone.

So with the cost-aware draft length (`draft_length="auto"`, the default) the first two rounds run the target alone:
the first times the target's prompt forward `T`, the second one target step `t`. Then, with `M` tokens left to
generate (`max_new_tokens` less those two):

- the drafter's prompt pass is estimated as `T` times the ratio of the two models' prompt-forward FLOPs (linear layers
  over every token, attention over what each token attends: the whole prefix, or the reading working set of a
  chunked pass), corrected by what earlier calls on this pair measured against that estimate;
- a drafter step as a one-token forward of the drafter (its weights; timed on the first call that asks, then reused
  for the drafter's life: two forwards cost a quarter second for a 0.5B model on a CPU, most of what a call that
  steps aside paid over the target alone), plus its cache's share, or what earlier calls on this pair measured (the
  draft-length controller's costs) where that is dearer;
- acceptance per draft position as the last call's on this pair, leaning on `prior` (worth `prior_weight`
  observations) while that call saw few drafts;
- verification of `k + 1` tokens as `(1 + verify_slope * k)` target steps, or, once earlier calls on this pair have
  verified drafts, as the controller measured it against a one-token verification (at ~16K in bf16 on a CPU a
  20-draft verification cost well above the slope's 1.8 steps, and the rule, priced by the slope alone, expected a
  3.1x faster decode where drafting gave 1.6x: `docs/results/end-to-end.md`);
- the speed-up `s` over the target alone as the best expected tokens per second over draft lengths `1..max_length`
  (as `DraftLength` prices them) divided by `1 / t`.

Speculation goes ahead when the time it saves, `M * t * (1 - 1/s)`, exceeds `margin` times the pass's estimate;
otherwise the target decodes alone for the rest of the call and the drafter never runs. `RiftStats.payoff` records
the estimate and the decision. Greedy output is the target's either way; the decision only changes who proposes.
"""

from __future__ import annotations

import time
import weakref
from dataclasses import dataclass, field

import torch


def prompt_flops(model, tokens: int, attended: float | None = None) -> float:
    """
    FLOPs of `model`'s forward over a prompt of `tokens` tokens (logits for the last only): its linear layers over
    every token (twice its parameters, embeddings and output head left out) plus attention, each query of a
    full-attention layer over `attended` keys (default: the causal average `tokens / 2`), of a sliding-window layer
    over at most its window.
    """
    text = model.config.get_text_config(decoder=True)
    params = model.num_parameters(exclude_embeddings=True)
    head = model.get_output_embeddings()
    if head is not None and head.weight is not model.get_input_embeddings().weight:
        params -= head.weight.numel()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    full = tokens / 2 if attended is None else attended
    window = getattr(text, "sliding_window", None) or tokens
    keys = sum(
        full
        if kind == "full_attention"
        else min(window, tokens) / 2
        if "sliding" in kind or kind == "chunked_attention"
        else 0
        for kind in types
    )
    return tokens * (2.0 * params + 4.0 * heads * head_dim * keys)


def weight_bytes(model) -> int:
    """Bytes a one-token forward of `model` reads for its weights."""
    return sum(p.numel() * p.element_size() for p in model.parameters())


@dataclass
class Payoff:
    """
    The step-aside rule of one `generate` call (module docstring). `observe_target` is fed the first two rounds'
    target seconds, `decide` then says whether to draft at all.

    Args:
        prior (`float`, defaults to 0.75): acceptance per draft position assumed before this pair of models has
            drafted in this process (the Qwen2.5-Coder pair accepts 0.74-1.00 per position on our code prompts;
            chat text with other pairs is often lower, so this errs towards drafting on the first call).
        margin (`float`, defaults to 1.25): the time speculation is expected to save must exceed the drafter's
            prompt pass by this factor (the estimates are rough; losing the pass costs more than missing a gain).
        verify_slope (`float`, defaults to 0.04): a verification of `k + 1` tokens priced as `1 + verify_slope * k`
            target steps until measured (CPU: 1.2-1.5 at k = 10; a GPU is flatter).
    """

    prior: float = 0.75
    prior_weight: float = 4.0
    margin: float = 1.25
    verify_slope: float = 0.04
    pass_correction: float = 1.0  # measured / estimated drafter prompt pass, learnt over calls on this pair
    seconds: list = field(default_factory=list)  # the target's seconds in the rounds observed so far
    estimate: dict | None = None

    @property
    def ready(self) -> bool:
        return len(self.seconds) >= 2

    def observe_target(self, seconds: float) -> None:
        self.seconds.append(seconds)

    def decide(
        self, target, draft, prompt_tokens: int, new_tokens: int, max_length: int, seen: tuple, config, measured=None
    ) -> bool:
        """Whether to speculate for the `new_tokens` left, after a prompt of `prompt_tokens` (see the docstring);
        `seen` is `(accepted, observed)` draft positions of the last call on this pair; `measured` the draft-length
        controller carried over from it (`DraftLength`: its drafting and verification costs), if any."""
        prompt_seconds, step = self.seconds[0], max(self.seconds[1], 1e-6)
        attended = _attended_while_reading(config, prompt_tokens)
        ratio = prompt_flops(draft, prompt_tokens, attended) / prompt_flops(target, prompt_tokens)
        pass_seconds = prompt_seconds * ratio * self.pass_correction
        draft_step = _draft_step_seconds(draft, config, prompt_tokens)
        if measured is not None and measured.step[1] > 0:
            draft_step = max(draft_step, measured.step[0] / measured.step[1])
        verify = _verify_steps(measured, self.verify_slope, step)
        accepted, observed = seen
        a = (accepted + self.prior_weight * self.prior) / (observed + self.prior_weight)
        best, length = 1.0 / step, 0
        for k in range(1, max(1, max_length) + 1):
            tokens = (1 - a ** (k + 1)) / (1 - a) if a < 1 else k + 1.0
            rate = tokens / (k * draft_step + step * verify(k))
            if rate > best:
                best, length = rate, k
        speed_up = best * step
        saving = new_tokens * step * (1 - 1 / speed_up)
        go = saving > self.margin * pass_seconds
        self.estimate = {
            "speculate": go,
            "prompt_tokens": prompt_tokens,
            "new_tokens": new_tokens,
            "target_prompt_seconds": prompt_seconds,
            "target_step_seconds": step,
            "draft_pass_seconds": pass_seconds,
            "draft_step_seconds": draft_step,
            "acceptance": a,
            "acceptance_observed": observed,
            "draft_length": length,
            "verify_steps": verify(length) if length else 1.0,
            "speed_up": speed_up,
            "saving_seconds": saving,
        }
        return go

    def learn_pass(self, measured: float) -> None:
        """The drafter's prompt pass took `measured` seconds where `estimate` said: the next call's estimate leans on
        their ratio."""
        if self.estimate and self.estimate["draft_pass_seconds"] > 0 and measured > 0:
            self.pass_correction *= measured / self.estimate["draft_pass_seconds"]

    def resume(self) -> Payoff:
        """This rule for the next call on the same models: what it learnt of the pass's cost carries over."""
        return Payoff(self.prior, self.prior_weight, self.margin, self.verify_slope, self.pass_correction)


def _verify_steps(measured, slope: float, step: float):
    """`k -> ` the cost of verifying `k + 1` tokens in target steps: once the draft-length controller has seen a
    verification of drafts, its measured cost at `k + 1` over its one-token cost (a round without drafting; this
    call's timed step `step` where it saw none), never below 1; `1 + slope * k` before."""
    cost = None if measured is None else measured.verify_cost
    sizes = [] if cost is None else [x for x, (_, w) in cost.sums.items() if w > 0]
    if not any(x > 1 for x in sizes):
        return lambda k: 1.0 + slope * k
    one = cost(1) if 1 in sizes else step
    return lambda k: max(1.0, cost(k + 1) / max(one, 1e-9))


def _attended_while_reading(config, prompt_tokens: int) -> float | None:
    """Keys a drafter query attends on average during a chunked prompt pass (`prompt_chunk`): the reading working
    set plus half a chunk; None (the causal average) for a pass in one forward."""
    from ..cache.reading import reading_sizes

    fitted = config.fitted(prompt_tokens)
    budget = fitted.resolve_budget(prompt_tokens)
    if not fitted.reading_chunk or budget == float("inf") or prompt_tokens <= budget:
        return None
    recent = fitted.recent_tokens(budget)
    working, _, _ = reading_sizes(fitted, prompt_tokens, budget, recent, budget - recent - fitted.n_sink)
    return min(prompt_tokens / 2, working + fitted.reading_chunk / 2)


def _draft_step_seconds(draft, config, prompt_tokens: int) -> float:
    """A drafter decode step: a one-token forward without a cache (its weights, `weights_step_seconds`), scaled up by
    the bytes of the keys and values its compressed cache holds against the bytes of its weights."""
    text = draft.config.get_text_config(decoder=True)
    fitted = config.fitted(prompt_tokens)
    budget = fitted.resolve_budget(prompt_tokens)
    kept = prompt_tokens if budget == float("inf") else min(budget, prompt_tokens)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    element = next(draft.parameters()).element_size()
    kv = 2 * text.num_hidden_layers * text.num_key_value_heads * head_dim * kept * element
    return weights_step_seconds(draft) * (1 + kv / max(weight_bytes(draft), 1))


# drafter -> {(dtype, device): seconds of a one-token forward without a cache}
_WEIGHTS_STEP: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def weights_step_seconds(model) -> float:
    """A one-token forward of `model` without a cache, timed after one untimed forward on the first call for this
    model, dtype and device, and remembered for the model's life."""
    first = next(model.parameters())
    key = (first.dtype, str(first.device))
    known = _WEIGHTS_STEP.setdefault(model, {})
    if key not in known:
        token = torch.zeros(1, 1, dtype=torch.long, device=model.device)
        with torch.no_grad():
            model(input_ids=token, use_cache=False)  # warm
            tick = time.perf_counter()
            model(input_ids=token, use_cache=False)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            known[key] = time.perf_counter() - tick
    return known[key]
