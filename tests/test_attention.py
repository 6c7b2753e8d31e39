import torch
from transformers import LlamaConfig

from rift_hf import RiftCache
from rift_hf.attention import attend, rift_attention_forward


class _Module(torch.nn.Module):
    layer_idx = 0


def _cache():
    config = LlamaConfig(
        num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, hidden_size=32, head_dim=8, vocab_size=32
    )
    return RiftCache(config, {"policy": "rift-dyn", "budget": 16, "window": 4})


def test_queries_reach_only_the_layer_whose_keys_are_attended():
    cache = _cache()
    keys, values = cache.update(torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), 0)
    layer = cache.rift_layers[0]
    other_key = torch.randn(1, 2, 5, 8)  # another model's attention, same layer index
    rift_attention_forward(_Module(), torch.randn(1, 4, 5, 8), other_key, torch.randn(1, 2, 5, 8), None, 8**-0.5)
    assert layer.queries is None
    rift_attention_forward(_Module(), torch.randn(1, 4, 5, 8), keys, values, None, 8**-0.5)
    assert layer.queries.shape == (1, 4, 5, 8)


def test_attend_matches_sdpa_and_handles_sinks():
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    mask = torch.ones(1, 1, 3, 7, dtype=torch.bool).tril(4)
    expected = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
    )
    torch.testing.assert_close(attend(q, k, v, mask, 0.3), expected)
    # A sink of -inf contributes nothing; the manual path then equals sdpa too.
    torch.testing.assert_close(attend(q, k, v, mask, 0.3, sinks=torch.full((4,), -1e9)), expected)
    damped = attend(q, k, v, mask, 0.3, sinks=torch.full((4,), 5.0))
    assert damped.abs().mean() < expected.abs().mean()  # mass taken by the sink
