import math

import pytest
import torch
from transformers import LlamaConfig

import rift_hf
from rift_hf import POLICIES, RiftConfig, preset
from rift_hf.config import policy_settings
from rift_hf.policies import calibrate_thresholds, keep_mask, select_blocks, select_tokens
from rift_hf.policies.schedules import Adaptive, Signals


def test_select_tokens_is_top_k_inside_the_range():
    scores = torch.tensor([[9.0, 1, 5, 7, 3, 8, 0, 6], [0.0, 9, 8, 1, 2, 3, 4, 5]])
    picked = select_tokens(scores, lo=1, hi=6, count=2)
    assert picked.tolist() == [[3, 5], [1, 2]]
    assert select_tokens(scores, lo=1, hi=3, count=5).tolist() == [[1, 2], [1, 2]]


def test_select_blocks_keeps_whole_blocks_for_all_heads():
    block_scores = torch.tensor([5.0, 1.0, 9.0, 7.0, 8.0])
    picked = select_blocks(block_scores, block_size=4, lo=2, hi=18, count=9, heads=3)
    # Block 0 starts before lo and block 4 ends after hi: candidates are blocks 1..3; 9 tokens = 2 blocks.
    assert picked.tolist() == [[8, 9, 10, 11, 12, 13, 14, 15]] * 3


def test_keep_mask_is_sinks_recent_and_selected():
    positions = torch.arange(12).expand(2, -1)
    selected = torch.tensor([[3, 5], [4, 6]])
    keep = keep_mask(positions, seen=12, n_sink=1, recent=3, selected=selected)
    assert keep[0].nonzero().flatten().tolist() == [0, 3, 5, 9, 10, 11]
    assert keep[1].nonzero().flatten().tolist() == [0, 4, 6, 9, 10, 11]


def test_adaptive_schedule_ages_and_signals():
    config = RiftConfig(policy="rift-ada", budget=256, a_min=32, a_max=512, al_threshold=3.0)
    schedule = Adaptive(config)
    calm = {"al_ewma": 5.0, "entropy": None, "drift": None}
    low = {"al_ewma": 2.0, "entropy": None, "drift": None}
    assert schedule.decide(600, calm) == (True, "a_max")
    assert schedule.decide(100, calm) == (False, "")
    assert schedule.decide(100, low) == (True, "al")
    assert schedule.decide(16, low) == (False, "")  # younger than a_min


def test_draft_entropy_ignores_tokens_a_processor_removed():
    from rift_hf.generation.candidate import draft_entropy

    logits = torch.tensor([[0.0, 0.0, float("-inf"), float("-inf")], [1.0, 2.0, 3.0, float("-inf")]])
    kept = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), -1)
    assert draft_entropy(logits) == pytest.approx([math.log(2), float(-(kept * kept.log()).sum())])


def test_signals_ewma_and_entropy_window():
    signals = Signals(alpha=0.5, entropy_window=3)
    signals.observe_round(3, [1.0, 1.0])
    signals.observe_round(1, [2.0, 4.0])
    assert signals.al_ewma == 0.5 * 2 + 0.5 * 4
    assert signals.entropy == (1.0 + 2.0 + 4.0) / 3


def test_calibration_picks_threshold_with_best_gain():
    events = [
        {"al_ewma": a, "entropy": None, "drift": d, "gain": g}
        for a, d, g in [
            (1.0, 0.9, 2.0),
            (1.5, 0.8, 1.5),
            (2.0, 0.7, 1.0),
            (2.5, 0.1, -0.5),
            (3.0, 0.2, -1.0),
            (3.5, 0.05, -1.0),
        ]
    ]
    thresholds = calibrate_thresholds(events, min_events=2)
    assert 1.5 <= thresholds["al_threshold"] < 1.6  # fires on the two lowest-AL events (best mean gain)
    assert 0.79 < thresholds["drift_threshold"] <= 0.8
    assert thresholds["entropy_threshold"] is None
    config = RiftConfig(policy="rift-ada", budget=256, **thresholds)
    assert config.al_threshold == thresholds["al_threshold"]


