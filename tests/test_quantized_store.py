"""A quantised full store: bounded round-trip error, rows dequantised on demand, lossless generation, byte counts."""

import pytest
import torch
from transformers import LlamaConfig

import rift_hf
from rift_hf import RiftCache, RiftConfig
from rift_hf.config import policy_settings
from rift_hf.storage import QuantizedRows
from tiny import draft_target_pair, make_prompt

STORE_POLICIES = [p for p in rift_hf.POLICIES if RiftConfig(policy=p).keeps_store]


@pytest.mark.parametrize("dtype,bits", [("int8", 8), ("int4", 4), ("int2", 2)])
def test_round_trip_error_is_within_one_quantisation_step(dtype, bits):
    torch.manual_seed(0)
    rows = torch.randn(1, 2, 300, 64)
    store = QuantizedRows(rows[:, :, :0], dtype, group_size=32, residual=16)
    store.append(rows, rows * 2)
    store.commit(300)
    assert store.quantized == 272 and store.length == 300  # whole chunks of 16, >= 16 rows kept exact
    keys, values = store.used_keys, store.used_values
    assert torch.equal(keys[:, :, 272:], rows[:, :, 272:])  # the residual is exact
    # Values per token: int8 symmetric (half a step of absmax / 127), else affine per group of 32 channels.
    if bits == 8:
        value_step = (rows * 2).abs().amax(-1, keepdim=True) / 127
    else:
        groups = (rows * 2).unflatten(-1, (2, 32))
        value_step = ((groups.amax(-1) - groups.amin(-1)) / (2**bits - 1)).repeat_interleave(32, dim=-1)
    # Keys per channel, over each chunk of 16 tokens (the group is the chunk: min(32, 16)).
    chunks = rows[:, :, :272].unflatten(2, (17, 16))  # [B, H, chunk, token, D]
    if bits == 8:
        key_step = chunks.abs().amax(3, keepdim=True) / 127
    else:
        key_step = (chunks.amax(3, keepdim=True) - chunks.amin(3, keepdim=True)) / (2**bits - 1)
    key_step = key_step.expand_as(chunks).flatten(2, 3)
    for got, want, step in ((keys[:, :, :272], rows[:, :, :272], key_step), (values, rows * 2, value_step)):
        error = (got - want[:, :, : got.shape[2]]).abs()
        assert bool((error <= step[:, :, : got.shape[2]] / 2 * 1.01 + 1e-6).all()), float((error - step / 2).max())
        assert float(error[:, :, :272].max()) > 0  # really quantised


@pytest.mark.parametrize("dtype", ["int8", "int4", "int2"])
def test_gather_dequantises_the_rows_asked_for(dtype):
    torch.manual_seed(1)
    rows = torch.randn(1, 2, 200, 64)
    store = QuantizedRows(rows[:, :, :0], dtype, group_size=32, residual=32)
    store.append(rows, -rows)
    store.commit(190)
    assert store.quantized == 128  # whole chunks, >= 32 committed rows exact
    index = torch.tensor([[0, 5, 127, 128, 199], [3, 64, 100, 150, 160]])
    keys, values = store.gather(index)
    dense_k, dense_v = store.used_keys, store.used_values
    for head in range(2):
        assert torch.equal(keys[0, head], dense_k[0, head, index[head]])
        assert torch.equal(values[0, head], dense_v[0, head, index[head]])
    assert torch.equal(keys[0, 0, 3:], rows[0, 0, [128, 199]])  # exact rows past the quantised ones
    assert torch.equal(store.key_rows(100, 140), dense_k[:, :, 100:140])
    with pytest.raises(ValueError, match="must divide"):
        QuantizedRows(rows[:, :, :0], "int4", group_size=48, residual=64)


def test_rollback_and_rescoring_never_touch_quantised_rows():
    config = LlamaConfig(num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, hidden_size=128)
    cache = RiftCache(
        config, RiftConfig(policy="rift-dyn", budget=32, window=4, delta=4, store_dtype="int4", store_residual=8)
    )
    cache.activate_past_recording()
    layer = cache.layers[0]
    out, _ = cache.update(torch.randn(1, 1, 100, 64), torch.randn(1, 1, 100, 64), 0)
    layer.observe(torch.randn(1, 2, 100, 64), out, 0.125, None)
    cache.crop(0)
    for _ in range(12):
        out, _ = cache.update(torch.randn(1, 1, 1, 64), torch.randn(1, 1, 1, 64), 0)
        layer.observe(torch.randn(1, 2, 1, 64), out, 0.125, None)
        out, _ = cache.update(torch.randn(1, 1, 3, 64), torch.randn(1, 1, 3, 64), 0)
        layer.observe(torch.randn(1, 2, 3, 64), out, 0.125, None)
        cache.crop(-2)
    assert cache.get_seq_length() == 124 and layer.store.length == 124
    assert layer.store.quantized >= 100 and cache.events  # rescored from a mostly quantised store
    assert layer.stored == 32


