"""A trained selection head: how the scorer reads the drafter's queries, learnt apart from the drafter.

A policy that scores with queries (SnapKV, rift-stat, rift-dyn, ...) keeps the positions the latest queries attend
to. Those queries were trained to predict the next token, not to say what later tokens will read. A selection head
re-weights them for scoring only: per layer, query head and rotary frequency pair `(i, i + D/2)` it multiplies the
pair, read as a complex number, by a learnt complex factor. A complex factor commutes with the rotary rotation of
that pair, so the head acts on relative positions the same way at every offset; it changes which positions are
selected and nothing else (the drafter's own attention, and so its full-cache output, is untouched).

`rift_hf.training.train_selection_head` fits one to the attention mass the drafter's answer queries put on the
prompt (`future_attention`); `RiftConfig(selection_head=...)` makes the cache score with it.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

HEAD_NAME = "selection_head.safetensors"


class SelectionHead(torch.nn.Module):
    """
    Complex factors `[num_layers, num_heads, head_dim // 2, 2]` (real, imaginary), identity at initialisation.

    Args:
        num_layers: the drafter's `num_hidden_layers` (rows of layers without queries stay unused).
        num_heads: query heads per layer.
        head_dim: query head size (even).
    """

    def __init__(self, num_layers: int, num_heads: int, head_dim: int):
        super().__init__()
        for name, value in (("num_layers", num_layers), ("num_heads", num_heads), ("head_dim", head_dim)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"`{name}` must be a positive int, got {value!r}.")
        if head_dim % 2:
            raise ValueError(f"`head_dim` must be even (rotary pairs), got {head_dim}.")
        factors = torch.zeros(num_layers, num_heads, head_dim // 2, 2)
        factors[..., 0] = 1.0
        self.factors = torch.nn.Parameter(factors)

    @classmethod
    def for_model(cls, config) -> SelectionHead:
        """An identity head shaped for a drafter's (text) config."""
        config = getattr(config, "get_text_config", lambda: config)()
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return cls(config.num_hidden_layers, config.num_attention_heads, head_dim)

    def forward(self, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """`query` `[B, H_q, W, D]` of layer `layer_idx` -> the re-weighted queries the scorer reads."""
        if query.shape[1] != self.factors.shape[1] or query.shape[-1] != 2 * self.factors.shape[2]:
            raise ValueError(
                f"This selection head was trained for {self.factors.shape[1]} query heads of size "
                f"{2 * self.factors.shape[2]}, but layer {layer_idx} has {query.shape[1]} of size {query.shape[-1]}: "
                "use the head trained for this drafter, or drop `selection_head` from the RiftConfig."
            )
        factors = self.factors[layer_idx].to(device=query.device, dtype=torch.float32)[None, :, None]
        a, b = factors[..., 0], factors[..., 1]  # [1, H_q, 1, D/2]
        half = query.shape[-1] // 2
        x, y = query[..., :half].float(), query[..., half:].float()
        return torch.cat([a * x - b * y, a * y + b * x], dim=-1).to(query.dtype)

    def save(self, path, metadata: dict | None = None) -> Path:
        """Write the factors to a safetensors file (a folder gets `selection_head.safetensors`)."""
        path = Path(path)
        if path.suffix != ".safetensors":
            path = path / HEAD_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {"format": "rift-selection-head", **{k: json.dumps(v) for k, v in (metadata or {}).items()}}
        save_file({"factors": self.factors.detach().contiguous().cpu()}, str(path), metadata=meta)
        return path

    @classmethod
    def load(cls, path) -> SelectionHead:
        """Read a head written by `save` (a file, or a folder holding `selection_head.safetensors`)."""
        path = Path(path)
        if path.is_dir():
            path = path / HEAD_NAME
        if not path.is_file():
            raise FileNotFoundError(
                f"No selection head at {path}; train one with `rift_hf.training.train_selection_head` or drop "
                "`selection_head` from the RiftConfig."
            )
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("format") != "rift-selection-head":
                raise ValueError(f"{path} is not a rift selection head (written by `SelectionHead.save`).")
            factors = f.get_tensor("factors")
        if factors.dim() != 4 or factors.shape[-1] != 2:
            raise ValueError(f"{path} holds factors of shape {tuple(factors.shape)}, not [layers, heads, D/2, 2].")
        head = cls(factors.shape[0], factors.shape[1], 2 * factors.shape[2])
        with torch.no_grad():
            head.factors.copy_(factors)
        return head
