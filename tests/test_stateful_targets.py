"""Stateful targets (Qwen3.5, Qwen3-Next, Nemotron-H, Jamba): lossless assisted generation through rift."""

import pytest
import torch
from transformers import DynamicCache

import rift_hf
from rift_hf import RiftCache
from rift_hf.cache import RiftStateLayer
from rift_hf.config import policy_settings
from rift_hf.generation.stateful import VerifierCache
from tiny import STATEFUL_TARGETS, make_prompt, perturbed_copy, pin_drafting, tiny_model

CONFIG = {"budget": 16, "window": 4, "delta": 4, "draft_length": "fixed"}  # rounds are compared


def _pair(arch, drafter):
    target = tiny_model(arch, seed=1)
    if drafter == "self":  # a stateful drafter: a perturbed copy of the target
        draft = perturbed_copy(target, 0.1)
    else:  # a non-stateful drafter sharing the vocabulary
        draft = tiny_model("llama", seed=2)
        with torch.no_grad():
            draft.get_input_embeddings().weight.copy_(target.get_input_embeddings().weight * 3)
            target.get_input_embeddings().weight.mul_(3)
            draft.get_output_embeddings().weight.copy_(target.get_output_embeddings().weight)
    pin_drafting(draft, 4)
    return target, draft


CASES = [(arch, "self", policy) for arch in STATEFUL_TARGETS for policy in ("full", "swa", "rift-dyn")]
CASES += [(arch, "llama", "rift-dyn") for arch in STATEFUL_TARGETS]


@pytest.mark.parametrize("arch, drafter, policy", CASES)
def test_stateful_target_output_equals_its_greedy_output(arch, drafter, policy):
    target, draft = _pair(arch, drafter)
    ids = make_prompt(40, seed=3)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=24,
        do_sample=False,
        cache_implementation="rift",
        cache_config=policy_settings(policy, CONFIG),
    )
    assert torch.equal(out, reference)
    accepted = [r["accepted"] for r in rift_hf.last_stats(target).rounds]
    assert any(a < 4 for a in accepted[:-1]), f"no rejection happened: {accepted}"


@pytest.mark.parametrize("arch", STATEFUL_TARGETS)
def test_target_states_after_each_round_equal_a_fresh_recompute(arch, monkeypatch):
    target, draft = _pair(arch, "self")
    ids = make_prompt(30, seed=4)
    rounds = []
    original_crop = RiftCache.crop

    def crop(self, tokens_to_remove):
        original_crop(self, tokens_to_remove)
        if isinstance(self, VerifierCache):
            states = [
                (i, {k: v.clone() for k, v in layer.recurrent_states.items() if v is not None})
                for i, layer in enumerate(self.layers)
                if isinstance(layer, RiftStateLayer)
            ]
            rounds.append((self.get_seq_length(), states))

    monkeypatch.setattr(RiftCache, "crop", crop)
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=24,
        do_sample=False,
        cache_implementation="rift",
        cache_config=policy_settings("swa", CONFIG),
    )
    assert len(rounds) >= 3
    for length, states in rounds:
        fresh = DynamicCache(config=target.config)
        with torch.no_grad():
            target(out[:, :length], past_key_values=fresh, use_cache=True)
        for layer_idx, recurrent in states:
            for state_idx, state in recurrent.items():
                torch.testing.assert_close(
                    state, fresh.layers[layer_idx].recurrent_states[state_idx], atol=1e-3, rtol=1e-3
                )


def test_plain_assisted_generation_of_stateful_targets_is_untouched():
    """transformers 5.23 refuses a stateful target without rift (rift's wrappers are not installed behind its back);
    5.25 verifies such targets itself, by per-token states: then its output must be the target's greedy output."""
    target, draft = _pair("qwen3_next", "self")
    ids = make_prompt(20)
    if getattr(target, "_is_stateful", False):
        with pytest.raises(ValueError, match="not supported with stateful models"):
            target.generate(ids, assistant_model=draft, max_new_tokens=4)
    else:
        want = target.generate(ids, max_new_tokens=8, do_sample=False)
        got = target.generate(ids, assistant_model=draft, max_new_tokens=8, do_sample=False)
        assert torch.equal(got, want)
        assert not getattr(target, "_rift_verifier", False)


def test_batch_above_one_is_refused_for_stateful_targets():
    target, draft = _pair("qwen3_5", "self")
    ids = torch.cat([make_prompt(20), make_prompt(20, seed=1)])
    with pytest.raises(ValueError, match="call generate once per prompt"):
        target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=4,
            cache_implementation="rift",
            cache_config={"policy": "swa", "budget": 8},
        )


def test_plain_generation_of_a_wrapped_target_is_unchanged():
    target, draft = _pair("qwen3_next", "self")
    ids = make_prompt(30)
    before = target.generate(ids, max_new_tokens=8, do_sample=False)
    target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=8,
        do_sample=False,
        cache_implementation="rift",
        cache_config={"policy": "full"},
    )
    assert torch.equal(target.generate(ids, max_new_tokens=8, do_sample=False), before)
