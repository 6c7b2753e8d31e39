"""The cost-aware draft length: it picks the length with the best expected rate, and leaves the target alone when no
length beats it; in generate it keeps the output lossless."""

import copy
import random
import time

import pytest
import torch

import rift_hf
from rift_hf.config import policy_settings
from rift_hf.generation.draft_length import DraftLength, LinearCost
from tiny import draft_target_pair, make_prompt, pin_drafting


def simulate(controller, draft_step, verify, accept, rounds=256, seed=0):
    """Run `controller` against a synthetic loop: drafting k costs `k * draft_step` (the first round also a prompt
    forward), verifying n tokens `verify(n)`, draft j is accepted with chance `accept` given the ones before it.
    Returns tokens per second."""
    rng = random.Random(seed)
    tokens = seconds = 0.0
    for _ in range(rounds):
        k = controller.choose()
        accepted = 0
        while accepted < k and rng.random() < accept:
            accepted += 1
        forwards = [draft_step] * k
        if forwards and controller.rounds == 0:
            forwards[0] += 50 * draft_step  # the prompt forward (not counted in the rate: a decode-phase measure)
        draft_s, verify_s = k * draft_step, verify(k + 1)
        controller.observe(k, accepted, sum(forwards), verify_s, forwards)
        tokens += accepted + 1
        seconds += draft_s + verify_s
    return tokens / seconds


def best_fixed_rate(draft_step, verify, accept, max_length):
    def rate(k):
        expected = sum(accept**i for i in range(k + 1))
        return expected / (k * draft_step + verify(k + 1))

    return max(rate(k) for k in range(max_length + 1)), max(range(max_length + 1), key=rate)


@pytest.mark.parametrize(
    ("draft_step", "v0", "v1", "accept"),
    [
        (0.05, 1.0, 0.02, 0.9),  # a cheap drafter that agrees: long drafts
        (0.3, 1.0, 0.05, 0.6),  # a dear drafter: short drafts
        (0.5, 0.4, 0.1, 0.3),  # drafting loses: the target alone
        (0.1, 0.5, 0.13, 0.75),  # this CPU's shape: verification grows with its length
    ],
    ids=["cheap-agreeing", "dear", "losing", "cpu-like"],
)
def test_controller_reaches_the_best_fixed_length_and_never_loses_to_the_target(draft_step, v0, v1, accept):
    def verify(n):
        return v0 + v1 * n

    best, length = best_fixed_rate(draft_step, verify, accept, 11)
    controller = DraftLength(max_length=11)
    rate = simulate(controller, draft_step, verify, accept)
    alone = 1 / verify(1)
    # Where drafting loses, what the controller spends is its first round and one probe (4 drafts each, nothing
    # accepted) before probes are spaced out; in the harshest case here (a drafter step as dear as the target's) that
    # is ~5% of 256 tokens.
    assert rate >= (0.94 if length == 0 else 0.97) * alone, (rate, alone)
    assert rate >= 0.9 * best, (rate, best, length)
    if length == 0:  # it spends most rounds letting the target decode alone, probing now and then
        assert sum(k == 0 for k, _ in controller.chosen) > 0.8 * len(controller.chosen)


def test_controller_calibrates_then_backs_off_and_probes():
    controller = DraftLength(max_length=6, backoff=2, max_backoff=8)
    lengths = []
    for _ in range(40):
        k = controller.choose()
        lengths.append(k)
        # drafts never accepted, drafting dear: the target alone always wins
        controller.observe(k, 0, 1.0 * k, 0.5 + 0.1 * (k + 1), [1.0] * k)
    assert lengths[:3] == [4, 0, 0]
    reasons = [reason for _, reason in controller.chosen]
    assert reasons[:3] == ["calibrate", "calibrate", "target faster"]
    probes = [i for i, reason in enumerate(reasons) if reason == "probe"]
    assert len(probes) >= 2
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    assert gaps == sorted(gaps) and gaps[-1] <= 8 + 1  # the back-off doubles, up to max_backoff


