"""The "sdpa_gqa" backend (`rift_hf.speedups.gqa_attention`): several queries over a mask attend the key/value heads in
place on a CPU; results equal transformers' "sdpa", greedy output unchanged, reversible, bad input refused."""

import pytest
import torch
from transformers import DynamicCache
from transformers.integrations import sdpa_attention

import rift_hf
from rift_hf.speedups import GQA_ATTENTION, gqa_attention
from tiny import draft_target_pair, make_prompt, tiny_model


def _verify_logits(model, prompt, extra):
    """Logits of `extra` tokens fed over a cache holding `prompt` (a verification: several queries, with a mask)."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, past_key_values=cache, use_cache=True)
        ids = torch.cat([prompt, extra], dim=1)
        mask = torch.ones_like(ids)
        return model(extra, attention_mask=mask, past_key_values=cache, use_cache=True).logits


@pytest.mark.parametrize("arch", ["qwen2", "gemma3", "llama"])
def test_masked_queries_match_sdpa_without_copying_heads(arch, monkeypatch):
    model = tiny_model(arch, attn="sdpa")
    prompt, extra = make_prompt(40, seed=1), make_prompt(5, seed=2)
    expected = _verify_logits(model, prompt, extra)
    assert gqa_attention(model) == GQA_ATTENTION
    copies = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda *a: copies.append(1) or real(*a))
    got = _verify_logits(model, prompt, extra)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert copies == []  # the 2 key/value heads were attended in place by 4 query heads
    assert gqa_attention(model, enabled=False) == "sdpa"
    copies.clear()
    _verify_logits(model, prompt, extra)
    assert copies  # transformers' own path copies them (what the backend avoids)


def test_greedy_assisted_output_is_the_targets_own():
    target, draft = draft_target_pair("qwen2")
    prompt = make_prompt(48, seed=3)
    with torch.no_grad():
        expected = target.generate(prompt, max_new_tokens=12, do_sample=False)
        for model in (target, draft):
            gqa_attention(model)
        plain = target.generate(prompt, max_new_tokens=12, do_sample=False)
        assisted = target.generate(
            prompt,
            assistant_model=draft,
            max_new_tokens=12,
            do_sample=False,
            cache_implementation="rift",
            cache_config={"policy": "page-round", "budget": 16, "window": 8},
        )
    assert torch.equal(plain, expected) and torch.equal(assisted, expected)


def test_other_backends_are_left_alone_and_bad_input_refused():
    model = tiny_model("qwen2", attn="eager")
    assert gqa_attention(model) == "eager"
    with pytest.raises(TypeError, match="loaded transformers model"):
        gqa_attention("Qwen/Qwen2.5-0.5B")
    assert rift_hf.gqa_attention is gqa_attention
