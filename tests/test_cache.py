"""Exact retention: values carry their token position, so what survives is read back exactly."""

import math

import pytest
import torch
from transformers import LlamaConfig

from rift_hf import RiftCache, RiftConfig

H_Q, H_KV, D = 4, 2, 8
SCALE = D**-0.5


def llama_config(layers=2):
    return LlamaConfig(
        num_hidden_layers=layers,
        num_attention_heads=H_Q,
        num_key_value_heads=H_KV,
        hidden_size=H_Q * D,
        head_dim=D,
        vocab_size=32,
    )


def naive_snapkv(query, key, kernel=5):
    """Loop-by-loop SnapKV: softmax per window query over keys up to its position, summed, averaged per group,
    then zero-padded average pooling. query [H_q, W, D], key [H_kv, T, D] -> [H_kv, T]."""
    h_kv, length = key.shape[0], key.shape[1]
    group, window = query.shape[0] // h_kv, query.shape[1]
    scores = torch.zeros(h_kv, length, dtype=torch.float64)
    for h in range(h_kv):
        for g in range(group):
            for i in range(window):
                pos = length - window + i
                logits = key[h, : pos + 1].double() @ query[h * group + g, i].double() * SCALE
                scores[h, : pos + 1] += torch.softmax(logits, 0) / group
    pad = kernel // 2
    padded = torch.nn.functional.pad(scores, (pad, pad))
    return torch.stack([padded[:, i : i + kernel].sum(-1) / kernel for i in range(length)], dim=-1)


class Driver:
    """Feeds a RiftCache as a model forward would: update every layer, then hand the layer its queries."""

    def __init__(self, cache: RiftCache, seed=0):
        self.cache, self.gen = cache, torch.Generator().manual_seed(seed)
        self.last_query = {}

    def forward(self, n):
        if not self.cache.record_past:
            self.cache.get_mask_sizes(n, 0)  # what the model asks first; settles the previous step
        for idx, layer in enumerate(self.cache.rift_layers):
            start = layer.seen
            k = torch.randn(1, H_KV, n, D, generator=self.gen)
            v = torch.zeros(1, H_KV, n, D)
            v[..., 0] = torch.arange(start, start + n, dtype=torch.float32)
            keys, _ = self.cache.update(k, v, idx)
            q = torch.randn(1, H_Q, n, D, generator=self.gen)
            self.last_query[idx] = q
            layer.observe(q, keys, SCALE, None)
            assert layer.get_seq_length() == start + n

    def kept(self, idx=0):
        layer = self.cache.rift_layers[idx]
        return [sorted(layer.values[0, h, :, 0].long().tolist()) for h in range(H_KV)]


def expected(seen, n_sink, recent, selected):
    return [sorted(set(range(n_sink)) | set(sel) | set(range(seen - recent, seen))) for sel in selected]


def top(scores, lo, hi, count):
    return [sorted((torch.topk(scores[h, lo:hi], count).indices + lo).tolist()) for h in range(scores.shape[0])]


@pytest.mark.parametrize("record", [False, True], ids=["plain", "assisted"])
def test_rift_stat_keeps_sinks_topk_and_recent(record):
    config = RiftConfig(policy="rift-stat", budget=20, window=6, n_sink=2)
    cache = RiftCache(llama_config(), config)
    if record:
        cache.activate_past_recording()
    drive = Driver(cache)
    drive.forward(50)
    keys = torch.cat([cache.rift_layers[0].keys[0]])  # [H_kv, 50, D], nothing evicted yet
    scores = naive_snapkv(drive.last_query[0][0, :, -6:], keys)
    recent, n_select = 10, 8  # floor(0.5 * 20), 20 - 10 - 2
    selected = top(scores, 2, 40, n_select)
    commit = (lambda: cache.crop(0)) if record else (lambda: cache.get_mask_sizes(1, 0))
    commit()
    assert drive.kept() == expected(50, 2, recent, selected)
    for _ in range(7):
        drive.forward(1)
        commit()
    assert cache.get_seq_length() == 57
    assert drive.kept() == expected(57, 2, recent, selected)  # the selection is fixed, the window slides
    assert cache.stored_tokens() == [20, 20]


def test_rollback_never_needs_an_evicted_entry():
    cache = RiftCache(llama_config(), RiftConfig(policy="swa", budget=12, n_sink=3))
    cache.activate_past_recording()
    drive = Driver(cache)
    drive.forward(30)
    cache.crop(0)
    assert drive.kept() == [list(range(3)) + list(range(21, 30))] * H_KV
    drive.forward(2)  # re-fed tokens
    for _ in range(4):  # drafts
        drive.forward(1)
        assert cache.stored_tokens()[0] <= 12 + 6
    cache.crop(-3)  # three drafts rejected
    assert cache.get_seq_length() == 33
    assert drive.kept() == [list(range(3)) + list(range(24, 33))] * H_KV
    with pytest.raises(ValueError, match="since the last commit"):
        cache.rift_layers[0].crop(-1)


