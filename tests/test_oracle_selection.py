"""The selection-ceiling benchmark scores with the queries it is handed, and gives the policy back when those are the
policy's own."""

import torch

from benchmarks.oracle_selection import future_queries, oracle_scoring, shifted_scoring, unmasked_scores
from rift_hf.attention import use_rift_attention
from rift_hf.cache import RiftCache
from rift_hf.config import RiftConfig, policy_settings
from rift_hf.kernels import pool_scores
from rift_hf.policies import base as policy_base
from rift_hf.policies.page_round import PageRound
from rift_hf.replay import replay, target_output
from tiny import draft_target_pair, make_prompt

SMALL = {"budget": 16, "window": 4, "delta": 4, "n_sink": 1}


def test_unmasked_scores_are_the_attention_of_later_queries():
    g = torch.Generator().manual_seed(0)
    query, key = torch.randn(1, 4, 3, 8, generator=g), torch.randn(1, 2, 10, 8, generator=g)
    probs = torch.softmax(torch.einsum("bhqd,bhtd->bhqt", query, key.repeat_interleave(2, dim=1)) * 0.3, dim=-1)
    expected = probs.sum(2).view(1, 2, 2, 10).mean(2)  # summed over queries, averaged over each KV head's group
    torch.testing.assert_close(unmasked_scores(query, key, 0.3, "avg", 3), pool_scores(expected, 3, "avg"))


def test_oracle_scoring_reads_the_next_queries_and_restores_the_cache():
    target, draft = draft_target_pair("llama", 4)
    use_rift_attention(draft, RiftConfig(**policy_settings("rift-stat", SMALL)))
    record = target_output(target, make_prompt(40, seed=3), 24)
    future = future_queries(draft, record)
    assert all(q.shape[2] == 64 for q in future.values())
    own = RiftCache.scoring_query, policy_base.snapkv_scores
    cache = RiftCache(draft.config, RiftConfig(**policy_settings("rift-stat", SMALL)))
    layer = next(iter(future))
    cache.layers[layer].seen = 40
    with oracle_scoring(future, span=8):
        torch.testing.assert_close(cache.scoring_query(layer, torch.zeros(1, 4, 4, 16)), future[layer][:, :, 40:48])
        cache.layers[layer].seen = 64  # nothing left ahead: the cache's own queries
        mine = torch.ones(1, future[layer].shape[1], 4, future[layer].shape[3])
        assert cache.scoring_query(layer, mine) is mine
    assert (RiftCache.scoring_query, policy_base.snapkv_scores) == own


def test_the_last_window_of_queries_gives_back_the_policy():
    target, draft = draft_target_pair("llama", 4)
    config = policy_settings("rift-stat", {**SMALL})
    use_rift_attention(draft, RiftConfig(**config))
    record = target_output(target, make_prompt(40, seed=3), 40)
    plain = [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds]
    future = future_queries(draft, record)
    with oracle_scoring(future, span=SMALL["window"], lead=-SMALL["window"]):
        again = [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds]
    assert again == plain
    with oracle_scoring(future, span=40):  # the answer's own queries: another selection, other rounds
        oracle = [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds]
    assert oracle != plain
    assert any(accepted < drafted for drafted, accepted in plain)  # a case with rejections, not a trivial one


def test_shifted_scoring_carries_each_score_forward(monkeypatch):
    spike = torch.zeros(1, 2, 12)
    spike[0, 0, 3], spike[0, 1, 9] = 1.0, 0.5
    monkeypatch.setattr(policy_base, "snapkv_scores", lambda *args: spike.clone())
    with shifted_scoring(4):
        shifted = policy_base.snapkv_scores(None, None, 1.0)
    assert shifted.shape == spike.shape
    assert shifted[0, 0].nonzero().flatten().tolist() == [3, 4, 5, 6, 7]
    assert shifted[0, 1].nonzero().flatten().tolist() == [9, 10, 11]
    assert policy_base.snapkv_scores(None, None, 1.0).equal(spike)  # restored


def test_tokens_ahead_replays_as_the_benchmark_shift():
    target, draft = draft_target_pair("llama", 4)
    use_rift_attention(draft, RiftConfig(**policy_settings("rift-dyn", SMALL)))
    record = target_output(target, make_prompt(40, seed=3), 40)
    with shifted_scoring(6):
        shifted = [
            (r["drafted"], r["accepted"]) for r in replay(draft, record, policy_settings("rift-dyn", {**SMALL})).rounds
        ]
    configured = replay(draft, record, policy_settings("rift-dyn", {**SMALL, "tokens_ahead": 6})).rounds
    assert [(r["drafted"], r["accepted"]) for r in configured] == shifted


def test_page_round_scores_each_refresh_with_the_queries_of_the_round_it_drafts(monkeypatch):
    target, draft = draft_target_pair("llama", 4)
    config = policy_settings("page-round", {**SMALL, "block_size": 2, "score_queries": 4})
    use_rift_attention(draft, RiftConfig(**config))
    record = target_output(target, make_prompt(40, seed=3), 40)
    future = future_queries(draft, record)
    stacked = torch.cat([future[layer] for layer in sorted(future)], dim=1)  # the layers' heads, as a refresh stacks
    scored, select_pages = [], PageRound.select_pages
    monkeypatch.setattr(
        PageRound, "select_pages", lambda self, query, *rest: scored.append(query) or select_pages(self, query, *rest)
    )
    plain = [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds]
    scored.clear()
    with oracle_scoring(future, span=4):
        oracle = [(r["drafted"], r["accepted"]) for r in replay(draft, record, config).rounds]
    ahead = [q for q in scored if q.shape[2] == 4 and q.shape[1] == stacked.shape[1]]
    assert len(ahead) >= len(oracle) - 4  # every refresh but those whose round runs past the answer
    for query in ahead:  # each is 4 consecutive positions of the full cache's queries
        assert any(torch.equal(query, stacked[:, :, t : t + 4]) for t in range(stacked.shape[2] - 3))
    assert oracle != plain