def test_an_unlucky_start_does_not_silence_a_drafter_that_pays():
    """The first rounds reject everything (an answer's first tokens, the first probe too), then the drafter agrees:
    with cheap probes the controller looks again within a short back-off and ends up drafting long, instead of
    spacing probes by `probe_share` (dozens of rounds) after the first losing one."""

    def run(explore_steps):
        controller = DraftLength(max_length=11, explore_steps=explore_steps)
        lengths = []
        for r in range(40):
            k = controller.choose()
            accepted = 0 if r < 8 else k  # every draft accepted from the ninth round on
            controller.observe(k, accepted, 0.2 * k, 1.25 + 0.1 * (k + 1), [0.2] * k)
            lengths.append(k)
        return lengths

    lengths = run(3.0)
    assert lengths[:2] == [4, 0]
    assert sum(k > 0 for k in lengths[:12]) >= 3 and sum(lengths[-10:]) >= 80  # back to drafting, long drafts
    silenced = run(0.0)  # spacing by probe_share from the first losing probe, as before `explore_steps`
    assert sum(silenced[-20:]) < sum(lengths[-20:]) / 2


def test_linear_cost_interpolates_and_does_not_grow_past_the_largest_size():
    cost = LinearCost()
    assert cost(3) == 0.0
    cost.observe(12, 2.0)
    assert cost(6) == pytest.approx(1.0)  # one size: a line through the origin below it
    cost.observe(1, 0.6)
    assert cost(1) == pytest.approx(0.6) and cost(12) == pytest.approx(2.0)
    assert cost(6) == pytest.approx(0.6 + 5 * 1.4 / 11)  # between two sizes: the line through them

    flat = LinearCost()  # a verification that costs little more past a few tokens (a CPU at ~32K in bf16)
    flat.observe(1, 0.42)
    flat.observe(3, 0.61)
    assert flat(2) == pytest.approx(0.515)
    assert flat(12) == pytest.approx(0.61)  # priced as the largest seen (a line through 1 and 3 gives 1.46 s) ...
    flat.observe(12, 0.65)
    assert flat(12) == pytest.approx(0.65) and flat(6) == pytest.approx(0.61 + 3 * 0.04 / 9)  # ... until seen
    with pytest.raises(ValueError, match="max_length"):
        DraftLength(max_length=0)


def test_a_flat_verification_cost_lets_the_controller_draft_long():
    """A verification of 3-12 tokens barely dearer than one of 2 (a CPU at ~32K in bf16), a drafter step a third of a
    target step, and acceptance in runs (every third round rejects the third draft, the others accept all): the
    controller lengthens its drafts within a few rounds instead of creeping up from the sizes it has verified (a line
    through 1 and 4 tokens priced 12 at twice its cost: 54 drafts in the first 15 rounds, against 88 now)."""
    curve = {
        1: 0.42,
        2: 0.58,
        3: 0.61,
        4: 0.61,
        5: 0.61,
        6: 0.62,
        7: 0.62,
        8: 0.62,
        9: 0.63,
        10: 0.64,
        11: 0.64,
        12: 0.65,
    }
    controller, lengths = DraftLength(max_length=11), []
    for r in range(15):
        k = controller.choose()
        accepted = min(k, 2) if r % 3 == 0 else k
        controller.observe(k, accepted, 0.3 + 0.14 * k if k else 0.0, curve[k + 1], [0.14] * k)
        lengths.append(k)
    assert sum(lengths) >= 75 and max(lengths) == 11


@pytest.mark.parametrize("policy", rift_hf.POLICIES)
def test_auto_draft_length_is_lossless_and_reported(policy):
    target, draft = draft_target_pair("llama", gamma=6)
    ids = make_prompt(40, seed=5)
    gen = {"max_new_tokens": 48, "min_new_tokens": 48, "do_sample": False}
    plain = target.generate(ids, **gen)
    config = policy_settings(policy, {"budget": 16, "window": 4, "delta": 4, "block_size": 4})
    # A slow target, so that drafting pays and the chosen lengths vary (tiny models alone would draft at a loss).
    handle = target.register_forward_pre_hook(lambda *_: time.sleep(0.05))
    try:
        out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
    finally:
        handle.remove()
    assert torch.equal(out, plain)
    stats = rift_hf.last_stats(target)
    # Two rounds time the target alone (the step-aside rule, which finds drafting pays here), then the controller.
    assert not stats.stepped_aside and stats.payoff["speculate"]
    assert [r["reason"] for r in stats.rounds[:2]] == ["target first", "target first"]
    assert stats.draft_lengths[:4] == [0, 0, 4, 0] and stats.rounds_without_drafting >= 3
    assert all("verify_seconds" in r and "reason" in r for r in stats.rounds)


