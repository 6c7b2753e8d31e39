"""Decode-phase runs: generation from recorded prompt forwards equals plain greedy output and a fresh run's rounds."""

import pytest
import torch

import rift_hf
from rift_hf import POLICIES
from rift_hf.config import policy_settings
from rift_hf.generation.decode import generate_from
from rift_hf.prefill import PromptCache
from rift_hf.replay import TargetOutput, replay
from tiny import draft_target_pair, make_prompt

GAMMA = 4
NEW = 32
# Fixed draft lengths: rounds are compared between runs (the cost-aware length depends on timing).
SMALL = {
    "budget": 16,
    "window": 4,
    "delta": 4,
    "n_sink": 1,
    "block_size": 4,
    "a_min": 4,
    "a_max": 12,
    "draft_length": "fixed",
}
# Attention-only drafters: a full-attention one, a sliding + full one, one with sinks (GPT-OSS).
ARCHES = ("llama", "gemma3", "gpt_oss")


@pytest.fixture(scope="module")
def pairs():
    return {arch: draft_target_pair(arch, GAMMA) for arch in ARCHES}


@pytest.fixture(scope="module")
def caches(pairs):
    ids = make_prompt(40, seed=3)
    return ids, {
        arch: PromptCache.compute(target, ids, draft, window=SMALL["window"]) for arch, (target, draft) in pairs.items()
    }


def _rounds(stats):
    return [(r["drafted"], r["accepted"]) for r in stats.rounds]


@pytest.mark.parametrize("arch", ARCHES)
@pytest.mark.parametrize("policy", POLICIES)
def test_reused_prefills_equal_plain_greedy_and_a_fresh_run(pairs, caches, arch, policy):
    target, draft = pairs[arch]
    ids, prompt_caches = caches
    gen = {"max_new_tokens": NEW, "min_new_tokens": NEW}
    plain = target.generate(ids, do_sample=False, **gen)
    config = policy_settings(policy, SMALL)
    fresh = target.generate(
        ids, assistant_model=draft, do_sample=False, cache_implementation="rift", cache_config=config, **gen
    )
    fresh_rounds = _rounds(rift_hf.last_stats(target))
    assert rift_hf.last_stats(target).prompt_load_seconds is None  # the drafter computed its prompt itself
    out, seconds = generate_from(
        target, prompt_caches[arch], assistant_model=draft, cache_implementation="rift", cache_config=config, **gen
    )
    assert seconds > 0
    assert torch.equal(out, plain) and torch.equal(fresh, plain)
    # The drafter starts exactly where its own prompt forward would have left it: the same rounds.
    assert _rounds(rift_hf.last_stats(target)) == fresh_rounds
    assert 0 < rift_hf.last_stats(target).prompt_load_seconds < seconds  # timed inside the decode phase


@pytest.mark.parametrize("arch", ARCHES)
def test_transformers_own_loop_and_the_target_alone_from_reused_prefills(pairs, caches, arch):
    target, draft = pairs[arch]
    ids, prompt_caches = caches
    gen = {"max_new_tokens": NEW, "min_new_tokens": NEW}
    plain = target.generate(ids, do_sample=False, **gen)
    alone, _ = generate_from(target, prompt_caches[arch], **gen)
    assisted, _ = generate_from(target, prompt_caches[arch], assistant_model=draft, **gen)
    assert torch.equal(alone, plain) and torch.equal(assisted, plain)
    # The target's cut first forward is undone after the call: plain assisted generation still works.
    assert torch.equal(target.generate(ids, assistant_model=draft, do_sample=False, **gen), plain)


def test_reused_prefill_rounds_equal_replay(pairs, caches):
    target, draft = pairs["llama"]
    ids, prompt_caches = caches
    gen = {"max_new_tokens": NEW, "min_new_tokens": NEW}
    for policy in ("page-round", "rift-dyn", "snapkv"):
        config = policy_settings(policy, SMALL)
        out, _ = generate_from(
            target,
            prompt_caches["llama"],
            assistant_model=draft,
            cache_implementation="rift",
            cache_config=config,
            **gen,
        )
        record = TargetOutput(
            prompt_ids=ids,
            output_ids=out[:, ids.shape[1] :],
            max_new_tokens=NEW,
            min_new_tokens=NEW,
            eos_token_id=[],
        )
        replayed = replay(draft, record, config, prefill=prompt_caches["llama"].draft)
        assert _rounds(replayed) == _rounds(rift_hf.last_stats(target)), policy


def test_prompt_cache_saves_and_loads(tmp_path, pairs, caches):
    target, draft = pairs["gemma3"]
    ids, prompt_caches = caches
    prompt_caches["gemma3"].save(tmp_path / "p", model="tiny")
    loaded = PromptCache.load(tmp_path / "p")
    assert torch.equal(loaded.input_ids, ids)
    gen = {"max_new_tokens": NEW, "min_new_tokens": NEW}
    config = policy_settings("rift-stat", SMALL)
    a, _ = generate_from(target, loaded, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
    b, _ = generate_from(
        target, prompt_caches["gemma3"], assistant_model=draft, cache_implementation="rift", cache_config=config, **gen
    )
    assert torch.equal(a, b)
    with pytest.raises(FileNotFoundError, match="no target.safetensors"):
        PromptCache.load(tmp_path / "missing")


def test_prompt_cache_refusals(pairs, caches):
    target, draft = pairs["llama"]
    ids, prompt_caches = caches
    with pytest.raises(ValueError, match="greedily"):
        generate_from(target, prompt_caches["llama"], do_sample=True, max_new_tokens=4)
    with pytest.raises(ValueError, match="drop `past_key_values`"):
        generate_from(target, prompt_caches["llama"], past_key_values=None, max_new_tokens=4)
    bare = PromptCache.compute(target, ids)
    with pytest.raises(ValueError, match="no drafter record"):
        generate_from(target, bare, assistant_model=draft, max_new_tokens=4)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        PromptCache.compute(target, ids[:, :1])
    with pytest.raises(ValueError, match="pad token"):
        PromptCache.compute(target, torch.zeros(1, 8, dtype=torch.long))
    stateful_target, stateful_draft = draft_target_pair("qwen3_5", GAMMA)
    with pytest.raises(ValueError, match="recurrent"):
        PromptCache.compute(stateful_target, ids, stateful_draft)


def test_the_setup_cost_benchmark_loads_one_record_into_each_settings_cache(pairs, caches):
    from benchmarks.setup_cost import SETTINGS, setup_seconds

    target, draft = pairs["llama"]
    _, prompt_caches = caches
    for label in SETTINGS:
        load, first = setup_seconds(draft.config, prompt_caches["llama"].draft, label)
        assert load > 0
        assert (first == 0) == (label == "transformers"), (label, first)
    with pytest.raises(ValueError, match="Unknown RIFT policy"):
        setup_seconds(draft.config, prompt_caches["llama"].draft, "no-such-policy")
