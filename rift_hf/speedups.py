"""Opt-in speed switches for the forwards speculation makes on a CPU: weight-major small-batch linear layers, and
grouped-query attention over a mask without copied heads.

Speculative decoding runs linear layers on a few rows at a time: the drafter's first forward of a round feeds one or
two tokens, the target verifies gamma + 1. On the CPU we measured (x86_64 AVX2 AMD EPYC, torch 2.13's MKL, fp32)
`torch.nn.functional.linear` on 2-4 rows costs about one full read of the weights *per row*, while the same product
written as `weight @ x.T` reads them about once: with torch's path a 2-token drafter forward took 1.9x a 1-token one
and the target's 12-token verification forward 3.7x its decode step; weight-major made them 1.23x and 1.50x faster
(`python -m benchmarks.linear`, `benchmarks/results/linear-cpu.json`, 2026-12-02); end to end, over 32 and 128 new
tokens, no gain showed that the machine's run-to-run spread could resolve. `weight_major_linear(model)`
switches a model's `nn.Linear` layers to that form for inputs of at most `max_rows` rows on a CPU; other inputs (more
rows, another device, a dtype that differs from the weight's) take torch's own path. The result is the same product
summed in another order: the real pair's logits moved by up to 1e-4 there, with the same argmax. Measure before
relying on it elsewhere: other CPUs and BLAS builds may not share the slow path.

Grouped-query attention over a mask, on a CPU (`gqa_attention`). transformers' "sdpa" backend passes
`enable_gqa=True` to torch only when there is no mask, because CUDA's fused kernels take no mask with it; otherwise it
copies every key/value head once per query head (`repeat_kv`). Verification always has a mask (k + 1 queries over the
cache), so on a CPU every verification copied the whole cache several times: over a 32K-token prompt a verification of
2-12 tokens by Qwen2.5-Coder-1.5B (2 key/value heads, 12 query heads) cost 4.2-4.3x a one-token step (fp32, 2 threads;
`python -m benchmarks.verify_cost`, `benchmarks/results/verify-cost-qwen-coder-32001in.json`). torch's CPU kernel takes
a mask and `enable_gqa` together: the "sdpa_gqa" backend does exactly that on CPU tensors (there: 1.2-1.5x a step, the
same logits bit for bit) and is transformers' "sdpa" everywhere else.
"""

from __future__ import annotations

import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

GQA_ATTENTION = "sdpa_gqa"


class WeightMajorLinear(torch.nn.Linear):
    """`nn.Linear` whose CPU forward on at most `max_rows` rows is `(weight @ x.T).T + bias` (same parameters)."""

    max_rows = 16

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        features = input.shape[-1] if input.dim() else 0
        rows = input.numel() // features if features else 0
        if (
            rows == 0
            or rows > self.max_rows
            or input.device.type != "cpu"
            or self.weight.device.type != "cpu"
            or input.dtype != self.weight.dtype
        ):
            return super().forward(input)
        out = torch.mm(self.weight, input.reshape(rows, features).t()).t()
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*input.shape[:-1], self.out_features)


def weight_major_linear(model: torch.nn.Module, enabled: bool = True, max_rows: int = 16) -> int:
    """
    Switch every plain `nn.Linear` of `model` to `WeightMajorLinear` (or back, `enabled=False`); returns how many
    layers changed. Subclasses of `nn.Linear` (quantised or adapter layers) keep their own forward; parameters,
    `state_dict` and `save_pretrained` are unchanged.

    Args:
        max_rows: the largest input (rows = every dimension but the last) computed weight-major; larger inputs (a
            prompt's prefill) take torch's path, which is faster there.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"weight_major_linear takes a torch.nn.Module (a loaded model), not {type(model).__name__}.")
    if isinstance(max_rows, bool) or not isinstance(max_rows, int) or max_rows < 1:
        raise ValueError(f"max_rows must be a positive int (rows computed weight-major), got {max_rows!r}.")
    changed = 0
    for module in model.modules():
        if enabled and type(module) in (torch.nn.Linear, WeightMajorLinear):
            changed += type(module) is torch.nn.Linear
            module.__class__ = WeightMajorLinear
            module.max_rows = max_rows
        elif not enabled and type(module) is WeightMajorLinear:
            module.__class__ = torch.nn.Linear
            vars(module).pop("max_rows", None)
            changed += 1
    return changed


def gqa_sdpa_forward(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' `sdpa_attention_forward`, except that on a CPU several queries over a mask attend the key/value
    heads in place (`enable_gqa=True`) instead of copies of them."""
    groups = getattr(module, "num_key_value_groups", 1)
    if (
        query.device.type != "cpu"
        or groups == 1
        or query.shape[2] == 1  # transformers folds a single query's heads onto the key/value heads itself
        or attention_mask is None
        or key.shape[-1] != value.shape[-1]
        or any(kwargs.get(name) is not None for name in ("softcap", "position_bias", "cache", "s_aux"))
        or kwargs.get("output_attentions")
    ):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask[..., : key.shape[-2]],
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=True,
    )
    return out.transpose(1, 2).contiguous(), None


def gqa_attention(model: torch.nn.Module, enabled: bool = True) -> str:
    """
    Switch `model` from the "sdpa" attention backend to "sdpa_gqa" (or back, `enabled=False`): on a CPU, several
    queries over a mask (a verification, a drafter's first forward of a round) no longer copy the key/value heads.
    Other attention backends are left as they are. Returns the backend the model uses afterwards.
    """
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "set_attn_implementation"):
        raise TypeError(f"gqa_attention takes a loaded transformers model, not {type(model).__name__}.")
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(GQA_ATTENTION, gqa_sdpa_forward)
    AttentionMaskInterface.register(GQA_ATTENTION, sdpa_mask)
    current = model.config._attn_implementation
    if enabled and current == "sdpa":
        model.set_attn_implementation(GQA_ATTENTION)
    elif not enabled and current == GQA_ATTENTION:
        model.set_attn_implementation("sdpa")
    return model.config._attn_implementation
