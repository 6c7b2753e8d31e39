"""Compiled drafting (`compile=True`): one graph, no graph breaks, no recompiles, the target's greedy output."""

import pytest
import torch

import rift_hf
from rift_hf import RiftConfig
from rift_hf.config import policy_settings
from rift_hf.generation.compiled import CompiledDrafting
from tiny import draft_target_pair, make_prompt

COMPILABLE = [p for p in rift_hf.POLICIES if p not in ("full", "page-retrieval")]  # the others refuse (test_refusals)
SETTINGS = {"budget": 32, "window": 4, "block_size": 4, "delta": 8, "a_min": 4, "a_max": 16, "check_interval": 2}
GEN = {"max_new_tokens": 40, "min_new_tokens": 40, "do_sample": False}


def _run(target, draft, ids, policy, compile):
    policy, _, rechoose = policy.partition("@rechoose_after=")  # page-round swapping its selection inside a round
    config = {**policy_settings(policy, SETTINGS), "draft_length": "fixed", "compile": compile}
    if rechoose:
        config["rechoose_after"] = int(rechoose)
    out = target.generate(ids, assistant_model=draft, cache_implementation="rift", cache_config=config, **GEN)
    return out, rift_hf.last_stats(target)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_compiled_drafting_drafts_what_eager_drafting_drafts(arch):
    target, draft = draft_target_pair(arch, gamma=6)
    ids = make_prompt(120, seed=3)
    reference = target.generate(ids, **GEN)
    compiles = 0
    for policy in [*COMPILABLE, "page-round@rechoose_after=2"] if arch == "llama" else ["page-round"]:
        eager, eager_stats = _run(target, draft, ids, policy, compile=False)
        out, stats = _run(target, draft, ids, policy, compile=True)
        assert torch.equal(out, reference) and torch.equal(eager, reference), policy
        # The drafter drafted the same tokens: the same acceptance in every round.
        assert [r["accepted"] for r in stats.rounds] == [r["accepted"] for r in eager_stats.rounds], policy
        assert stats.compiled_steps > 2 * len(stats.rounds), policy  # every round after the first compression
        assert stats.eager_steps <= 6, policy  # the drafting steps before the prompt was first compressed
        assert stats.compiles <= 1, policy
        if "rechoose" in policy:
            assert any(event["reason"] == "in-round" for event in stats.rescorings)
        compiles += stats.compiles
    # The working sets share a shape: one graph on sdpa (swa), one on the rift backend without recording the queries
    # (snapkv, rift-stat ...), one recording them (the store policies).
    assert 1 <= compiles <= (3 if arch == "llama" else 1)


def test_a_second_call_replays_the_graph_and_restores_the_forward():
    target, draft = draft_target_pair("llama", gamma=6)
    forward = draft.forward
    for seed in (4, 5):
        out, stats = _run(target, draft, make_prompt(100, seed=seed), "page-round", compile=True)
        assert torch.equal(out, target.generate(make_prompt(100, seed=seed), **GEN))
    assert stats.compiles == 0 and stats.compiled_steps > 0
    assert "forward" not in draft.__dict__ and draft.forward == forward


@pytest.mark.parametrize(
    "fields, says",
    [
        ({"policy": "full"}, "keeps every token"),
        ({"policy": "page-retrieval"}, "retrieved per query"),
        ({"policy": "snapkv", "snapkv_grow": True}, "snapkv_grow"),
        ({"policy": "rift-stat", "kv_dtype": "int8"}, "kv_dtype"),
        ({"policy": "rift-dyn", "attend_in_place": True}, "attend_in_place"),
        ({"policy": "rift-dyn", "track_attention_mass": True}, "track_attention_mass"),
    ],
)
def test_refusals(fields, says):
    with pytest.raises(ValueError, match=says):
        RiftConfig(compile=True, **fields)
    with pytest.raises(TypeError, match="compile"):
        RiftConfig(compile="yes")


@pytest.mark.parametrize("arch", ["gemma3", "qwen3_next"])
def test_drafters_with_other_layers_are_refused(arch):
    target, draft = draft_target_pair(arch)
    config = {"policy": "page-round", "budget": 32, "window": 4, "block_size": 4, "compile": True}
    with pytest.raises(ValueError, match="every layer is full attention"):
        target.generate(make_prompt(60), assistant_model=draft, cache_implementation="rift", cache_config=config)


def test_flash_style_backends_are_refused():
    from rift_hf import RiftCache

    _, draft = draft_target_pair("llama")
    draft.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='sdpa'"):
        CompiledDrafting(draft, RiftCache(draft.config, "page-round"))


def test_one_graph_serves_another_drafter_of_the_same_shapes():
    """The drafter's parameters are inputs of the graph: a drafter with other weights replays it, step for step equal
    to its own eager forward."""
    from rift_hf import RiftCache
    from tiny import tiny_model

    ids = make_prompt(120, seed=3)
    for seed, compiles in ((2, None), (9, 0)):
        model = tiny_model("llama", seed=seed)
        model.set_attn_implementation("rift")
        caches = [RiftCache(model.config, {"policy": "rift-stat", "budget": 32, "window": 4}) for _ in range(2)]
        with torch.no_grad():
            tokens = [model(ids, past_key_values=c, use_cache=True).logits[:, -1:].argmax(-1) for c in caches]
            with CompiledDrafting(model, caches[1]) as drafting:
                for i in range(6):
                    position = torch.tensor([[ids.shape[1] + i]])
                    eager, compiled = (
                        model(input_ids=t, position_ids=position, past_key_values=c, use_cache=True).logits
                        for t, c in zip(tokens, caches, strict=True)
                    )
                    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-5)
                    tokens = [eager.argmax(-1), compiled.argmax(-1)]
        assert drafting.steps == 6 and drafting.eager == 0
        assert compiles is None or drafting.compiles == compiles
        assert [c.rift_layers[0].seen for c in caches] == [ids.shape[1] + 6] * 2
