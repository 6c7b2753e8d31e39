"""The chunked prompt pass (`prompt_chunk`): lossless, bounded while it reads, and what replay measures."""

import pytest
import torch

import rift_hf
from rift_hf import POLICIES, RiftCache, RiftConfig
from rift_hf.cache.reading import chunk_plan, reading_sizes
from rift_hf.config import policy_settings
from rift_hf.storage import QuantizedRows
from tiny import ARCHITECTURES, SMALL, after_updates, draft_target_pair, make_prompt

GAMMA = 4
PROMPT = 48
NEW = 24
CHUNK = 8
RESIDUAL = 8  # a quantised store's newest rows kept exact
COMPRESSED = [p for p in POLICIES if p != "full"]


@pytest.fixture(scope="module")
def pairs():
    return {}


def _pair(pairs, arch):
    if arch not in pairs:
        pairs[arch] = draft_target_pair(arch, GAMMA)
    return pairs[arch]


def _config(policy, **fields):
    return policy_settings(policy, {**SMALL, "prompt_chunk": CHUNK, "store_residual": RESIDUAL, **fields})


def _generate(target, draft, ids, config):
    return target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config=config,
    )


@pytest.fixture()
def reading_log(monkeypatch):
    """After every update of a compressed layer while the prompt is read in chunks: (rows attended, reading budget,
    the exact rows of its store where the store is quantised, else None)."""
    log = []

    def record(cache, layer_idx):
        layer = cache.layers[layer_idx]
        if cache.reading and layer in cache.rift_layers:
            exact = layer.store.recent.length if isinstance(layer.store, QuantizedRows) else None
            log.append((layer.stored, cache.budget, exact))

    after_updates(monkeypatch, record)
    return log


