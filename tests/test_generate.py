"""Lossless assisted generation for every policy x drafter architecture, and the generate() integration."""

import pytest
import torch
from transformers import DynamicCache, StaticCache

import rift_hf
from rift_hf import POLICIES, RiftCache, RiftConfig
from rift_hf.config import policy_settings
from tiny import (
    ARCHITECTURES,
    SMALL,
    STATEFUL_ARCHITECTURES,
    after_updates,
    attended_rows,
    draft_target_pair,
    make_prompt,
    tiny_model,
    tiny_target,
)

GAMMA = 4
PROMPT = 40
NEW = 40


@pytest.fixture(scope="module")
def pairs():
    return {arch: draft_target_pair(arch, GAMMA) for arch in ARCHITECTURES}


@pytest.fixture()
def invariant_log(monkeypatch):
    """Records, after every update of a compressed layer: (stored, budget, seq_length, tokens written)."""
    log = []

    def record(cache, layer_idx):
        layer = cache.layers[layer_idx]
        stored = attended_rows(layer) if layer in cache.rift_layers else None
        if stored is not None:
            log.append((stored, cache.budget, layer.get_seq_length(), layer.positions[0, -1].item() + 1))

    after_updates(monkeypatch, record)
    return log


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_assisted_output_equals_target_greedy(pairs, arch, policy, invariant_log):
    target, draft = pairs[arch]
    ids = make_prompt(PROMPT, seed=3)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config=policy_settings(policy, SMALL),
    )
    assert torch.equal(out, reference)
    stats = rift_hf.last_stats(target)
    assert sum(r["accepted"] + 1 for r in stats.rounds) == NEW
    assert isinstance(target.generation_config.cache_implementation, type(None))
    assert invariant_log, "the drafter cache was never written"
    # Rounds where the target decoded alone (the cost-aware draft length) leave their tokens to the drafter's next
    # round, which feeds them in one forward before committing: they are in flight on top of the budget too.
    idle = run = 0
    for r in stats.rounds:
        run = run + 1 if r["drafted"] == 0 else 0
        idle = max(idle, run)
    for stored, budget, seq_length, written in invariant_log:
        if seq_length > PROMPT:  # the prefill forward holds the prompt until it is scored
            assert stored <= budget + GAMMA + 1 + idle
        assert seq_length == written
    if policy != "full":
        assert max(s for s, _, n, _ in invariant_log if n > PROMPT) < PROMPT  # compression really happened
    if RiftConfig(policy=policy).keeps_store:
        assert stats.rescorings, "no rescoring happened"


@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_pairs_have_both_accepted_and_rejected_drafts(pairs, arch):
    target, draft = pairs[arch]
    target.generate(
        make_prompt(PROMPT, seed=3),
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config={"policy": "full", "draft_length": "fixed"},
    )
    accepted = [r["accepted"] for r in rift_hf.last_stats(target).rounds]
    assert any(0 < a for a in accepted) and any(a < GAMMA for a in accepted), accepted


def _drafter_logits(model, ids, cache, steps):
    """Prefill `ids`, then feed greedy tokens one by one; returns the logits of every step."""
    out = model(ids, past_key_values=cache, use_cache=True)
    logits = [out.logits[:, -1]]
    for _ in range(steps):
        token = logits[-1].argmax(-1, keepdim=True)
        out = model(token, past_key_values=cache, use_cache=True)
        logits.append(out.logits[:, -1])
    return torch.stack(logits)


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt_oss", "qwen3_5", "lfm2"])
def test_budget_covering_the_context_matches_full_cache(arch, policy):
    reference_model = tiny_model(arch, seed=4)
    rift_model = tiny_model(arch, seed=4, attn="rift")
    ids = make_prompt(24, seed=5)
    with torch.no_grad():
        expected = _drafter_logits(reference_model, ids, DynamicCache(config=reference_model.config), 8)
        cache = RiftCache(rift_model.config, policy_settings(policy, {**SMALL, "budget": 64}))
        got = _drafter_logits(rift_model, ids, cache, 8)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", [*STATEFUL_ARCHITECTURES, "lfm2"])
