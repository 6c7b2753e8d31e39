"""Tiny random models built from transformers configs, for every drafter architecture rift-hf claims."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 96

_COMMON = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=96,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)

CONFIGS = {
    "llama": dict(model_type="llama", num_hidden_layers=2, **_COMMON),
    "qwen2": dict(model_type="qwen2", num_hidden_layers=2, **_COMMON),
    "gemma3": dict(
        model_type="gemma3_text",
        num_hidden_layers=3,
        sliding_window=8,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        **_COMMON,
    ),
    "gpt_oss": dict(
        model_type="gpt_oss",
        num_hidden_layers=2,
        sliding_window=8,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["sliding_attention", "full_attention"],
        **_COMMON,
    ),
    "qwen3_next": dict(
        model_type="qwen3_next",
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        num_experts=2,
        num_experts_per_tok=1,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
        **_COMMON,
    ),
    "qwen3_5": dict(
        model_type="qwen3_5_text",
        num_hidden_layers=2,
        layer_types=["linear_attention", "full_attention"],
        linear_num_key_heads=2,
        linear_num_value_heads=2,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        **_COMMON,
    ),
    "nemotron_h": dict(
        model_type="nemotron_h",
        num_hidden_layers=3,
        layers_block_type=["mamba", "attention", "mlp"],
        mamba_num_heads=4,
        mamba_head_dim=16,
        ssm_state_size=16,
        n_groups=1,
        conv_kernel=4,
        mamba_chunk_size=16,
        **_COMMON,
    ),
    "jamba": dict(
        model_type="jamba",
        num_hidden_layers=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
        use_mamba_kernels=False,
        **{k: v for k, v in _COMMON.items() if k != "head_dim"},
    ),
    "lfm2": dict(
        model_type="lfm2",
        num_hidden_layers=2,
        full_attn_idxs=[1],
        conv_L_cache=3,
        **{k: v for k, v in _COMMON.items() if k != "head_dim"},
    ),
}

# Drafter architectures claimed by the core issue; Jamba is exercised as a stateful target.
ARCHITECTURES = [arch for arch in CONFIGS if arch != "jamba"]
STATEFUL_TARGETS = ("qwen3_next", "qwen3_5", "nemotron_h", "jamba")


# Small cache settings every policy accepts on the tiny models, with fixed draft lengths: the tests that use them
# check the cache while it drafts every round, and compare rounds between runs (tiny models draft at a loss, so the
# cost-aware length would let the target decode alone; tests/test_draft_length.py covers it).
SMALL = {
    "draft_length": "fixed",
    "budget": 16,
    "window": 4,
    "delta": 4,
    "n_sink": 1,
    "block_size": 4,
    "a_min": 4,
    "a_max": 12,
    "check_interval": 2,
    "drift_threshold": 0.01,
}


def after_updates(monkeypatch, record) -> None:
    """Call `record(cache, layer_idx)` after every `RiftCache.update` (undone with `monkeypatch`)."""
    from rift_hf import RiftCache

    original = RiftCache.update

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        out = original(self, key_states, value_states, layer_idx, *args, **kwargs)
        record(self, layer_idx)
        return out

    monkeypatch.setattr(RiftCache, "update", update)


def tiny_model(arch: str, seed: int = 0, dtype=torch.float32, attn: str | None = None, **overrides):
    """A random tiny causal LM of architecture `arch` (deterministic for a seed)."""
    fields = {**CONFIGS[arch], **overrides}
    model_type = fields.pop("model_type")
    config = AutoConfig.for_model(model_type, **fields)
    torch.manual_seed(seed)
    kwargs = {"attn_implementation": attn} if attn else {}
    model = AutoModelForCausalLM.from_config(config, dtype=dtype, **kwargs)
    model.eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None
    return model


def tiny_target(seed: int = 1, **overrides):
    """A 3-layer Llama target sharing the tiny vocabulary."""
    return tiny_model("llama", seed=seed, num_hidden_layers=3, **overrides)


def pin_drafting(draft, gamma: int = 4) -> None:
    """Fixed draft length, constant schedule and no confidence stop, so rounds are comparable."""
    draft.generation_config.num_assistant_tokens = gamma
    draft.generation_config.num_assistant_tokens_schedule = "constant"
    draft.generation_config.assistant_confidence_threshold = 0.0


def make_prompt(length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (1, length), generator=g)


def couple(target, draft, strength: float = 6.0) -> None:
    """
    Make `draft` agree with `target` most of the time: share embeddings and LM head, and scale the embeddings so the
    current token dominates the prediction. Context (attention, recurrent states) still tips some predictions, so
    drafts are partly right and partly rejected.
    """
    with torch.no_grad():
        t_emb, d_emb = target.get_input_embeddings(), draft.get_input_embeddings()
        t_emb.weight.mul_(strength)
        if t_emb.weight.shape == d_emb.weight.shape:
            d_emb.weight.copy_(t_emb.weight)
        t_head, d_head = target.get_output_embeddings(), draft.get_output_embeddings()
        if t_head.weight.shape == d_head.weight.shape:
            d_head.weight.copy_(t_head.weight)


STATEFUL_ARCHITECTURES = ("qwen3_next", "qwen3_5", "nemotron_h")


def perturbed_copy(model, noise: float, seed: int = 7):
    """A copy of `model` with Gaussian noise on every weight: a target the drafter partly agrees with."""
    import copy

    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=p.dtype) * noise * (p.std() if p.numel() > 1 else 1.0))
    return other


def draft_target_pair(arch: str, gamma: int = 4):
    """
    (target, drafter) whose drafts are partly accepted and partly rejected. Stateful drafters draft for a tiny Llama
    (transformers refuses stateful targets); the others for a perturbed copy of themselves (self-speculation).
    """
    draft = tiny_model(arch, seed=2)
    pin_drafting(draft, gamma)
    if arch in STATEFUL_ARCHITECTURES or arch == "lfm2":
        target = tiny_target()
        couple(target, draft, 2.5)
    else:
        target = perturbed_copy(draft, 0.15)
        pin_drafting(target, gamma)
    return target, draft


def attended_rows(layer) -> int | None:
    """Rows a query of this compressed layer reads: its stored entries, or for a retrieval layer (which keeps every
    token) the rows the last query retrieved (None before its first retrieval)."""
    if layer.retrieving:
        return None if layer.retrieved is None else layer.attended_positions.shape[-1]
    return layer.stored


def squeeze(markdown: str) -> str:
    """A markdown table as tabulate pads it, with runs of spaces and dashes collapsed, for comparing rows in tests."""
    import re

    return re.sub(r"-{3,}", "---", re.sub(r" {2,}", " ", markdown))
