"""The "rift" attention backend: attends like sdpa/eager, and hands queries to the compressed cache layer.

`Cache.update` never sees queries, but SnapKV scoring, rescoring and query drift need them. The backend runs right
after `update` in the same attention module, so it picks up the layer that was just updated (`ACTIVE_LAYER`) and
passes it the queries. Registered additively under the name "rift" in transformers' attention and mask registries.
"""

from __future__ import annotations

from contextvars import ContextVar

import torch
import torch.nn.functional as F
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from .cache import ACTIVE_LAYER
from .config import RiftConfig
from .kernels import indexed_attention, retrieved_attention

NAME = "rift"

# Training only: per-layer boolean masks `[B, H_kv, L_q, L_kv]` (True = attend) that replace the model's mask, so a
# full-sequence forward sees exactly what a compressed cache would keep (set by `rift_hf.training`).
LAYER_MASKS: ContextVar[dict[int, torch.Tensor] | None] = ContextVar("rift_layer_masks", default=None)
# Training only: when set to a dict, every layer's `(query, key, scale)` of a full-sequence forward is stored there by
# layer index (autograd intact), for losses on the attention itself (`rift_hf.training.selection`).
CAPTURED_QK: ContextVar[dict[int, tuple] | None] = ContextVar("rift_captured_qk", default=None)


def attend(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scale: float,
    sinks: torch.Tensor | None = None,
    softcap: float | None = None,
    dropout: float = 0.0,
) -> torch.Tensor:
    """
    Softmax attention with GQA, an optional bool/additive mask, GPT-OSS sinks and a logit soft-cap.

    Args:
        query: `[B, H_q, L, D]`; key, value: `[B, H_kv, S, D]`.
        attention_mask: `[B, 1, L, S]` bool (True = attend) or additive float, or `None`: causal (top-left) when
            `L > 1`, attend-all when `L == 1`.
    Returns:
        `[B, H_q, L, D]`.
    """
    length, span = query.shape[2], key.shape[2]
    if sinks is None and softcap is None:
        is_causal = attention_mask is None and length > 1
        return F.scaled_dot_product_attention(
            query,
            key,
            value,
            attn_mask=attention_mask,
            dropout_p=dropout,
            is_causal=is_causal,
            scale=scale,
            enable_gqa=query.shape[1] != key.shape[1],
        )
    group = query.shape[1] // key.shape[1]
    if group > 1:
        key = key.repeat_interleave(group, dim=1)
        value = value.repeat_interleave(group, dim=1)
    logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale  # [B, H_q, L, S]
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    min_value = torch.finfo(logits.dtype).min
    if attention_mask is None:
        if length > 1:
            causal = torch.ones(length, span, dtype=torch.bool, device=query.device).tril(span - length)
            logits = logits.masked_fill(~causal, min_value)
    elif attention_mask.dtype == torch.bool:
        logits = logits.masked_fill(~attention_mask, min_value)
    else:
        logits = logits + attention_mask.float()
    if sinks is not None:
        sink = sinks.float().view(1, -1, 1, 1).expand(logits.shape[0], -1, length, 1)
        logits = torch.cat([logits, sink], dim=-1)
        probs = torch.softmax(logits, dim=-1)[..., :-1]
    else:
        probs = torch.softmax(logits, dim=-1)
    probs = F.dropout(probs, p=dropout, training=dropout > 0)
    return torch.matmul(probs.to(value.dtype), value)


def rift_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """The `AttentionInterface` signature; returns `([B, L, H_q, D], None)`."""
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    sinks = kwargs.get("s_aux")
    if torch.compiler.is_compiling():
        # A compiled drafting step (`rift_hf.generation.compiled`): the cache is a fixed-size view and the mask comes
        # with it; the queries go back to the step in `rift_queries` when the policy records them.
        queries = kwargs.get("rift_queries")
        if queries is not None:
            queries[module.layer_idx] = query
        out = attend(query, key, value, attention_mask, scale, sinks, kwargs.get("softcap"), dropout)
        return out.transpose(1, 2).contiguous(), None
    layer = ACTIVE_LAYER.get()
    if layer is not None and key is layer.returned_keys:
        ACTIVE_LAYER.set(None)
        # A retrieval layer's `key`/`value` hold every token; each query attends the rows the policy retrieves for it.
        index = layer.retrieve(query, scale) if layer.retrieving else None
        layer.observe(query, key, scale, sinks)
        if index is not None:
            out = retrieved_attention(query, key, value, index, scale, sinks, kwargs.get("softcap"))
            return out.transpose(1, 2).contiguous(), None
        if layer.indexed:
            if kwargs.get("softcap") is not None:
                raise ValueError("Logit soft-capping is not supported by indexed attention; set RIFT_HF_KERNELS=torch.")
            # `key`/`value` are the whole store; attend the kept rows in place (batch 1, no padding to mask).
            index = layer.positions[None]  # [1, H_kv, K], ascending, the new tokens last
            out = indexed_attention(query, key, value, index, scale, sinks)
            return out.transpose(1, 2).contiguous(), None
    captured = CAPTURED_QK.get()
    if captured is not None:
        captured[module.layer_idx] = (query, key, scale)
    masks = LAYER_MASKS.get()
    if masks is not None and getattr(module, "layer_idx", None) in masks:
        allowed = masks[module.layer_idx]
        attention_mask = allowed.repeat_interleave(query.shape[1] // allowed.shape[1], dim=1)
    if attention_mask is not None and attention_mask.shape[-1] != key.shape[-2]:
        attention_mask = attention_mask[..., : key.shape[-2]]
    out = attend(query, key, value, attention_mask, scale, sinks, kwargs.get("softcap"), dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> None:
    """Register "rift" with transformers' attention and mask registries (idempotent, additive)."""
    AttentionInterface.register(NAME, rift_attention_forward)
    AttentionMaskInterface.register(NAME, sdpa_mask)


def use_rift_attention(model, config: RiftConfig) -> None:
    """Switch `model` to the "rift" attention backend when the policy needs the queries it sees."""
    if not (config.is_scored or config.track_attention_mass):
        return
    if model.config._attn_implementation == "rift":
        return
    try:
        model.set_attn_implementation("rift")
    except (ValueError, NotImplementedError) as err:
        raise ValueError(
            f"Policy {config.policy!r} needs the 'rift' attention backend, which {type(model).__name__} cannot use "
            f"({err}); choose 'swa' or 'full', or load the model with attn_implementation='rift'."
        ) from err