def test_stateful_drafter_state_after_rejection_equals_fresh_recompute(arch):
    model = tiny_model(arch, seed=6)
    ids = make_prompt(30, seed=7)
    drafts = make_prompt(4, seed=8)
    # A budget covering the context, so the fresh full-cache recompute is the exact reference for the states.
    cache = RiftCache(model.config, policy_settings("rift-dyn", {"window": 4, "delta": 2, "budget": 64}))
    rift_model = model
    rift_model.set_attn_implementation("rift")
    cache.activate_past_recording()
    with torch.no_grad():
        rift_model(ids[:, :-1], past_key_values=cache, use_cache=True)
        cache.crop(0)
        rift_model(ids[:, -1:], past_key_values=cache, use_cache=True)  # the round's verified token
        for i in range(3):  # drafted tokens, fed one by one
            rift_model(drafts[:, i : i + 1], past_key_values=cache, use_cache=True)
        # The target accepted one draft and corrected the next: the sequence is ids + drafts[0] + bonus.
        sequence = torch.cat([ids, drafts[:, :1], torch.tensor([[5]])], dim=1)
        cache.crop(-(cache.get_seq_length() - (sequence.shape[1] - 2)))
        rest = sequence[:, cache.get_seq_length() :]
        got = rift_model(rest, past_key_values=cache, use_cache=True).logits[:, -1]
        fresh = DynamicCache(config=model.config)
        want = model(sequence, past_key_values=fresh, use_cache=True).logits[:, -1]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    for ours, theirs in zip(cache.layers, fresh.layers, strict=True):
        if hasattr(theirs, "recurrent_states"):
            for i, state in theirs.recurrent_states.items():
                if state is not None:
                    torch.testing.assert_close(ours.recurrent_states[i], state, atol=1e-4, rtol=1e-4)
            for i, conv in theirs.conv_states.items():
                if conv is not None:
                    width = conv.shape[-1]
                    torch.testing.assert_close(ours.conv_states[i][..., -width:], conv, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("policy", ["swa", "rift-stat", "rift-dyn"])
def test_plain_generate_compresses_own_cache_given_a_rift_cache(policy):
    # Lossy, so only on purpose: a RiftCache passed as the model's own cache (cache_implementation="rift" without a
    # drafter is refused: tests/test_robustness.py).
    model = tiny_model("llama", seed=9)
    ids = make_prompt(40, seed=1)
    config = RiftConfig(**policy_settings(policy, SMALL))
    rift_hf.attention.use_rift_attention(model, config)
    out = model.generate(
        ids,
        max_new_tokens=12,
        do_sample=False,
        past_key_values=RiftCache(model.config, config),
        return_dict_in_generate=True,
    )
    cache = out.past_key_values
    assert isinstance(cache, RiftCache)
    assert cache.get_seq_length() == 40 + 11
    assert all(n <= 16 + 1 for n in cache.stored_tokens())
    assert out.sequences.shape[1] == 52


def test_a_rift_cache_instance_can_be_passed_directly():
    model = tiny_model("llama", seed=9)
    ids = make_prompt(30, seed=1)
    reference = model.generate(ids, max_new_tokens=6, do_sample=False)
    cache = RiftCache(model.config, {"policy": "full"})
    assert torch.equal(model.generate(ids, max_new_tokens=6, do_sample=False, past_key_values=cache), reference)


@pytest.fixture(scope="module")
def llama_pair():
    return draft_target_pair("llama", GAMMA)


def test_unknown_policy_lists_the_valid_ones(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="choose one of full, swa, snapkv"):
        target.generate(
            make_prompt(20),
            assistant_model=draft,
            max_new_tokens=4,
            cache_implementation="rift",
            cache_config={"policy": "h2o"},
        )


def test_a_fractional_budget_below_the_window_shrinks_the_window(llama_pair):
    # The robustness issue changed this: a short prompt's fractional budget fits the window to itself (4 tokens here)
    # instead of failing at the drafter's prefill; an int budget below the window is still refused at construction.
    target, draft = llama_pair
    ids = make_prompt(40)
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=4,
        do_sample=False,
        cache_implementation="rift",
        cache_config=policy_settings("rift-stat", {"budget": 0.1, "window": 8, "step_aside": False}),
    )
    assert torch.equal(out, target.generate(ids, max_new_tokens=4, do_sample=False))
    assert rift_hf.last_stats(target).budget == 4
    with pytest.raises(ValueError, match="raise `budget` or lower `window`"):
        rift_hf.RiftConfig(policy="rift-stat", budget=4, window=8)