def test_keep_mask_matches_the_all_pairs_definition():
    g = torch.Generator().manual_seed(0)
    for _ in range(200):
        heads, stored = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(1, 50, (1,), generator=g))
        seen = stored + int(torch.randint(0, 20, (1,), generator=g))
        positions = torch.stack([torch.randperm(seen, generator=g)[:stored].sort().values for _ in range(heads)])
        count = int(torch.randint(0, seen + 1, (1,), generator=g))  # may name positions no longer stored
        selected = torch.stack([torch.randperm(seen, generator=g)[:count].sort().values for _ in range(heads)])
        expected = (positions < 2) | (positions >= seen - 5)
        if count:
            expected |= (positions.unsqueeze(-1) == selected.unsqueeze(-2)).any(-1)
        assert torch.equal(keep_mask(positions, seen, 2, 5, selected), expected)


def test_page_ahead_keeps_the_pages_after_the_best_ones():
    """Per KV head: pages ranked by max(own mean score, previous page's mean score), then by their own score; whole
    pages, ascending."""
    from rift_hf import RiftConfig

    policy = RiftConfig(policy="page-ahead", budget=64, block_size=4, window=8).policy_object
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(1, 2, 64, generator=g)
    got = policy.select(scores, lo=2, hi=58, count=20)  # pages 1..13 are candidates; 5 of them
    for h in range(2):
        means = scores[0, h, :56].view(14, 4).mean(-1)
        ahead = {p: max(means[p], means[p - 1]) if p > 1 else means[p] for p in range(1, 14)}
        best = sorted(sorted(ahead, key=lambda p: (-ahead[p], -means[p]))[:5])
        assert got[h].tolist() == [4 * p + i for p in best for i in range(4)]


def test_a_policy_registered_outside_the_package_drives_the_cache():
    from transformers import LlamaConfig

    from rift_hf import RiftCache, RiftConfig
    from rift_hf.policies import Policy, base, register

    @register
    class KeepEarliest(Policy):
        name = "test-keep-earliest"

        def select(self, scores, lo, hi, count):
            return torch.arange(lo, min(hi, lo + count)).expand(scores.shape[1], -1)

    try:
        config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16)
        cache = RiftCache(config, RiftConfig(policy="test-keep-earliest", budget=12, window=4))
        keys, values = torch.randn(1, 1, 30, 8), torch.arange(30.0).view(1, 1, 30, 1).expand(1, 1, 30, 8)
        out, _ = cache.update(keys, values, 0)
        cache.layers[0].observe(torch.randn(1, 2, 30, 8), out, 8**-0.5, None)
        cache.get_mask_sizes(1, 0)  # commit: keep the 6 earliest and the 6 newest
        kept = sorted(cache.layers[0].values[0, 0, :, 0].long().tolist())
        assert kept == [0, 1, 2, 3, 4, 5, 24, 25, 26, 27, 28, 29]
    finally:
        base._REGISTRY.pop("test-keep-earliest")


def test_a_policys_mode_is_its_base_class_and_a_flag_cannot_contradict_it():
    from rift_hf.cache import RiftCache
    from rift_hf.cache.retrieval_layer import RiftRetrievalLayer
    from rift_hf.cache.select_layer import RiftSelectLayer
    from rift_hf.cache.store_layer import RiftStoreLayer
    from rift_hf.policies import Policy, RetrievalPolicy, StorePolicy, policy_class, register

    layer = {Policy: RiftSelectLayer, StorePolicy: RiftStoreLayer, RetrievalPolicy: RiftRetrievalLayer}
    for name in POLICIES:
        kind = policy_class(name)
        mode = next(b for b in (RetrievalPolicy, StorePolicy, Policy) if issubclass(getattr(kind, "mode", kind), b))
        cache = RiftCache(LlamaConfig(num_hidden_layers=1, hidden_size=16, num_attention_heads=2), preset(name))
        assert type(cache.layers[0]) is layer[mode], name

    with pytest.raises(TypeError, match="subclass StorePolicy"):

        @register
        class Flagged(Policy):  # a store by flag on the select-once base: refused, not silently a select layer
            name = "test-flagged"
            keeps_store = True

    with pytest.raises(NotImplementedError, match="defines no `retrieve`"):
        RetrievalPolicy(RiftConfig()).retrieve(None, None, 0, 1.0, 0, 0)