def test_drafting_resumes_where_it_pays():
    # The target as its own drafter over a full cache (every draft accepted), and a target forward far dearer than a
    # drafter's: drafting pays by a wide margin, whatever else shares the CPU.
    target, _ = draft_target_pair("llama", gamma=6)
    draft = copy.deepcopy(target)
    pin_drafting(draft, gamma=6)
    ids = make_prompt(40, seed=5)
    gen = {"max_new_tokens": 48, "min_new_tokens": 48, "do_sample": False}
    handle = target.register_forward_pre_hook(lambda *_: time.sleep(0.3))  # a target far dearer than the drafter
    try:
        out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config="full", **gen)
    finally:
        handle.remove()
    assert torch.equal(out, target.generate(ids, **gen))
    rounds = rift_hf.last_stats(target).rounds
    assert [r["reason"] for r in rounds[:4]] == ["target first", "target first", "calibrate", "calibrate"]
    assert sum(r["reason"] == "best rate" and r["drafted"] > 0 for r in rounds) >= len(rounds) // 2


def test_fixed_draft_length_keeps_transformers_schedule():
    target, draft = draft_target_pair("llama", gamma=6)
    ids = make_prompt(40, seed=5)
    gen = {"max_new_tokens": 48, "min_new_tokens": 48, "do_sample": False}
    config = policy_settings("page-round", {"budget": 16, "window": 4, "draft_length": "fixed"})
    fixed = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
    lengths = rift_hf.last_stats(target).draft_lengths
    assert torch.equal(fixed, target.generate(ids, **gen)) and lengths[:3] == [6, 6, 6] and 0 not in lengths[:-1]


def test_a_slow_drafter_leaves_the_target_alone():
    target, draft = draft_target_pair("llama", gamma=6)
    ids = make_prompt(40, seed=5)
    gen = {"max_new_tokens": 60, "min_new_tokens": 60, "do_sample": False}
    plain = target.generate(ids, **gen)
    handle = draft.register_forward_pre_hook(lambda *_: time.sleep(0.02))
    try:
        out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config="page-round", **gen)
    finally:
        handle.remove()
    assert torch.equal(out, plain)
    stats = rift_hf.last_stats(target)
    # After calibration most rounds decode with the target alone; probes come back now and then.
    assert stats.rounds_without_drafting > 0.6 * len(stats.rounds)


def test_draft_length_field_is_checked():
    with pytest.raises(ValueError, match="'auto'.*'fixed'"):
        rift_hf.RiftConfig(draft_length="sometimes")


def test_a_second_call_keeps_the_costs_and_learns_the_prompt_again():
    def verify(n):
        return 0.5 + 0.13 * n

    first = DraftLength(max_length=11)
    simulate(first, 0.1, verify, 0.9, rounds=40)
    second = first.resume()
    assert second.verify_cost.sums.keys() == first.verify_cost.sums.keys() and second.step == first.step
    assert all(w == 0 for _, w in second.accepted) and second.prior > 0.8  # the last prompt's rate, held lightly
    simulate(second, 0.1, verify, 0.9, rounds=3)
    assert [reason for _, reason in second.chosen] == ["calibrate", "best rate", "best rate"]
    assert second.chosen[1][0] > 4  # no round without drafting to price the target again


def test_costs_carry_over_between_generate_calls_on_the_same_models():
    target, draft = draft_target_pair("llama", gamma=6)
    ids = make_prompt(40, seed=5)
    gen = {"max_new_tokens": 24, "min_new_tokens": 24, "do_sample": False}
    config = {"policy": "page-round", "step_aside": False}  # the controller alone, whatever drafting costs here
    for call in range(2):
        target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
        reasons = [r["reason"] for r in rift_hf.last_stats(target).rounds]
        assert reasons[0] == "calibrate" and (call == 0) == (reasons[1] == "calibrate")