def _assisted_and_greedy(policy: str, **fields):
    """Greedy output of a tiny Llama pair, plain and assisted with a small rift config plus `fields`."""
    target, draft = draft_target_pair("llama", 4)
    ids = make_prompt(60, seed=3)
    reference = target.generate(ids, max_new_tokens=30, do_sample=False)
    settings = {"budget": 16, "window": 4, "delta": 4, "block_size": 4, "a_min": 4, "a_max": 12, "check_interval": 2}
    # draft every round, so the store is rescored (tiny models draft at a loss)
    config = {**policy_settings(policy, settings), "draft_length": "fixed", **fields}
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=30, do_sample=False, cache_implementation="rift", cache_config=config
    )
    return out, reference, rift_hf.last_stats(target)


@pytest.mark.parametrize("dtype", ["int4", "int8"])
@pytest.mark.parametrize("policy", STORE_POLICIES)
def test_greedy_output_is_lossless_with_a_quantised_store(policy, dtype):
    out, reference, stats = _assisted_and_greedy(policy, store_dtype=dtype, store_group_size=16, store_residual=8)
    assert torch.equal(out, reference)
    assert stats.rescorings


def test_kv_bytes_reports_the_quantised_size():
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=256)
    sizes = {}
    for dtype in (None, "int8", "int4"):
        cache = RiftCache(config, RiftConfig(policy="rift-dyn", budget=256, store_dtype=dtype))
        for idx in range(2):
            cache.update(torch.randn(1, 2, 4096, 64, dtype=torch.bfloat16), torch.randn(1, 2, 4096, 64).bfloat16(), idx)
        for layer in cache.rift_layers:
            layer.store.commit(4096) if dtype else None
        sizes[dtype] = cache.kv_bytes()["store"]
    assert sizes[None] == 2 * 2 * 2 * 4096 * 64 * 2  # layers x (k, v) x heads x tokens x dim x bf16
    assert sizes["int4"] <= 0.30 * sizes[None]  # packed nibbles + a bf16 scale and shift per 64 values
    assert sizes["int8"] <= 0.55 * sizes[None]


def test_bad_quantised_store_settings_say_what_to_do():
    with pytest.raises(ValueError, match="does not keep"):
        RiftConfig(policy="rift-stat", store_dtype="int4")
    with pytest.raises(ValueError, match="one of int8, int4, int2"):
        RiftConfig(policy="rift-dyn", store_dtype="fp8")
    with pytest.raises(ValueError, match="quantised"):
        RiftConfig(policy="rift-dyn", store_dtype="int4", attend_in_place=True)


# A quantised working set: the selected rows in kv_dtype, sinks and the recent window in the model's dtype.
SELECTING_POLICIES = [
    p
    for p in rift_hf.POLICIES
    if rift_hf.policies.policy_class(p).scored and not rift_hf.policies.policy_class(p).retrieves
]


def _filled_cache(policy: str, budget: int, dtype=torch.bfloat16, **fields):
    """A 2-layer cache after a 512-token prefill and its first compression (the selection made from the keys)."""
    torch.manual_seed(0)
    config = LlamaConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, hidden_size=256)
    cache = RiftCache(config, RiftConfig(policy=policy, budget=budget, window=8, n_sink=4, **fields))
    keys = torch.randn(1, 2, 512, 64, dtype=dtype)
    for idx in range(2):
        out, _ = cache.update(keys, keys * 2, idx)
        cache.layers[idx].observe(torch.randn(1, 4, 512, 64, dtype=dtype), out, 0.125, None)
    cache.crop(0)  # the first commit compresses
    return cache, keys


def test_selected_rows_round_trip_within_one_quantisation_step():
    full, keys = _filled_cache("snapkv", 128, torch.float32)  # fp32: scales and shifts without bf16 rounding
    quantised, _ = _filled_cache("snapkv", 128, torch.float32, kv_dtype="int4", kv_group_size=32)
    a, b = full.layers[0], quantised.layers[0]
    assert b.stored == a.stored == 128
    order_a, order_b = a.positions.argsort(-1), b.positions.argsort(-1)
    pos_a, pos_b = a.positions.gather(-1, order_a), b.positions.gather(-1, order_b)
    assert torch.equal(pos_a, pos_b)  # the same rows are kept, in another layout
    rows = lambda t, order: t.gather(2, order[None, :, :, None].expand(1, -1, -1, 64)).float()  # noqa: E731
    exact, approx = rows(a.keys, order_a), rows(b.keys, order_b)
    selected = torch.isin(pos_a, b.working.selection[2])  # [H, N]: rows of the quantised selection
    assert bool(selected.any()) and torch.equal(exact[0][~selected], approx[0][~selected])  # sinks, window exact
    # Keys per channel over groups of 32 selected tokens: bound each by half a step of its channel's range over all
    # selected tokens of its head (a group's range is never wider).
    sel = exact[0].masked_fill(~selected[..., None], float("nan"))
    span = sel.nan_to_num(-1e9).amax(1, keepdim=True) - sel.nan_to_num(1e9).amin(1, keepdim=True)  # [H, 1, D]
    error = (exact[0] - approx[0]).abs()
    assert bool((error[selected] <= (span / 15 / 2 * 1.01 + 1e-6).expand_as(error)[selected]).all())
    assert float(error[selected].max()) > 0