def test_rift_stat_block_keeps_whole_blocks_for_all_heads():
    config = RiftConfig(policy="rift-stat-block", budget=30, window=4, block_size=4, n_sink=0)
    cache = RiftCache(llama_config(), config)
    drive = Driver(cache)
    drive.forward(60)
    keys = cache.rift_layers[0].keys[0]
    token_scores = naive_snapkv(drive.last_query[0][0, :, -4:], keys)
    budget = 28  # rounded down to whole blocks
    recent = 14  # floor(0.5 * 28) = 14; selected part 14 -> 3 blocks (12), remainder to the window: 16
    selected_tokens, recent = 12, 16
    block_means = token_scores[:, :56].reshape(H_KV, 14, 4).mean(-1).mean(0)
    hi_block = (60 - recent) // 4
    best = sorted(torch.topk(block_means[:hi_block], selected_tokens // 4).indices.tolist())
    positions = [p for b in best for p in range(4 * b, 4 * b + 4)]
    cache.get_mask_sizes(1, 0)
    assert drive.kept() == expected(60, 0, recent, [positions, positions])
    assert cache.stored_tokens()[0] == budget


@pytest.mark.parametrize("store_device", [None, "cpu"])
def test_rift_dyn_rescores_from_the_whole_store(store_device):
    config = RiftConfig(policy="rift-dyn", budget=16, window=4, delta=5, store_device=store_device)
    cache = RiftCache(llama_config(), config)
    cache.activate_past_recording()
    drive = Driver(cache)
    drive.forward(40)
    cache.crop(0)
    queries = []
    for _ in range(5):
        drive.forward(1)
        queries.append(drive.last_query[0])
        cache.crop(0)
    assert len(cache.events) == 1 and cache.events[0]["position"] == 45
    layer = cache.rift_layers[0]
    assert layer.store_keys.shape[-2] == 45
    window = torch.cat(queries[-4:], dim=2)[0]
    scores = naive_snapkv(window, layer.store_keys[0])
    selected = top(scores, 0, 45 - 8, 8)
    assert drive.kept() == expected(45, 0, 8, selected)  # generated positions are candidates too


def test_rejected_queries_are_discarded_with_their_tokens():
    config = RiftConfig(policy="rift-dyn", budget=16, window=4, delta=100)
    cache = RiftCache(llama_config(), config)
    cache.activate_past_recording()
    drive = Driver(cache)
    drive.forward(30)
    cache.crop(0)
    drive.forward(2)
    kept_query = drive.last_query[0]
    for _ in range(3):
        drive.forward(1)
    cache.crop(-3)
    layer = cache.rift_layers[0]
    assert layer.queries.shape[2] == 4
    assert torch.equal(layer.queries[:, :, -2:], kept_query)


def test_budget_at_least_context_is_lossless_storage():
    cache = RiftCache(llama_config(), RiftConfig(policy="rift-stat", budget=64, window=4))
    drive = Driver(cache)
    drive.forward(40)
    for _ in range(10):
        drive.forward(1)
    cache.get_mask_sizes(1, 0)
    assert drive.kept() == [list(range(50))] * H_KV
    assert cache.get_mask_sizes(1, 0) == (51, 0)


def test_mask_sizes_place_stored_entries_before_the_queries():
    cache = RiftCache(llama_config(), RiftConfig(policy="swa", budget=8))
    drive = Driver(cache)
    drive.forward(20)
    assert cache.get_mask_sizes(3, 0) == (8 + 3, 20 - 8)
    assert cache.get_seq_length() == 20
    assert math.isinf(RiftCache(llama_config(), RiftConfig(policy="full")).budget)


def test_each_policy_gets_the_layer_class_of_its_mode():
    from rift_hf import POLICIES, RiftLayer, RiftRetrievalLayer, RiftSelectLayer, RiftStoreLayer

    for name in POLICIES:
        policy = RiftConfig(policy=name).policy_type  # for auto: what both of its choices are
        cache = RiftCache(llama_config(), {"policy": name})
        want = RiftRetrievalLayer if policy.retrieves else RiftStoreLayer if policy.keeps_store else RiftSelectLayer
        assert {type(layer) for layer in cache.rift_layers} == {want}, name
    assert type(RiftCache(llama_config(), {"policy": "page-round"}).rift_layers[0]) is RiftStoreLayer
    assert type(RiftCache(llama_config(), {"policy": "page-retrieval"}).rift_layers[0]) is RiftRetrievalLayer
    assert type(RiftCache(llama_config(), {"policy": "rift-stat"}).rift_layers[0]) is RiftSelectLayer
    assert all(issubclass(c, RiftLayer) for c in (RiftSelectLayer, RiftStoreLayer, RiftRetrievalLayer))


def test_a_policy_that_refreshes_without_a_store_is_told_what_to_declare(monkeypatch):
    from rift_hf.policies.schedules import Every
    from rift_hf.policies.snapkv import SnapKV

    monkeypatch.setattr(SnapKV, "schedule", lambda self: Every(2))
    cache = RiftCache(llama_config(layers=1), {"policy": "snapkv", "budget": 8, "window": 4})
    layer = cache.rift_layers[0]
    keys = torch.randn(1, H_KV, 12, D)
    cache.update(keys, keys.clone(), 0)
    layer.observe(torch.randn(1, H_Q, 12, D), keys, SCALE, None)
    layer.commit(rescore=False)  # the first selection, from the prompt's scores
    with pytest.raises(ValueError, match="keeps_store = True"):
        layer.commit(rescore=True)