def test_idle_evidence_lets_a_drafter_back_in_after_a_losing_probe():
    """A probe after rounds without drafting accepts nothing, as the first rounds did, but the drafter would have
    predicted every token the target emitted alone: that evidence (`observe_idle`) brings drafting back, where the
    probe's own outcome alone spaces the next probe by dozens of rounds."""

    def run(evidence: bool):
        # A dear round's first forward (a refresh at ~32K) makes a losing probe cost more than the exploration allows.
        controller = DraftLength(max_length=11)
        lengths, idle = [], 0
        for r in range(60):
            k = controller.choose()
            if k and idle and evidence:
                controller.observe_idle([(idle - i, idle - i) for i in range(idle)])  # all would have been accepted
            idle = 0 if k else idle + 1
            accepted = 0 if r < 12 else k
            forwards = [0.5 + 0.13] + [0.13] * (k - 1) if k else []
            controller.observe(k, accepted, sum(forwards), 0.48 if k == 0 else 0.66 + 0.007 * k, forwards)
            lengths.append(k)
        return lengths

    with_evidence, without = run(True), run(False)
    assert sum(without[20:]) == 0  # silenced for the rest of the run
    assert sum(k > 0 for k in with_evidence[20:]) >= 30 and max(with_evidence[20:]) == 11


def test_idle_runs_count_the_drafts_in_a_row_from_each_token():
    from rift_hf.generation.candidate import idle_runs

    assert idle_runs([True, True, False, True]) == [(2, 4), (1, 3), (0, 2), (1, 1)]
    assert idle_runs([]) == []


def _scripted(monkeypatch, lengths):
    """Make the cost-aware controller draft `lengths` in turn (then nothing), and record what `observe_idle` gets."""
    script, seen = iter(lengths), []
    monkeypatch.setattr(DraftLength, "choose", lambda self: self._pick(next(script, 0), "scripted"))
    original = DraftLength.observe_idle
    monkeypatch.setattr(DraftLength, "observe_idle", lambda self, rounds: (seen.append(rounds), original(self, rounds)))
    return seen


def test_after_rounds_without_drafting_the_drafter_drops_its_rejected_drafts_and_reports_its_predictions(monkeypatch):
    """Rejected drafts stay in the drafter's cache until the next drafting round crops it; transformers crops to all
    but the last two tokens, which after rounds without drafting reaches past them. Each round's first draft must come
    from the sequence itself (a fresh forward's logits), and the evidence the re-fed tokens give (`observe_idle`) must
    be the drafter's own greedy predictions there."""
    from rift_hf.generation import candidate
    from tiny import couple

    target, draft = draft_target_pair("llama", gamma=6)
    couple(target, draft, 1.5)
    ids = make_prompt(40, seed=5)
    script = [6, 0, 0, 0, 6, 6, 0, 0, 0, 0, 0, 6, 6, 0, 0, 6] * 3
    seen = _scripted(monkeypatch, script)
    firsts = []
    original = candidate.RiftCandidateGenerator._generate_candidates

    def spy(self, args):
        out = original(self, args)
        firsts.append((args[self.input_ids_key].clone(), out[1][0, 0].clone()))
        return out

    monkeypatch.setattr(candidate.RiftCandidateGenerator, "_generate_candidates", spy)
    gen = {"max_new_tokens": 48, "min_new_tokens": 48, "do_sample": False}
    config = {"policy": "full", "step_aside": False}  # the scripted controller from the first round
    out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
    assert torch.equal(out, target.generate(ids, **gen))
    rounds = rift_hf.last_stats(target).rounds
    assert any(r["drafted"] and r["accepted"] < r["drafted"] for r in rounds)  # some drafts were rejected
    with torch.no_grad():
        for x, first in firsts:
            assert torch.allclose(first.float(), draft(x).logits[0, -1].float(), atol=1e-4)
    # The drafting rounds that followed rounds without drafting, with how many there were.
    after_idle, idle = [], 0
    for k in script[: len(rounds)]:
        if k:
            after_idle.append(idle)
        idle = 0 if k else idle + 1
    expected = []
    with torch.no_grad():
        for (x, _), idle in zip(firsts, after_idle, strict=False):
            if idle:
                predicted = draft(x).logits[0].argmax(-1)
                correct = (predicted[-idle - 1 : -1] == x[0, -idle:]).tolist()
                expected.append(candidate.idle_runs(correct))
    assert len(expected) >= 3 and seen == expected
    assert any(a for rounds_seen in seen for a, _ in rounds_seen) and any(
        a < d for rounds_seen in seen for a, d in rounds_seen
    )  # the evidence holds both right and wrong predictions


