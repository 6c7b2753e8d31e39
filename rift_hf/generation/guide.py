"""The target's attention at its last verification, as what the drafter should keep (page-round with `guide="target"`).

Every policy else chooses the drafter's pages from the drafter's own queries. The target reads the same tokens at the
same positions and, at each verification, attends over them with a far better model of what comes next
(SpecExtend's "cross-model retrieval"). `TargetGuide` captures that attention at no extra forward:

- during the target's verification forward only (between `RiftCandidateGenerator.get_candidates` and
  `update_candidate_strategy`) the target runs the backend `rift_guide_<its own>`, which calls its own backend
  unchanged and keeps, for a few of its full-attention layers, a reference to the queries and keys it was given;
- once the round's acceptance is known, `finish(drafted, accepted)` computes the attention of one query, the newest
  verified token's, over every position it sees: softmax per query head, averaged over heads and the chosen layers.
  That is one row of attention per chosen layer (at ~32K tokens and 12 query heads, ~50 MFLOP a layer);
- the drafter's cache gets it as `RiftCache.guide` (`[positions]`), and page-round (`guide="target"`) keeps the
  pages holding the most of it at its next commit.

The target's output is untouched (its own backend computes every forward), so greedy output stays the target's.
"""

from __future__ import annotations

import sys

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

PREFIX = "rift_guide_"
_CAPTURING: dict[int, TargetGuide] = {}  # id(attention module) -> the guide of the verification running now


def _original(name: str, module):
    if name == "eager":  # not registered: each model file defines its own
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[name]


def _backend(name: str):
    """The attention function of `rift_guide_<name>`: `name`'s own, plus a capture on the guided layers."""

    def forward(module, query, key, value, attention_mask, **kwargs):
        guide = _CAPTURING.get(id(module))
        if guide is not None:
            guide.captured[module.layer_idx] = (query, key, kwargs.get("scaling") or query.shape[-1] ** -0.5)
        return _original(name, module)(module, query, key, value, attention_mask, **kwargs)

    return forward


def guided_name(name: str) -> str:
    """Register (once) and return the guided twin of attention backend `name`: same attention, same mask."""
    twin = PREFIX + name
    if twin not in ALL_ATTENTION_FUNCTIONS:
        if name not in ALL_MASK_ATTENTION_FUNCTIONS or (name != "eager" and name not in ALL_ATTENTION_FUNCTIONS):
            raise ValueError(
                f"guide='target' reads the target's attention through its backend, and {name!r} is not one it can wrap "
                "(no attention or mask function registered); load the target with attn_implementation='sdpa'."
            )
        AttentionInterface.register(twin, _backend(name))
        AttentionMaskInterface.register(twin, ALL_MASK_ATTENTION_FUNCTIONS[name])
    return twin


class TargetGuide:
    """
    Captures `layers` of `target` (full-attention layers; default `count` evenly spaced over its second half) during
    each verification forward, and turns the newest verified query's attention into per-position weights.
    """

    def __init__(self, target, count: int = 4):
        text = target.config.get_text_config(decoder=True)
        types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
        full = [i for i, kind in enumerate(types) if kind == "full_attention"]
        if not full:
            raise ValueError("guide='target' needs a target with full-attention layers; this one has none.")
        half = full[len(full) // 2 :]
        step = max(1, len(half) // count)
        self.layers = half[::step][-count:]
        self.modules = {
            id(module): module
            for module in target.modules()
            if getattr(module, "layer_idx", None) in self.layers and hasattr(module, "num_key_value_groups")
        }
        if not self.modules:
            raise ValueError(
                f"guide='target' found no attention module of {type(target).__name__} for layers {self.layers} (it "
                "reads modules with `layer_idx` and `num_key_value_groups`, as transformers' decoder models have); "
                "drop guide='target' for this target."
            )
        self.target = target
        self.captured: dict[int, tuple] = {}
        self._restore: str | None = None

    def start(self) -> None:
        """The target's verification forward comes next: run it through the guided twin of its backend."""
        config = self.target.config
        own = config.get_text_config(decoder=True)._attn_implementation
        if own.startswith(PREFIX):  # left switched by a call that did not finish
            own = own[len(PREFIX) :]
        self.captured = {}
        top = config._attn_implementation
        self._restore = top[len(PREFIX) :] if isinstance(top, str) and top.startswith(PREFIX) else top
        config._attn_implementation = guided_name(own)
        for key in self.modules:
            _CAPTURING[key] = self

    def stop(self) -> None:
        for key in self.modules:
            _CAPTURING.pop(key, None)
        if self._restore is not None:
            self.target.config._attn_implementation = self._restore
            self._restore = None

    def finish(self, drafted: int, accepted: int) -> torch.Tensor | None:
        """
        After the verification: the attention of the newest verified query (the last of the `drafted + 1` verified
        positions' inputs that the target kept: row `accepted` of them), `[positions]` summing to one, over every
        position it attends; None if nothing was captured.
        """
        self.stop()
        rows, captured, self.captured = [], self.captured, {}
        for query, key, scale in captured.values():
            length, span = query.shape[2], key.shape[2]
            row = length - (drafted + 1) + accepted
            if not 0 <= row < length:
                return None
            seen = span - length + row + 1  # causal: what that query attends
            rows.append(attention_rows(query[:, :, row : row + 1], key[:, :, :seen], scale, seen - 1)[0])
        if not rows:
            return None
        seen = min(r.shape[0] for r in rows)
        return torch.stack([r[:seen] for r in rows]).mean(0)


def attention_rows(query: torch.Tensor, key: torch.Tensor, scale: float, first: int) -> torch.Tensor:
    """`[R, S]` float32: the attention of queries `[1, H_q, R, D]` at positions `first ..` over keys `[1, H_kv, S, D]`,
    causal (a query attends positions up to its own), softmax per query head, averaged over the heads."""
    heads, groups, rows = key.shape[1], query.shape[1] // key.shape[1], query.shape[2]
    q = query[0].float().view(heads, groups, rows, -1)
    logits = torch.einsum("hgrd,hsd->hgrs", q, key[0].float()) * scale
    positions = torch.arange(key.shape[2], device=logits.device)
    visible = positions <= torch.arange(first, first + rows, device=logits.device)[:, None]
    return logits.masked_fill(~visible, float("-inf")).softmax(-1).mean((0, 1))


def target_attention(target, sequence: torch.Tensor, first: int, count: int = 4, rows_per_pass: int = 64):
    """
    What `TargetGuide` captures at every verification, from one teacher-forced forward of `target` over `sequence`
    (`[1, S]`: a prompt and the target's own greedy output, whose keys and queries are those of the real run's
    verifications): `[S - first, S]` float32, row `r` the attention of the query at position `first + r` over
    positions `0 .. first + r` (zero after), averaged over heads and the guided layers. Replay of a guided policy reads
    row `L - 2 - first` at a round that starts with `L` tokens (`replay(..., guide=)`).
    """
    guide = TargetGuide(target, count)
    guide.start()
    try:
        with torch.no_grad():
            target(sequence.to(target.device), use_cache=False)
    finally:
        guide.stop()
    span = sequence.shape[1]
    out = torch.zeros(span - first, span)
    for query, key, scale in guide.captured.values():
        for start in range(first, span, rows_per_pass):
            stop = min(span, start + rows_per_pass)
            out[start - first : stop - first] += attention_rows(query[:, :, start:stop], key, scale, start).cpu()
    guide.captured = {}
    return out / max(1, len(guide.layers))
