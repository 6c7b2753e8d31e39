"""Storage apart from policy: the ring keeps exactly the recent window, commits write only the new rows."""

import random

import pytest
import torch

from rift_hf import RiftCache, RiftConfig
from rift_hf.storage import RecentRows, Rows, WorkingSet


def rows_of(seen_from: int, count: int, heads=2, dim=3):
    """Keys whose first feature is the token position, so a row names itself."""
    keys = torch.zeros(1, heads, count, dim)
    keys[..., 0] = torch.arange(seen_from, seen_from + count, dtype=torch.float32)
    return keys


@pytest.mark.parametrize("seed", range(5))
def test_ring_holds_fixed_plus_the_newest_ring_size_rows(seed):
    rng = random.Random(seed)
    heads, fixed, ring = 2, 3, rng.randint(1, 9)
    prompt = fixed + ring + rng.randint(0, 20)
    source = rows_of(0, prompt)
    ws = WorkingSet(source, capacity=4)
    index = torch.cat([torch.arange(fixed), torch.arange(prompt - ring, prompt)]).expand(heads, -1)
    ws.build(source, source.clone(), index, fixed, ring, headroom=2)
    seen = prompt
    for _ in range(40):
        drafted = rng.randint(1, 12)
        ws.append(rows_of(seen, drafted), rows_of(seen, drafted), torch.arange(seen, seen + drafted).expand(heads, -1))
        rejected = rng.randint(0, drafted)
        ws.length -= rejected  # rollback before the commit
        seen += drafted - rejected
        ws.commit()
        expected = sorted(list(range(fixed)) + list(range(max(fixed, seen - ring), seen)))
        for h in range(heads):
            assert sorted(ws.used_keys[0, h, :, 0].long().tolist()) == expected
            assert sorted(ws.used_positions[h].tolist()) == expected
        assert ws.length == fixed + ring


def test_rows_grow_by_doubling_and_keep_their_rows():
    rows = Rows(torch.zeros(1, 2, 0, 3), capacity=2, with_positions=True)
    for start in range(0, 20, 3):
        rows.append(rows_of(start, 3), rows_of(start, 3), torch.arange(start, start + 3).expand(2, -1))
    assert rows.capacity == 32 and rows.length == 21
    assert rows.used_keys[0, 1, :, 0].long().tolist() == list(range(21))
    assert rows.used_positions[0].tolist() == list(range(21))


@pytest.mark.parametrize("seed", range(5))
def test_recent_rows_keep_the_newest_rows_in_order(seed):
    """Appends, rollbacks and trims against a plain list; a long chunk grows the buffer, a trim shrinks it back."""
    rng = random.Random(seed)
    window = rng.randint(1, 8)
    recent, expected, seen = RecentRows(window + 4), [], 0
    for step in range(60):
        n = rng.choice([1, 1, 2, 5]) if step else rng.randint(20, 40)  # a prefill-sized chunk first
        recent.append(rows_of(seen, n))
        expected += list(range(seen, seen + n))
        seen += n
        rejected = rng.randint(0, n - 1)
        recent.drop(rejected)
        del expected[len(expected) - rejected :]
        seen -= rejected
        assert recent.used[0, 1, :, 0].long().tolist() == expected
        recent.trim(window)
        expected = expected[-window:]
        assert recent.used[0, 0, :, 0].long().tolist() == expected
        assert recent.buffer.shape[2] == window + 4  # back to its default size after the first trim
    assert len(recent) == window


def test_a_commit_writes_rows_and_never_rebuilds_the_working_set(monkeypatch):
    """After the first selection, decoding moves k rows per commit: no gather, no new buffer."""
    from transformers import LlamaConfig

    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=16, head_dim=8)
    cache = RiftCache(config, RiftConfig(policy="swa", budget=16, n_sink=2))
    cache.activate_past_recording()
    layer = cache.layers[0]
    cache.update(torch.randn(1, 1, 40, 8), torch.randn(1, 1, 40, 8), 0)
    cache.crop(0)  # first compression: one gather
    buffer = layer.working.keys.data_ptr()
    gathers = []
    original = torch.gather
    monkeypatch.setattr(torch, "gather", lambda *a, **k: gathers.append(1) or original(*a, **k))
    for _ in range(30):
        cache.update(torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8), 0)  # the verified token
        cache.update(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 4, 8), 0)  # drafts
        cache.crop(-2)
    assert not gathers and layer.working.keys.data_ptr() == buffer
    assert layer.stored == 16 and cache.get_seq_length() == 40 + 30 * 3