def test_kv_bytes_and_equal_bytes_budget():
    sizes, rows = {}, {}
    for dtype in (None, "int8", "int4"):
        cache, _ = _filled_cache("rift-stat", 128, kv_dtype=dtype)
        sizes[dtype], rows[dtype] = cache.kv_bytes()["working"], cache.stored_tokens()[0]
    assert rows[None] == rows["int8"] == rows["int4"] == 128
    assert sizes["int4"] < sizes["int8"] < sizes[None]
    kept = {}
    for dtype in ("int8", "int4"):
        cache, _ = _filled_cache("rift-stat", 128, kv_dtype=dtype, kv_equal_bytes=True)
        held, kept[dtype] = cache.kv_bytes()["working"], cache.stored_tokens()[0]
        assert kept[dtype] == cache.budget
        # The bytes of 128 bf16 rows, less what rounding to whole rows (int8) or to whole key groups of 64 tokens
        # (int4: 3.6 x 60 = 213 selected rows -> 192) leaves unused.
        assert sizes[None] * (0.97 if dtype == "int8" else 0.85) <= held <= sizes[None]
    # rift-stat: 4 sinks + 64 recent + 60 selected; the selection grows ~1.9x at int8, ~3.6x at int4 (64-dim heads)
    assert kept["int8"] - 68 >= 1.9 * 60 and kept["int4"] - 68 == 192


@pytest.mark.parametrize("dtype", ["int8", "int4"])
def test_equal_bytes_may_count_in_another_dtype(dtype):
    """An fp32 model (exact replay) with `kv_equal_bytes="bfloat16"` holds the rows a bf16 model holds with True;
    counted in its own fp32 bytes it holds more."""
    as_bf16, _ = _filled_cache("rift-stat", 128, torch.bfloat16, kv_dtype=dtype, kv_equal_bytes=True)
    fp32_as_bf16, _ = _filled_cache("rift-stat", 128, torch.float32, kv_dtype=dtype, kv_equal_bytes="bfloat16")
    fp32_own, _ = _filled_cache("rift-stat", 128, torch.float32, kv_dtype=dtype, kv_equal_bytes=True)
    assert fp32_as_bf16.budget == as_bf16.budget < fp32_own.budget
    assert fp32_as_bf16.stored_tokens() == as_bf16.stored_tokens()


@pytest.mark.parametrize("dtype", ["int4", "int8"])
@pytest.mark.parametrize("policy", SELECTING_POLICIES)
def test_greedy_output_is_lossless_with_a_quantised_working_set(policy, dtype):
    out, reference, stats = _assisted_and_greedy(
        policy, kv_dtype=dtype, kv_group_size=16, kv_equal_bytes=dtype == "int4"
    )
    assert torch.equal(out, reference)
    assert stats.peak_kv_bytes > 0


def test_bad_quantised_working_set_settings_say_what_to_do():
    for policy in ("full", "swa", "page-retrieval"):
        with pytest.raises(ValueError, match="selecting policy"):
            RiftConfig(policy=policy, kv_dtype="int4")
    with pytest.raises(ValueError, match="one of int8, int4, int2"):
        RiftConfig(policy="rift-stat", kv_dtype="fp8")
    with pytest.raises(ValueError, match="set `kv_dtype`"):
        RiftConfig(policy="rift-stat", kv_equal_bytes=True)
    with pytest.raises(TypeError, match="as if the model ran in that dtype"):
        RiftConfig(policy="rift-stat", kv_dtype="int4", kv_equal_bytes="int4")
    with pytest.raises(ValueError, match="drop one"):
        RiftConfig(policy="rift-dyn", kv_dtype="int4", attend_in_place=True)


def test_per_channel_keys_survive_an_outlier_channel():
    from benchmarks.key_quant import attention_shift
    from rift_hf.storage import Quantizer

    torch.manual_seed(0)
    keys = torch.randn(1, 2, 256, 64)
    keys[..., 3] *= 30  # one outlier channel, as RoPE'd keys have
    query = torch.randn(1, 4, 8, 64)
    shift = {pc: attention_shift(query, keys, 0.125, Quantizer(keys, "int4", 64, pc)) for pc in (False, True)}
    assert shift[True] < shift[False] / 2
