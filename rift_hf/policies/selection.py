"""What survives in a compressed layer: pure functions of scores, positions and counters."""

from __future__ import annotations

import torch


def select_tokens(scores: torch.Tensor, lo: int, hi: int, count: int) -> torch.Tensor:
    """
    Top-`count` positions per KV head among `[lo, hi)`.

    Args:
        scores: `[H_kv, T]` (`T >= hi`), higher is more important.
    Returns:
        `[H_kv, min(count, hi - lo)]` int64 absolute positions, ascending per head.
    """
    count = max(0, min(count, hi - lo))
    if count == 0:
        return torch.empty(scores.shape[0], 0, dtype=torch.long, device=scores.device)
    top = scores[:, lo:hi].topk(count, dim=-1).indices + lo
    return top.sort(dim=-1).values


def select_blocks(
    block_scores: torch.Tensor, block_size: int, lo: int, hi: int, count: int, heads: int
) -> torch.Tensor:
    """
    Whole blocks with the best mean score, the same for every KV head.

    Args:
        block_scores: `[n_blocks]`, block `b` covering positions `[b * block_size, (b + 1) * block_size)`.
        lo, hi: only blocks lying entirely inside `[lo, hi)` are candidates.
        count: token budget of the selection; `count // block_size` blocks are kept.
    Returns:
        `[heads, n * block_size]` int64 positions, ascending.
    """
    first = -(-lo // block_size)
    last = min(hi // block_size, block_scores.shape[0])
    n_pick = max(0, min(count // block_size, last - first))
    if n_pick == 0:
        return torch.empty(heads, 0, dtype=torch.long, device=block_scores.device)
    blocks = block_scores[first:last].topk(n_pick).indices.sort().values + first
    offsets = torch.arange(block_size, device=blocks.device)
    positions = (blocks[:, None] * block_size + offsets[None, :]).flatten()
    return positions.unsqueeze(0).expand(heads, -1).contiguous()


def rank_pages_ahead(pages: torch.Tensor, ahead: int) -> torch.Tensor:
    """
    Pages in the order to keep them when a chosen page brings the `ahead` pages after it (copying reads forward).

    Args:
        pages: `[H, n]` page scores, higher is more important (compared as float32).
    Returns:
        `[H, n]` page indices by *ahead score* (the best of a page's own score and those of the `ahead` pages before
        it), descending; ties (a page and the ones it lifts) broken by the page's own score, then by index.
    """
    pages = pages.float()
    lifted = pages.clone()
    for shift in range(1, min(ahead, pages.shape[-1] - 1) + 1):
        lifted[:, shift:] = torch.maximum(lifted[:, shift:], pages[:, :-shift])
    # One stable sort on (ahead score, own score) packed into an int64: a float32's bits, read as an int32 with the
    # bits after the sign flipped for negatives, order as the floats do (-0.0 just below +0.0).
    own, ahead_bits = _ordered_bits(pages), _ordered_bits(lifted)
    return ((ahead_bits << 32) + (own + 2**31)).argsort(dim=-1, descending=True, stable=True)


def _ordered_bits(values: torch.Tensor) -> torch.Tensor:
    """float32 -> int64 with the same order (int32 range)."""
    bits = values.contiguous().view(torch.int32)
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits).long()


def keep_mask(
    positions: torch.Tensor, seen: int, n_sink: int, recent: int, selected: torch.Tensor | None
) -> torch.Tensor:
    """
    Which stored entries survive once `seen` tokens are committed.

    Args:
        positions: `[H_kv, N]` absolute positions of the stored entries.
        selected: `[H_kv, S]` positions picked by the scorer, ascending per head (or `None`).
    Returns:
        `[H_kv, N]` bool: sinks, the `recent` newest positions and the selected ones.
    """
    keep = (positions < n_sink) | (positions >= seen - recent)
    if selected is not None and selected.shape[-1]:
        # Membership by binary search, O(N log S) (an all-pairs comparison is O(N S) per layer and step).
        selected = selected.to(positions.device).contiguous()
        slot = torch.searchsorted(selected, positions.contiguous()).clamp_(max=selected.shape[-1] - 1)
        keep |= selected.gather(-1, slot) == positions
    return keep