def test_batch_size_above_one_is_refused(llama_pair):
    target, draft = llama_pair
    ids = torch.cat([make_prompt(20), make_prompt(20, seed=1)])
    with pytest.raises(ValueError, match="call generate once per prompt"):
        target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=4,
            cache_implementation="rift",
            cache_config={"policy": "swa", "budget": 8},
        )
    with pytest.raises(ValueError, match="call generate once per prompt"):
        target.generate(ids, max_new_tokens=4, cache_implementation="rift", cache_config={"policy": "swa", "budget": 8})


def test_vocabulary_mismatch_names_the_tokenizer_arguments():
    target = tiny_target()
    draft = tiny_model("llama", seed=2, vocab_size=80)
    with pytest.raises(ValueError, match="tokenizer.*assistant_tokenizer"):
        target.generate(
            make_prompt(20),
            assistant_model=draft,
            max_new_tokens=4,
            cache_implementation="rift",
            cache_config={"policy": "swa", "budget": 8},
        )


def test_static_cache_with_rift_is_refused(llama_pair):
    target, _ = llama_pair
    static = StaticCache(config=target.config, max_cache_len=64)
    with pytest.raises(ValueError, match="StaticCache cannot be combined"):
        target.generate(
            make_prompt(20),
            max_new_tokens=4,
            cache_implementation="rift",
            past_key_values=static,
            cache_config={"policy": "swa", "budget": 8},
        )


def test_cache_config_without_rift_is_refused(llama_pair):
    target, draft = llama_pair
    with pytest.raises(ValueError, match="cache_implementation='rift'"):
        target.generate(
            make_prompt(20), assistant_model=draft, max_new_tokens=4, cache_config={"policy": "swa", "budget": 8}
        )


def test_unsupported_layer_type_is_named():
    model = tiny_model("llama")
    model.config.layer_types = ["hybrid", "full_attention"]
    with pytest.raises(ValueError, match="does not support layer type 'hybrid'"):
        RiftCache(model.config, {"policy": "swa", "budget": 8})


def test_plain_transformers_is_untouched(llama_pair):
    target, draft = llama_pair
    ids = make_prompt(30)
    reference = target.generate(ids, max_new_tokens=8, do_sample=False)
    out = target.generate(ids, assistant_model=draft, max_new_tokens=8, do_sample=False, return_dict_in_generate=True)
    assert torch.equal(out.sequences, reference)
    assert type(out.past_key_values) is DynamicCache


def test_attention_mass_share_is_one_without_eviction_and_below_one_with_it():
    model = tiny_model("llama", seed=9)
    ids = make_prompt(40, seed=2)
    shares = {}
    for budget in (64, 12):
        config = RiftConfig(policy="swa", budget=budget, track_attention_mass=True)
        rift_hf.attention.use_rift_attention(model, config)
        out = model.generate(
            ids,
            max_new_tokens=6,
            do_sample=False,
            return_dict_in_generate=True,
            past_key_values=RiftCache(model.config, config),
        )
        log = out.past_key_values.attention_mass_log()
        assert [pos for pos, _ in log] == list(range(40, 45))
        shares[budget] = [share for _, share in log]
    assert all(abs(s - 1.0) < 1e-5 for s in shares[64])
    assert all(0.0 < s < 1.0 for s in shares[12])


def test_target_offloaded_by_accelerate_stays_lossless(tmp_path):
    from transformers import AutoModelForCausalLM

    target, draft = draft_target_pair("llama", GAMMA)
    ids = make_prompt(PROMPT, seed=3)
    reference = target.generate(ids, max_new_tokens=20, do_sample=False)
    target.save_pretrained(tmp_path / "target")
    # A memory cap that forces accelerate to offload the decoder layers and the head to disk.
    big = AutoModelForCausalLM.from_pretrained(
        tmp_path / "target",
        device_map="auto",
        max_memory={"cpu": "150KB"},
        offload_folder=str(tmp_path / "offload"),
        dtype=torch.float32,
    )
    assert "disk" in set(big.hf_device_map.values())
    out = big.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=20,
        do_sample=False,
        cache_implementation="rift",
        cache_config=policy_settings("rift-dyn", {"budget": 16, "window": 4, "delta": 4, "store_device": "cpu"}),
    )
    assert torch.equal(out, reference)