def test_a_fresh_call_probes_where_a_resumed_one_would():
    """A fresh controller spends its second round timing the target alone; where the first round accepted nothing,
    that round is the first of the back-off, so its first probe falls where a resumed controller's (which skips it)
    does, and a back-off still lasts `backoff` rounds without drafting."""

    def lengths(controller, rounds=8):
        out = []
        for _ in range(rounds):
            k = controller.choose()
            controller.observe(k, 0, 0.05 * k, 1.0 + 0.02 * (k + 1), [0.05] * k)
            out.append(k)
        return out

    fresh = DraftLength(max_length=11)
    first = lengths(fresh)
    assert first[:6] == [4, 0, 0, 0, 0, 4], first
    assert [reason for _, reason in fresh.chosen[:2]] == ["calibrate", "calibrate"]
    resumed = lengths(fresh.resume())
    assert resumed[:6] == first[:6], (resumed, first)


def test_probes_that_keep_a_draft_or_two_do_not_use_up_the_exploration():
    """The ~32K `continue:http/client.py` shape: a probe of 4 that accepts nothing costs about a target step more
    than the target alone, but probes that keep one draft emit two tokens for about two target steps. What the
    exploration has spent is what its rounds really lost, so such probes keep the back-off short and the drafter is
    found when it starts agreeing; drafting that never pays still ends with probes spaced out."""

    def run(accepting):
        controller = DraftLength(max_length=11)
        controller.verify_cost.observe(1, 0.48)  # costs known, as a resumed controller's: only round one calibrates
        controller.verify_cost.observe(5, 0.60)
        controller.verify_cost.observe(12, 0.75)
        controller.step, controller.first = [0.09, 1.0], [0.2, 1.0]
        lengths = []
        for r in range(60):
            k = controller.choose()
            accepted = 0 if r == 0 else min(k, accepting(r))
            forwards = [0.2] + [0.09] * (k - 1) if k else []
            verify = {0: 0.48, 4: 0.60}.get(k, 0.75)
            controller.observe(k, accepted, sum(forwards), verify, forwards)
            lengths.append(k)
        return lengths, controller

    lengths, _ = run(lambda r: 1 if r < 16 else 11)  # one draft a probe, then every draft from round 16
    assert sum(k > 0 for k in lengths[:16]) >= 3 and sum(k >= 4 for k in lengths[20:30]) >= 8, lengths
    _, controller = run(lambda r: 0)  # probes keep nothing: the budget runs out and the back-off grows
    probes = [i for i, (k, _) in enumerate(controller.chosen) if k]
    gaps = [b - a for a, b in zip(probes, [*probes[1:], len(controller.chosen)], strict=True)]
    assert len(probes) <= 6 and max(gaps) >= 30, probes


def test_probes_are_spaced_by_what_they_are_expected_to_lose():
    """Once the exploration budget is spent, probes are spaced out by their loss over the target alone at the
    acceptance estimated so far: a drafter that predicts about half its drafts is probed far sooner than one that
    predicts nothing (priced as if nothing were accepted, both waited ~60 rounds at these ~32K bf16 costs)."""

    def back_off(acceptance):
        controller = DraftLength(max_length=11)
        for size, seconds in ((1, 0.48), (5, 0.60), (12, 0.75)):
            controller.verify_cost.observe(size, seconds)
        controller.step, controller.first = [0.09, 1.0], [0.2, 1.0]
        controller.warm, controller.rounds = True, 10
        controller.accepted = [[50.0 * acceptance, 50.0] for _ in range(11)]
        controller.outcomes = {(4, 0): 3}  # three probes that kept nothing: the budget is spent
        controller.wait = 2 * controller.backoff  # not the first back-off
        assert controller.choose() == 0 and controller.chosen[-1][1] == "target faster"
        return controller.idle

    never, half = back_off(0.0), back_off(0.45)
    assert never >= 50 and half <= never / 2, (never, half)
