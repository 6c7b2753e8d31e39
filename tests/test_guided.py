"""page-round with guide="target": the drafter's pages chosen from the target's attention at its last verification
(#76)."""

import pytest
import torch

import rift_hf
from rift_hf import RiftConfig
from rift_hf.config import policy_settings
from rift_hf.generation import guide as guide_module
from rift_hf.generation.guide import target_attention
from rift_hf.policies.page_round import PageRound
from rift_hf.replay import replay, target_output
from tiny import ARCHITECTURES, SMALL, draft_target_pair, make_prompt

GAMMA, PROMPT, NEW = 4, 40, 40
GUIDED = policy_settings("page-round", {**SMALL, "guide": "target"})


@pytest.fixture(scope="module")
def pair():
    return draft_target_pair("llama", GAMMA)


def test_guided_pages_keep_the_pages_holding_the_most_weight():
    policy = RiftConfig(
        policy="page-round", guide="target", budget=64, window=8, block_size=4, pages_ahead=0, n_sink=2
    ).policy_object
    weights = torch.full((40,), 0.001)
    weights[2 + 4 * 3 : 2 + 4 * 4] = 0.2  # page 3
    weights[2 + 4 * 6 + 1] = 0.3  # page 6
    chosen = policy.guided_pages(weights, hi=38, count=8)
    assert chosen.tolist() == [[14, 15, 16, 17, 26, 27, 28, 29]]
    # A page past the weights' end weighs nothing; a count below a page picks none.
    assert policy.guided_pages(weights[:10], hi=38, count=8).shape == (1, 8)
    assert policy.guided_pages(weights, hi=38, count=3).shape == (1, 0)
    ahead = RiftConfig(
        policy="page-round", guide="target", budget=64, window=8, block_size=4, pages_ahead=1, n_sink=2
    ).policy_object
    assert ahead.guided_pages(weights, hi=38, count=8).tolist() == [[14, 15, 16, 17, 18, 19, 20, 21]]


def test_generation_chooses_the_drafters_pages_from_the_targets_attention(pair, monkeypatch):
    target, draft = pair
    ids = make_prompt(PROMPT, seed=3)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    chosen, live = [], []
    pick, finish = PageRound.guided_pages, guide_module.TargetGuide.finish

    def spy_pick(self, weights, hi, count):
        chosen.append(pick(self, weights, hi, count))
        return chosen[-1]

    def spy_finish(self, drafted, accepted):
        live.append(finish(self, drafted, accepted))
        return live[-1]

    monkeypatch.setattr(PageRound, "guided_pages", spy_pick)
    monkeypatch.setattr(guide_module.TargetGuide, "finish", spy_finish)
    own = target.config._attn_implementation
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=NEW, do_sample=False, cache_implementation="rift",
        cache_config=GUIDED,
    )  # fmt: skip
    assert torch.equal(out, reference)
    assert len(chosen) > 3, "the selection never read the target's attention"
    assert all(c.shape[1] > 0 for c in chosen)
    assert target.config._attn_implementation == own  # the target is left on its own backend
    assert not guide_module._CAPTURING  # and nothing captures its later forwards
    # Each verification's newest verified query: its weights cover the positions it attends and sum to one.
    stats = rift_hf.last_stats(target)
    assert len(live) == len(stats.rounds)
    length = PROMPT
    for weights, row in zip(live, stats.rounds, strict=True):
        length += row["accepted"] + 1
        assert weights.shape == (length - 1,)
        torch.testing.assert_close(weights.sum(), torch.tensor(1.0))
    # The teacher-forced rows replay reads are what the live capture saw (the same queries and keys).
    rows = target_attention(target, out, PROMPT - 1)
    length = PROMPT
    for weights, row in zip(live, stats.rounds, strict=True):
        length += row["accepted"] + 1
        torch.testing.assert_close(rows[length - 2 - (PROMPT - 1), : length - 1], weights, atol=1e-5, rtol=1e-4)


def test_replay_asks_for_the_targets_attention_where_a_policy_reads_it(pair):
    target, draft = pair
    record = target_output(target, make_prompt(PROMPT, seed=4), 8)
    with pytest.raises(ValueError, match="guide=rift_hf.generation.guide.target_attention"):
        replay(draft, record, GUIDED)
    rows = target_attention(target, record.sequence, PROMPT - 1)
    with pytest.raises(ValueError, match="read only by a guided policy"):
        replay(draft, record, policy_settings("rift-dyn", SMALL), guide=rows)
    assert replay(draft, record, GUIDED, guide=rows).rounds


def test_a_target_backend_with_no_mask_function_is_refused_by_name():
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        guide_module.guided_name("no-such-backend")


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_guided_output_is_the_targets_own_on_every_architecture(arch):
    target, draft = draft_target_pair(arch, GAMMA)
    ids = make_prompt(PROMPT, seed=6)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=NEW, do_sample=False, cache_implementation="rift",
        cache_config=GUIDED,
    )  # fmt: skip
    assert torch.equal(out, reference)
    assert rift_hf.last_stats(target).rescorings


def test_guided_sampling_runs_and_keeps_the_targets_backend(pair):
    target, draft = pair
    own = target.config._attn_implementation
    torch.manual_seed(0)
    out = target.generate(
        make_prompt(PROMPT, seed=7), assistant_model=draft, max_new_tokens=16, do_sample=True, top_k=8,
        cache_implementation="rift", cache_config=GUIDED,
    )  # fmt: skip
    assert out.shape[1] == PROMPT + 16 and target.config._attn_implementation == own


def test_a_target_left_on_the_guided_backend_is_put_back_on_its_own(pair):
    target, _ = pair
    own = target.config._attn_implementation
    guide = guide_module.TargetGuide(target)
    guide.start()  # a call that never finished its verification
    stale = guide_module.TargetGuide(target)
    stale.start()
    stale.stop()
    assert target.config._attn_implementation == own and not guide_module._CAPTURING


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_the_guided_twin_computes_the_targets_logits_bit_for_bit_in_bf16(attn):
    """The twin backend runs the target's own attention and mask: a bf16 verification forward over a cache gives the
    same logits to the last bit with and without the capture (in bf16 a guided call can only differ from the target
    alone where its verifications have other lengths, as any assisted call's can)."""
    from rift_hf.generation.guide import TargetGuide
    from tiny import tiny_model

    target = tiny_model("llama", seed=1, dtype=torch.bfloat16, attn=attn).eval()
    ids = make_prompt(PROMPT + 6, seed=4)

    def verify():
        with torch.no_grad():
            past = target(ids[:, :PROMPT], use_cache=True).past_key_values
            return target(ids[:, PROMPT:], past_key_values=past, use_cache=True).logits

    own = verify()
    guide = TargetGuide(target)
    guide.start()
    try:
        with torch.no_grad():
            past = target(ids[:, :PROMPT], use_cache=True).past_key_values
            guided = target(ids[:, PROMPT:], past_key_values=past, use_cache=True).logits
        assert guide.captured  # the twin ran and captured
    finally:
        weights = guide.finish(5, 5)
    assert torch.equal(guided, own)
    assert weights is not None and target.config._attn_implementation == attn