@pytest.mark.parametrize("policy", ["swa", "rift-dyn", "page-retrieval"])
def test_attention_mass_log_equals_one_query_at_a_time(monkeypatch, policy):
    # The batched measurement against the definition, query by query: softmax over the full store up to the query's
    # own position, summed over what it attends (the working set, or its retrieved rows).
    from rift_hf.cache import RiftLayer

    def reference(layer, query):
        store, first, out = layer.store_keys.float(), layer.seen - query.shape[2], []
        h_kv = store.shape[1]
        for i in range(query.shape[2]):
            pos = first + i
            qi = query[:, :, i].float().view(query.shape[0], h_kv, -1, query.shape[-1])
            probs = torch.softmax(torch.einsum("bhgd,bhtd->bhgt", qi, store[:, :, : pos + 1]) * layer.scale, -1)
            visible = layer.retrieved[0, :, i] if layer.retrieving else layer.positions
            kept = torch.zeros(h_kv, pos + 1)
            for h in range(h_kv):
                kept[h, visible[h][visible[h] <= pos]] = 1.0
            out.append((pos, (probs * kept[None, :, None]).sum(-1).mean().item()))
        return out

    original, checked = RiftLayer._log_attention_mass, []

    def both(layer, query):
        expected = reference(layer, query)
        before = len(layer.mass_log)
        original(layer, query)
        got = layer.mass_log[before:]
        assert [p for p, _ in got] == [p for p, _ in expected]
        assert max(abs(a - b) for (_, a), (_, b) in zip(got, expected, strict=True)) < 1e-5
        checked.append((len(got), layer.retrieving))

    monkeypatch.setattr(RiftLayer, "_log_attention_mass", both)
    target, draft = draft_target_pair("llama", GAMMA)
    ids = make_prompt(PROMPT, seed=4)
    config = policy_settings(
        policy, {"budget": 16, "window": 4, "delta": 4, "block_size": 4, "track_attention_mass": True}
    )
    config["draft_length"] = "fixed"  # every round drafts, so chunks of several queries are measured
    target.generate(ids, assistant_model=draft, max_new_tokens=16, do_sample=False, cache_implementation="rift",
                    cache_config=config)  # fmt: skip
    assert max(n for n, _ in checked) > 1  # chunks of several queries were measured
    assert any(r for _, r in checked) == (policy == "page-retrieval")  # and retrieved rows where a policy retrieves


@pytest.mark.parametrize("policy", ["rift-stat", "rift-dyn", "page-ahead"])
def test_tokens_ahead_stays_lossless_and_changes_the_selection(pairs, policy):
    target, draft = pairs["llama"]
    ids = make_prompt(PROMPT, seed=3)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    rounds = {}
    for ahead in (0, 8):
        out = target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=NEW,
            do_sample=False,
            cache_implementation="rift",
            cache_config=policy_settings(policy, {**SMALL, "tokens_ahead": ahead}),
        )
        assert torch.equal(out, reference)
        rounds[ahead] = [r["accepted"] for r in rift_hf.last_stats(target).rounds]
    assert rounds[8] != rounds[0]  # the carried scores chose other tokens


@pytest.mark.parametrize("long_prompt, chosen", [(10_000, "page-round"), (30, "rift-dyn")])
def test_auto_chooses_by_prompt_length_and_stays_lossless(monkeypatch, long_prompt, chosen):
    from rift_hf.policies import auto

    monkeypatch.setattr(auto, "LONG_PROMPT", long_prompt)  # a tiny prompt stands in for a long one
    target, draft = draft_target_pair("llama", gamma=4)
    ids = make_prompt(48, seed=3)
    gen = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False}
    config = {"budget": 16, "window": 4, "draft_length": "fixed"}
    out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **gen)
    assert torch.equal(out, target.generate(ids, **gen))
    stats = rift_hf.last_stats(target)
    assert stats.policy == chosen and stats.budget == 16
    # rift-dyn refreshes every `delta` (128) committed tokens, page-round at every round
    if chosen == "rift-dyn":
        assert len(stats.rescorings) == 0
    else:
        assert len(stats.rescorings) >= len(stats.rounds) // 2
