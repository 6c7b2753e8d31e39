"""Which past positions a compressed layer's working set holds, in its row order: sinks, selection, recent window;
and the rebuild of a working set in that order."""

from __future__ import annotations

import torch

from ..policies import keep_mask


def window_size(cache, seen: int, selected: torch.Tensor | None) -> int:
    """The recent window of a layer of `cache` after `seen` tokens, with `selected` chosen: the cache's `recent`,
    growing with the output under `snapkv_grow` (original SnapKV), or widened to the budget's unused selection slots
    when a short prompt has fewer candidates than slots (the selection lies below the window: they never overlap)."""
    if cache.config.snapkv_grow:
        return max(cache.recent, seen - cache.prompt_length + cache.recent)
    if selected is not None and selected.shape[-1] < cache.n_select:
        return cache.budget - cache.config.n_sink - selected.shape[-1]
    return cache.recent


def layout_index(
    seen: int, n_sink: int, selected: torch.Tensor | None, recent: int, usual_recent: int, heads: int, device
) -> tuple[torch.Tensor, int, int]:
    """
    The positions `[H_kv, N]` a working set holds after `seen` tokens, as `(index, fixed, recent)`: the first `fixed`
    rows are the sinks and the selection (`selected`, `[H_kv, S]` ascending, in `[n_sink, seen - recent)`), the last
    `recent` rows the window.

    With the usual window (`recent == usual_recent`) the three parts are disjoint. A window widened by unused selection
    slots (a short prompt) or growing (original SnapKV) may reach into the selection: the union is taken then (a host
    sync, but only on these rare rebuilds).
    """
    if selected is None:
        selected = torch.empty(heads, 0, dtype=torch.long)
    selected = selected.to(device)
    if recent == usual_recent:
        sinks = torch.arange(n_sink, device=device).expand(heads, -1)
        tail = torch.arange(seen - recent, seen, device=device).expand(heads, -1)
        return torch.cat([sinks, selected, tail], dim=-1), n_sink + selected.shape[-1], recent
    every = torch.arange(seen, device=device).expand(heads, -1)
    keep = keep_mask(every, seen, n_sink, recent, selected)
    counts = keep.sum(-1)
    if bool((counts != counts[0]).any()):
        raise RuntimeError(f"Internal error: heads keep different counts {counts.tolist()}.")
    index = keep.nonzero()[:, 1].view(heads, -1)
    recent = min(recent, index.shape[-1] - n_sink)
    return index, index.shape[-1] - recent, recent


def lay_out(working, cache, seen: int, selected, keys, values, gather, headroom: int) -> None:
    """
    Rebuild `working` (a `WorkingSet` of a layer of `cache`) as sinks, `selected` and the recent window after `seen`
    tokens (`layout_index`, `window_size`), reading the rows from `keys`/`values` (row = position), or from the rows
    `gather(index)` returns in the order of the index (a quantised store dequantising only them).
    """
    heads, device, n_sink = working.shape[1], working.device, cache.config.n_sink
    recent = window_size(cache, seen, selected)
    index, fixed, recent = layout_index(seen, n_sink, selected, recent, cache.recent, heads, device)
    positions = None
    if gather is not None:
        keys, values = gather(index)
        index, positions = torch.arange(index.shape[-1], device=device).expand(heads, -1), index
    ring = None if cache.config.snapkv_grow else recent  # original SnapKV: the window grows with the output
    working.build(keys, values, index, fixed, ring, headroom, positions)
