"""The step-aside rule: the default drafts only where speculation can repay the drafter's prompt pass."""

import time

import pytest
import torch

import rift_hf
from rift_hf import RiftConfig
from rift_hf._compat import CACHE
from rift_hf.generation import payoff
from rift_hf.generation.payoff import Payoff, prompt_flops
from tiny import draft_target_pair, make_prompt, tiny_model


def _forwards(model):
    """Forwards of `model` that read a cache (drafting), counted from now on."""
    calls = []
    handle = model.register_forward_pre_hook(
        lambda _m, _a, kwargs: calls.append(1) if kwargs.get(CACHE) is not None else None,
        with_kwargs=True,
    )
    return calls, handle


def test_a_long_prompt_and_a_short_answer_leave_the_target_alone():
    # A drafter as large as the target, a 300-token prompt and 2 tokens left after the two timing rounds: reading the
    # prompt costs about a target prompt forward, which nothing left can repay.
    # Every forward of either model costs 50 ms more, so that a busy machine's pauses (a few ms on a tiny model's step)
    # cannot make the drafter look cheaper than the target.
    target, draft = draft_target_pair("llama")
    ids = make_prompt(300, seed=1)
    calls, handle = _forwards(draft)
    slow = [model.register_forward_pre_hook(lambda *_: time.sleep(0.05)) for model in (target, draft)]
    try:
        out = target.generate(
            ids, assistant_model=draft, max_new_tokens=4, do_sample=False, cache_implementation="rift"
        )
    finally:
        for hook in (handle, *slow):
            hook.remove()
    assert torch.equal(out, target.generate(ids, max_new_tokens=4, do_sample=False))
    stats = rift_hf.last_stats(target)
    assert stats.stepped_aside and not stats.payoff["speculate"] and stats.drafted == 0
    assert not calls  # the drafter never read the prompt
    assert [r["reason"] for r in stats.rounds] == ["target first"] * 2 + ["stepped aside"] * 2
    assert "stepped_aside=True" in repr(stats)


def test_a_cheap_drafter_and_a_long_answer_draft():
    # A drafter of one narrow layer for an 8-layer target: its prompt pass is a sliver of the target's and 300 tokens
    # repay it many times over at the acceptance assumed before any drafting.
    target = tiny_model("llama", seed=1, num_hidden_layers=8, hidden_size=256, intermediate_size=1024, head_dim=32,
                        num_attention_heads=8)  # fmt: skip
    draft = tiny_model("llama", seed=2, num_hidden_layers=1)
    ids = make_prompt(20, seed=1)
    gen = {"max_new_tokens": 300, "min_new_tokens": 300, "do_sample": False}
    out = target.generate(ids, assistant_model=draft, cache_implementation="rift", **gen)
    assert torch.equal(out, target.generate(ids, **gen))
    stats = rift_hf.last_stats(target)
    assert not stats.stepped_aside and stats.payoff["speculate"] and stats.drafted > 0
    assert stats.payoff["acceptance"] == Payoff.prior and stats.payoff["new_tokens"] == 298


def test_fixed_draft_lengths_and_step_aside_false_always_draft():
    target, draft = draft_target_pair("llama")
    ids = make_prompt(300, seed=1)
    for fields in ({"draft_length": "fixed"}, {"step_aside": False}):
        target.generate(ids, assistant_model=draft, max_new_tokens=4, do_sample=False, cache_implementation="rift",
                        cache_config=fields)  # fmt: skip
        stats = rift_hf.last_stats(target)
        assert stats.payoff is None and not stats.stepped_aside and stats.drafted > 0
    with pytest.raises(TypeError, match="step_aside"):
        RiftConfig(step_aside="no")


def test_the_decision_turns_on_the_tokens_left(monkeypatch):
    """The same costs (a drafter step 0.3x a target step, its prompt pass 0.3x the target's 10 s) repay the pass over
    a long answer and not over a short one; the saving is `M * t * (1 - 1/s)`."""
    target, draft = draft_target_pair("llama")
    monkeypatch.setattr(payoff, "prompt_flops", lambda model, tokens, attended=None: 0.3 if model is draft else 1.0)
    monkeypatch.setattr(payoff, "_draft_step_seconds", lambda *_: 0.03)
    config = RiftConfig()
    decisions = {}
    for new_tokens in (20, 2000):
        rule = Payoff()
        rule.observe_target(10.0)  # the target's prompt forward
        rule.observe_target(0.1)  # one target step
        decisions[new_tokens] = rule.decide(target, draft, 4000, new_tokens, 11, (0.0, 0.0), config)
        estimate = rule.estimate
        assert estimate["draft_pass_seconds"] == pytest.approx(3.0)
        saving = new_tokens * 0.1 * (1 - 1 / estimate["speed_up"])
        assert estimate["saving_seconds"] == pytest.approx(saving)
        rates = [(1 - 0.75 ** (k + 1)) / 0.25 / (0.03 * k + 0.1 * (1 + 0.04 * k)) for k in range(1, 12)]
        assert estimate["speed_up"] == pytest.approx(0.1 * max(rates)) and estimate["speed_up"] > 1.3
    assert decisions == {20: False, 2000: True}