@pytest.mark.parametrize("policy", COMPRESSED)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_chunked_prompt_pass_is_lossless_and_bounded_while_it_reads(pairs, arch, policy, reading_log):
    target, draft = _pair(pairs, arch)
    ids = make_prompt(PROMPT, seed=5)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    out = _generate(target, draft, ids, _config(policy))
    assert torch.equal(out, reference)
    stats = rift_hf.last_stats(target)
    if RiftConfig(policy=policy).policy_type.retrieves:  # page-retrieval keeps every token: one forward
        assert stats.prompt_chunks == 0 and not reading_log
        return
    assert stats.prompt_chunks == -(-(PROMPT - 1) // CHUNK)  # all but the last token, in chunks
    assert stats.prompt_read_seconds > 0
    assert reading_log, "nothing was read in chunks"
    for stored, budget, exact in reading_log:
        assert stored <= budget + CHUNK
        if exact is not None:  # a quantised store (page-round's int4): its exact rows, then the chunk
            assert exact <= RESIDUAL + CHUNK


@pytest.mark.parametrize("policy", ["rift-dyn", "page-round"])
def test_a_store_policy_reads_with_its_prompt_budget_then_keeps_its_budget(pairs, policy, reading_log):
    target, draft = _pair(pairs, "llama")
    ids = make_prompt(64, seed=6)
    config = _config(policy, budget=33, prompt_budget=9)  # whole 4-token pages after the sink
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    assert torch.equal(_generate(target, draft, ids, config), reference)
    assert {budget for _, budget, _ in reading_log} == {9}  # every chunk read with the prompt budget
    assert any(exact is not None for _, _, exact in reading_log) == (policy == "page-round")  # int4 by default
    assert max(stored for stored, _, _ in reading_log) <= 9 + CHUNK
    assert rift_hf.last_stats(target).budget == 33  # and the cache drafts with its own


def test_chunked_reading_holds_less_than_the_whole_prompt_pass(pairs):
    target, draft = _pair(pairs, "llama")
    ids = make_prompt(400, seed=7)
    peaks = {}
    for chunk in (0, 32):
        config = policy_settings("page-round", {**SMALL, "budget": 64, "prompt_chunk": chunk, "store_dtype": None})
        _generate(target, draft, ids, config)
        peaks[chunk] = rift_hf.last_stats(target).peak_bytes
    # A whole pass holds the prompt's rows twice (working set and store) before its first commit; in chunks the
    # store fills up while the working set stays near the budget.
    assert peaks[32] < 0.7 * peaks[0], peaks


def test_chunk_plan_reads_only_what_compression_would_shrink():
    config = RiftConfig(policy="page-round", budget=0.25, prompt_chunk=64, window=16)
    cache = RiftCache(_llama_config(), config)
    assert chunk_plan(cache, 1000, 999) == 64
    assert chunk_plan(cache, 1000, 50) == 0  # fits in one chunk
    kept_whole = RiftCache(_llama_config(), {"policy": "page-round", "budget": 2000, "prompt_chunk": 64})
    assert chunk_plan(kept_whole, 1000, 999) == 0
    assert chunk_plan(RiftCache(_llama_config(), {"policy": "full", "prompt_chunk": 64}), 1000, 999) == 0
    # The default: chunks of 1024 (or the observation window), none with a quantised selection.
    assert chunk_plan(RiftCache(_llama_config(), {"policy": "page-round", "window": 16}), 3000, 2999) == 1024
    assert RiftConfig(policy="rift-stat", window=2048).reading_chunk == 2048
    assert RiftConfig(policy="rift-stat", kv_dtype="int4").reading_chunk == 0
    assert RiftConfig(policy="page-round", prompt_chunk=0).reading_chunk == 0


def test_reading_sizes_follow_the_policy_layout():
    store = RiftConfig(policy="rift-dyn", budget=0.5, prompt_chunk=64, prompt_budget=128)
    assert reading_sizes(store, 1000, 500, 250, 250) == (128, 64, 64)
    select = RiftConfig(policy="rift-stat", budget=0.5, prompt_chunk=64, prompt_budget=128)
    assert reading_sizes(select, 1000, 500, 250, 250) == (500, 250, 250)  # no store: it reads with its budget
    larger = RiftConfig(policy="rift-dyn", budget=0.5, prompt_chunk=64, prompt_budget=900)
    assert reading_sizes(larger, 1000, 500, 250, 250) == (500, 250, 250)  # never above the budget


@pytest.mark.parametrize(
    ("fields", "error", "match"),
    [
        ({"prompt_chunk": 8}, ValueError, "at least 64"),
        ({"prompt_chunk": -1}, ValueError, "prompt_chunk"),
        ({"prompt_chunk": 64.0}, TypeError, "prompt_chunk"),
        ({"prompt_budget": 128, "prompt_chunk": 0}, ValueError, "set `prompt_chunk` too"),
        ({"prompt_chunk": 64, "prompt_budget": 1.5}, ValueError, "fraction"),
        ({"prompt_chunk": 64, "prompt_budget": 0}, ValueError, "positive"),
        ({"prompt_chunk": 64, "prompt_budget": "half"}, TypeError, "prompt_budget"),
        ({"prompt_chunk": 64, "kv_dtype": "int4", "policy": "rift-stat"}, ValueError, "kv_dtype"),
    ],
)
def test_reading_fields_are_checked(fields, error, match):
    with pytest.raises(error, match=match):
        RiftConfig(**{"policy": "page-round", **fields})


def _llama_config():
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
        head_dim=16, num_hidden_layers=2,
    )  # fmt: skip


def test_a_prompt_longer_than_the_chunked_pass_was_measured_on_is_read_in_one_forward_unless_asked():
    from rift_hf.config import CHUNKED_UP_TO, DEFAULT_CHUNK

    assert RiftConfig().fitted(CHUNKED_UP_TO).reading_chunk == DEFAULT_CHUNK
    assert RiftConfig().fitted(CHUNKED_UP_TO + 1).reading_chunk == 0  # auto -> rift-dyn, one forward
    assert RiftConfig(policy="page-round", budget=4096).fitted(2 * CHUNKED_UP_TO).reading_chunk == 0
    assert RiftConfig(policy="rift-dyn", prompt_chunk=2048).fitted(4 * CHUNKED_UP_TO).reading_chunk == 2048
    assert RiftConfig(policy="rift-dyn", prompt_budget=1024).fitted(2 * CHUNKED_UP_TO).reading_chunk == DEFAULT_CHUNK