def test_page_retrieval_summarises_a_page_by_its_midrange_key_and_scores_it_per_query_head():
    policy = RiftConfig(policy="page-retrieval", budget=64).policy_object
    assert policy.config.block_size == 8  # the policy's own page length when none is given
    g = torch.Generator().manual_seed(1)
    pages = torch.randn(1, 2, 10, 4, 8, generator=g)  # 10 pages of 4 keys
    summaries = policy.summarise(pages)
    torch.testing.assert_close(summaries, (pages.min(3).values + pages.max(3).values) / 2)
    query = torch.randn(1, 6, 3, 8, generator=g)  # 3 query heads per KV head, 3 positions
    scores = policy.page_scores(query, summaries, scale=0.5)  # [1, 2, 3, 3, 10]
    for h in range(6):
        expected = query[0, h] @ summaries[0, h // 3].T * 0.5
        torch.testing.assert_close(scores[0, h // 3, h % 3], expected)


def test_page_retrieval_attends_sinks_the_best_pages_and_the_window_per_query():
    """Each query: `n_sink` first rows, the top pages (group-averaged softmax of the page scores) among the whole pages
    that end before its window, and its `recent` newest rows: `budget` distinct visible rows."""
    policy = RiftConfig(policy="page-retrieval", budget=32, block_size=4, n_sink=2, window=4).policy_object
    g = torch.Generator().manual_seed(2)
    keys = torch.randn(1, 2, 70, 8, generator=g)
    n_pages = (66 - 2) // 4  # committed rows 0..65
    summaries = policy.summarise(keys[:, :, 2 : 2 + 4 * n_pages].unflatten(2, (n_pages, 4)))
    query = torch.randn(1, 4, 3, 8, generator=g)  # positions 66, 67, 68
    recent, selected = 6, 24  # 2 sinks + 6 pages + 6 recent = 32
    index = policy.retrieve(query, summaries, first=66, scale=0.5, recent=recent, selected=selected)
    assert index.shape == (1, 2, 3, 32)
    scores = policy.page_scores(query, summaries, 0.5)
    for h in range(2):
        for i, p in enumerate(range(66, 69)):
            rows = index[0, h, i].tolist()
            assert len(set(rows)) == 32 and max(rows) == p
            limit = min(n_pages, (p - recent + 1 - 2) // 4)
            shares = torch.softmax(scores[0, h, :, i, :limit], dim=-1).mean(0)
            best = shares.topk(6).indices.tolist()
            expected = {0, 1} | {2 + 4 * j + o for j in best for o in range(4)} | set(range(p - recent + 1, p + 1))
            assert set(rows) == expected


def _page_shares(retrieval, query, summaries, scale, newest=1):
    """Each page's share of a query's attention over `summaries`, averaged over a KV head's query heads and over the
    `newest` last queries."""
    scores = retrieval.page_scores(query[:, :, -newest:], summaries, scale)
    return torch.softmax(scores, dim=-1).mean(2)[0].mean(1)


def test_page_round_keeps_the_pages_the_newest_query_points_at():
    """page-round scores whole pages (from `n_sink` on) with the newest query only, as page-retrieval would for that
    query, and keeps the top pages inside `[lo, hi)` per KV head (`pages_ahead=0`: no page brings others)."""
    policy = RiftConfig(policy="page-round", budget=32, block_size=4, n_sink=2, window=4, pages_ahead=0).policy_object
    retrieval = RiftConfig(policy="page-retrieval", budget=32, block_size=4, n_sink=2, window=4).policy_object
    g = torch.Generator().manual_seed(3)
    keys = torch.randn(1, 2, 41, 8, generator=g)  # 2 sinks, 9 whole pages of 4, 3 tokens after them
    query = torch.randn(1, 4, 5, 8, generator=g)  # the last 5 queries; only the newest counts
    summaries = retrieval.summarise(keys[:, :, 2:38].unflatten(2, (9, 4)))
    shares = _page_shares(retrieval, query, summaries, 0.5)
    chosen = policy.select_pages(query, summaries, 0.5, lo=2, hi=30, count=12)  # pages 0..6 in [2, 30): best 3
    for h in range(2):
        best = sorted(shares[h, :7].topk(3).indices.tolist())
        assert chosen[h].tolist() == [2 + 4 * j + o for j in best for o in range(4)]
    # Only whole pages inside [lo, hi) are candidates: [7, 31) holds pages 2..6 (rows 10..29).
    chosen = policy.select_pages(query, summaries, 0.5, lo=7, hi=31, count=8)
    for h in range(2):
        best = sorted((shares[h, 2:7].topk(2).indices + 2).tolist())
        assert chosen[h].tolist() == [2 + 4 * j + o for j in best for o in range(4)]


def test_page_round_with_pages_ahead_brings_the_pages_after_the_best_ones():
    """`pages_ahead=2`: a page ranks by the best share among itself and the two candidate pages before it, ties broken
    by its own share (so the best page comes first, then the pages it lifts)."""
    policy = RiftConfig(policy="page-round", budget=64, block_size=4, n_sink=2, window=4, pages_ahead=2).policy_object
    retrieval = RiftConfig(policy="page-retrieval", budget=64, block_size=4, n_sink=2, window=4).policy_object
    assert RiftConfig(policy="page-round").pages_ahead == 2 and RiftConfig(policy="page-ahead").pages_ahead == 1
    g = torch.Generator().manual_seed(5)
    summaries = torch.randn(1, 2, 12, 8, generator=g)  # 2 KV heads, 12 pages after 2 sinks
    query = torch.randn(1, 4, 3, 8, generator=g)
    shares = _page_shares(retrieval, query, summaries, 0.5)
    chosen = policy.select_pages(query, summaries, 0.5, lo=6, hi=42, count=20)  # pages 1..9 in [6, 42): keep 5
    for h in range(2):
        own = {p: float(shares[h, p]) for p in range(1, 10)}
        ahead = {p: max(own[q] for q in range(max(1, p - 2), p + 1)) for p in own}
        best = sorted(sorted(own, key=lambda p: (-ahead[p], -own[p]))[:5])
        assert chosen[h].tolist() == [2 + 4 * p + o for p in best for o in range(4)]
    with pytest.raises(ValueError, match="pages_ahead"):
        RiftConfig(policy="page-round", pages_ahead=-1)


def test_page_round_scores_with_the_newest_score_queries_averaged():
    """`score_queries=3`: a page's score is its share averaged over the three newest queries (and the heads of a KV
    head), so a page only an older query points at can be kept; more than `window`, or 0, is refused."""
    policy = RiftConfig(policy="page-round", budget=64, block_size=4, window=4, pages_ahead=0, score_queries=3)
    retrieval = RiftConfig(policy="page-retrieval", budget=64, block_size=4, window=4).policy_object
    g = torch.Generator().manual_seed(7)
    summaries = torch.randn(1, 2, 10, 8, generator=g)
    query = torch.randn(1, 4, 5, 8, generator=g)
    shares = _page_shares(retrieval, query, summaries, 0.5, newest=3)
    chosen = policy.policy_object.select_pages(query, summaries, 0.5, lo=0, hi=40, count=12)
    newest_only = RiftConfig(policy="page-round", budget=64, block_size=4, window=4, pages_ahead=0).policy_object
    for h in range(2):
        best = sorted(shares[h].topk(3).indices.tolist())
        assert chosen[h].tolist() == [4 * j + o for j in best for o in range(4)]
    # The averaged choice differs from the newest query's alone here (else this case would not test the option).
    assert not torch.equal(chosen, newest_only.select_pages(query, summaries, 0.5, lo=0, hi=40, count=12))
    with pytest.raises(ValueError, match="score_queries.*window"):
        RiftConfig(policy="page-round", window=4, score_queries=5)
    with pytest.raises(ValueError, match="score_queries"):
        RiftConfig(policy="page-round", score_queries=0)
    with pytest.raises(ValueError, match="does not read `score_queries`"):
        RiftConfig(policy="rift-dyn", score_queries=2)


def test_page_round_with_several_scoring_queries_is_lossless():
    """Greedy output with `score_queries=4` equals the target's own, stacked over layers as by default."""
    import rift_hf
    from tiny import draft_target_pair, make_prompt

    target, draft = draft_target_pair("llama", 4)
    ids = make_prompt(60, seed=5)
    reference = target.generate(ids, max_new_tokens=30, do_sample=False)
    config = policy_settings(
        "page-round", {"budget": 24, "window": 4, "block_size": 4, "score_queries": 4, "draft_length": "fixed"}
    )
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=30, do_sample=False, cache_implementation="rift", cache_config=config
    )
    assert torch.equal(out, reference)
    assert len(rift_hf.last_stats(target).rescorings) > 0


def test_page_round_refreshes_once_per_round_after_the_verified_tokens_are_fed():
    """Assisted generation commits twice per round (after the rollback, after the re-feed); page-round refreshes only
    at the second, with the newest verified query, so it rescores at most once per round; lossless as every policy."""
    import rift_hf
    from tiny import draft_target_pair, make_prompt

    target, draft = draft_target_pair("llama", 4)
    ids = make_prompt(60, seed=3)
    reference = target.generate(ids, max_new_tokens=30, do_sample=False)
    config = policy_settings("page-round", {"budget": 24, "window": 4, "block_size": 4, "draft_length": "fixed"})
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=30, do_sample=False, cache_implementation="rift", cache_config=config
    )
    stats = rift_hf.last_stats(target)
    assert torch.equal(out, reference)
    at_commits = [e for e in stats.rescorings if e["reason"] != "in-round"]  # (by default once more inside a round)
    assert 0 < len(at_commits) <= len(stats.rounds)
    assert len(stats.rescorings) - len(at_commits) <= len(stats.rounds)


def test_page_round_keeps_its_page_summaries_up_to_date_through_rollbacks():
    """The layer adds the summaries of newly completed pages at each refresh (instead of summarising the store each
    round): after rounds with rollbacks they equal the store's pages summarised afresh, and the selection equals the
    one made from those."""
    import rift_hf  # noqa: F401  (the "rift" attention backend)
    from rift_hf.cache import RiftCache
    from tiny import make_prompt, tiny_model

    model = tiny_model("llama", attn="rift")
    config = policy_settings("page-round", {"budget": 24, "window": 4, "block_size": 4, "pages_ahead": 2})
    cache = RiftCache(model.config, config)
    cache.activate_past_recording()
    ids = make_prompt(41, seed=2)
    with torch.no_grad():
        token, position = model(ids, past_key_values=cache).logits[:, -1:].argmax(-1), ids.shape[1]
        for accepted in (1, 3, 0, 2, 3):  # rounds of 4 drafted tokens, `accepted` kept
            drafted = []
            for _ in range(4):
                logits = model(token, position_ids=torch.tensor([[position]]), past_key_values=cache).logits
                token, position = logits[:, -1:].argmax(-1), position + 1
                drafted.append(token)
            cache.crop(-(3 - accepted))
            position -= 3 - accepted
            token = drafted[accepted]
        model(token, position_ids=torch.tensor([[position]]), past_key_values=cache)  # re-feeds the verified token
        cache.settle()  # commits and refreshes, as assisted generation does after a round
    policy, config = cache.policy, cache.config
    assert len(cache.events) >= 4  # a refresh per round after the first selection
    for layer in cache.rift_layers:
        keys = layer.store_keys
        n_pages = (layer.seen - config.n_sink) // config.block_size
        span = keys[:, :, config.n_sink : config.n_sink + n_pages * config.block_size]
        reference = policy.summarise(span.unflatten(2, (n_pages, config.block_size)))
        torch.testing.assert_close(layer.pages.used_keys, reference, rtol=0, atol=0)
        hi = layer.seen - cache.recent
        chosen = policy.select_pages(layer.queries, reference, layer.scale, config.n_sink, hi, cache.n_select)
        assert torch.equal(layer.selected, chosen)
    # The refreshes above chose for both layers in one call (their heads stacked); it picks what each layer alone does.
    assert len(cache.rift_layers) > 1
    stacked = policy.select_layers(cache.rift_layers, cache)
    assert stacked is not None
    assert all(torch.equal(s, layer.selected) for s, layer in zip(stacked, cache.rift_layers, strict=True))
    cache.rift_layers[1].scale *= 2  # layers that are not alike: each selects for itself
    assert policy.select_layers(cache.rift_layers, cache) is None


def test_rank_pages_ahead_orders_like_two_stable_sorts_with_ties_and_signs():
    """The packed single sort gives the order of the rule as stated: ahead score, then own score, then index; with
    exact ties (a page and those it lifts; equal own scores) and negative scores."""
    from rift_hf.policies.selection import rank_pages_ahead

    g = torch.Generator().manual_seed(11)
    for ahead in (1, 2, 3):
        pages = torch.randint(-4, 5, (3, 40), generator=g).float() / 4  # many exact ties and both signs
        pages[0, :5] = 0.0
        lifted = pages.clone()
        for shift in range(1, ahead + 1):
            lifted[:, shift:] = torch.maximum(lifted[:, shift:], pages[:, :-shift])
        for h in range(3):
            expected = sorted(range(40), key=lambda p: (-float(lifted[h, p]), -float(pages[h, p]), p))
            assert rank_pages_ahead(pages, ahead)[h].tolist() == expected


def test_tokens_ahead_carries_each_score_forward_before_selection():
    from rift_hf.policies import carry_forward, snapkv_scores

    scores = torch.tensor([[[0.0, 5, 0, 0, 1, 0, 0, 0, 2, 0]]])
    assert carry_forward(scores, 2).tolist() == [[[0.0, 5, 5, 5, 1, 1, 1, 0, 2, 2]]]
    assert carry_forward(scores, 0) is scores
    g = torch.Generator().manual_seed(1)
    query, keys = torch.randn(1, 4, 4, 8, generator=g), torch.randn(1, 2, 32, 8, generator=g)
    policy = RiftConfig(policy="rift-dyn", budget=16, window=4, tokens_ahead=3).policy_object
    expected = carry_forward(snapkv_scores(query, keys, 0.3), 3)
    torch.testing.assert_close(policy.score(query, keys, 0.3, None), expected)
    picked = policy.select(policy.score(query, keys, 0.3, None), 1, 28, 6)
    plain = RiftConfig(policy="rift-dyn", budget=16, window=4).policy_object
    assert not torch.equal(picked, plain.select(plain.score(query, keys, 0.3, None), 1, 28, 6))


@pytest.mark.parametrize("value", [-1, True, 2.0])
def test_tokens_ahead_must_be_a_non_negative_int(value):
    with pytest.raises(ValueError, match="tokens_ahead"):
        RiftConfig(policy="rift-dyn", tokens_ahead=value)


@pytest.mark.parametrize("policy", ["full", "swa", "page-round", "page-retrieval"])
def test_tokens_ahead_is_refused_where_no_token_is_selected_by_score(policy):
    with pytest.raises(ValueError, match="does not read `tokens_ahead`.*only snapkv, rift-stat.*Drop `tokens_ahead`"):
        RiftConfig(policy=policy, tokens_ahead=4)
    RiftConfig(policy=policy, tokens_ahead=0)


def test_no_policy_is_built_on_another():
    """Policies share code through helpers (`policies.pages`, `selection`, `scorers`), not by subclassing each other:
    a flag such as `retrieves` never has to be switched back off by a child."""
    from rift_hf.policies.base import policy_class

    classes = [policy_class(name) for name in rift_hf.POLICIES]
    built_on = [(a.name, b.name) for a in classes for b in classes if a is not b and issubclass(a, b)]
    assert not built_on, built_on