def test_what_earlier_calls_saw_moves_the_estimates(monkeypatch):
    target, draft = draft_target_pair("llama")
    monkeypatch.setattr(payoff, "prompt_flops", lambda model, tokens, attended=None: 0.3 if model is draft else 1.0)
    monkeypatch.setattr(payoff, "_draft_step_seconds", lambda *_: 0.03)
    rule = Payoff()
    rule.observe_target(10.0)
    rule.observe_target(0.1)
    rule.decide(target, draft, 4000, 100, 11, (0.0, 0.0), RiftConfig())
    rule.learn_pass(6.0)  # the pass took twice the estimate
    nxt = rule.resume()
    nxt.observe_target(10.0)
    nxt.observe_target(0.1)
    # A last call that accepted 1 of 10 positions pulls acceptance far below the prior, held by its 4 pseudo-counts.
    nxt.decide(target, draft, 4000, 100, 11, (1.0, 10.0), RiftConfig())
    assert nxt.estimate["draft_pass_seconds"] == pytest.approx(6.0)
    assert nxt.estimate["acceptance"] == pytest.approx((1.0 + 4 * 0.75) / 14)


def test_measured_verification_and_drafting_costs_replace_the_assumed_ones(monkeypatch):
    """Once an earlier call on the pair measured what verifying drafts and a drafter step cost, the rule prices
    rounds with them: a verification dearer than `1 + 0.04 k` steps and a slower drafter turn a call the assumed
    costs would draft into one that steps aside."""
    from rift_hf.generation.draft_length import DraftLength

    target, draft = draft_target_pair("llama")
    monkeypatch.setattr(payoff, "prompt_flops", lambda model, tokens, attended=None: 0.3 if model is draft else 1.0)
    monkeypatch.setattr(payoff, "_draft_step_seconds", lambda *_: 0.03)

    def decide(measured):
        rule = Payoff()
        rule.observe_target(10.0)
        rule.observe_target(0.1)
        go = rule.decide(target, draft, 4000, 150, 11, (9.0, 10.0), RiftConfig(), measured=measured)
        return go, rule.estimate

    assumed_go, assumed = decide(None)
    assert assumed_go and assumed["verify_steps"] == pytest.approx(1 + 0.04 * assumed["draft_length"])
    controller = DraftLength(max_length=11)
    assert decide(controller)[1]["speed_up"] == pytest.approx(assumed["speed_up"])  # nothing measured yet
    controller.verify_cost.observe(1, 0.1)
    controller.verify_cost.observe(12, 0.4)  # 12 tokens verified at 4 one-token steps
    controller.step = [0.05, 1.0]  # a drafter step measured at 0.05 s, dearer than its weights' 0.03 s
    measured_go, measured = decide(controller)
    k = measured["draft_length"]
    assert measured["verify_steps"] == pytest.approx(max(1.0, controller.verify_cost(k + 1) / 0.1))
    assert measured["draft_step_seconds"] == pytest.approx(0.05)
    assert measured["speed_up"] < assumed["speed_up"] and not measured_go
    # Without a measured one-token verification, this call's timed target step stands in for it.
    only_drafts = DraftLength(max_length=11)
    only_drafts.verify_cost.observe(12, 0.4)
    assert payoff._verify_steps(only_drafts, 0.04, 0.1)(11) == pytest.approx(4.0)
    assert payoff._verify_steps(only_drafts, 0.04, 0.1)(1) == 1.0  # never below one step


def test_prompt_flops_count_linear_layers_and_attention():
    model = tiny_model("llama")
    params = model.num_parameters(exclude_embeddings=True) - model.get_output_embeddings().weight.numel()
    per_key = 4 * 4 * 16 * 2  # 4 heads of 16 dims in each of 2 layers
    assert prompt_flops(model, 100) == pytest.approx(100 * (2 * params + per_key * 50))
    assert prompt_flops(model, 100, attended=10) == pytest.approx(100 * (2 * params + per_key * 10))
    gemma = tiny_model("gemma3")  # two sliding layers (window 8) and one full
    heads = 4 * 4 * 16
    linear = 2 * (gemma.num_parameters(exclude_embeddings=True) - gemma.get_output_embeddings().weight.numel())
    assert prompt_flops(gemma, 100) == pytest.approx(100 * (linear + heads * (50 + 2 * 4)))


def test_a_drafter_step_is_timed_once_per_drafter(monkeypatch):
    """Timing the drafter's weights costs two of its forwards: the first call that asks times them, later calls (and
    the rest of the process) reuse the figure; another dtype is timed afresh."""
    _, draft = draft_target_pair("llama")
    forwards = []
    handle = draft.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        first = payoff.weights_step_seconds(draft)
        assert len(forwards) == 2 and first > 0
        assert payoff.weights_step_seconds(draft) == first and len(forwards) == 2
        payoff._draft_step_seconds(draft, RiftConfig(), 4000)
        assert len(forwards) == 2
        draft.to(torch.float64)
        payoff.weights_step_seconds(draft)
        assert len(forwards) == 4
    finally:
        handle.remove()
