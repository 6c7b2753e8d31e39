"""Selection alignment: teach the drafter's prefill-window queries to point at what its later tokens will read.

A policy that selects once at the prefill (SnapKV, rift-stat) keeps the prompt positions the last `window` queries
attend to most. Distilling under the compressed masks cannot change that choice (the masks are hard), so the
`repeat` regime, whose answer reads text far back, stays where it was. This loss acts on the choice itself: per
layer and KV head, the window's SnapKV scores (as the policy computes them, but differentiable) normalised over the
evictable positions are pulled towards the attention mass the answer's queries put on those positions with the full
cache (`future_attention`, computed once per sequence with the untrained drafter), by KL(future || window).
"""

from __future__ import annotations

import hashlib
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..attention import CAPTURED_QK
from ..kernels import pool_scores


@contextmanager
def captured_attention():
    """Within the block, every "rift"-attention layer's `(query, key, scale)` lands in the yielded dict."""
    captured: dict[int, tuple] = {}
    token = CAPTURED_QK.set(captured)
    try:
        yield captured
    finally:
        CAPTURED_QK.reset(token)


def window_scores(query: torch.Tensor, key: torch.Tensor, scale: float) -> torch.Tensor:
    """
    Differentiable SnapKV window scores (`kernels.reference.window_attention_scores` without sinks).

    Args:
        query: `[B, H_q, W, D]`, the queries of the last `W` positions of `key` (`[B, H_kv, T, D]`).
    Returns:
        `[B, H_kv, T]` fp32: attention summed over the window's queries, averaged over each KV head's query heads.
    """
    batch, h_q, window, dim = query.shape
    h_kv, length = key.shape[1], key.shape[2]
    group = h_q // h_kv
    q = (query.float() * scale).reshape(batch, h_kv, group * window, dim)
    logits = torch.matmul(q, key.float().transpose(-1, -2)).view(batch, h_kv, group, window, length)
    late = torch.ones(window, window, dtype=torch.bool, device=key.device).triu(1)
    causal = torch.zeros(window, length, dtype=torch.bool, device=key.device)
    causal[:, length - window :] = late
    probs = torch.softmax(logits.masked_fill(causal, float("-inf")), dim=-1)
    return probs.sum(dim=3).mean(dim=2)


def cache_fingerprint(kind: str, model, items: list[dict], window: int, n_sink: int) -> str:
    """What a cache of per-sequence forwards is keyed by: its kind, the ranges, the model's name and the sequences."""
    digest = hashlib.sha256(f"{kind}{window}:{n_sink}:{getattr(model.config, '_name_or_path', '')}".encode())
    for item in items:
        digest.update(item["input_ids"].cpu().numpy().tobytes() + str(item["boundary"]).encode())
    return digest.hexdigest()


@torch.no_grad()
def future_attention(
    model, items: list[dict], window: int, n_sink: int, path: Path | None = None
) -> list[torch.Tensor]:
    """
    Per sequence, `[L, H_kv, P]` fp32: the attention mass the answer's queries (positions `>= boundary` P) put on
    each evictable prompt position `[n_sink, P - window)`, summed over answer queries, averaged over each KV head's
    query heads, normalised to 1 per layer and KV head (0 elsewhere). Full cache, the model as it is now; needs the
    "rift" attention backend. With `path`, stored there and reused for the same model, sequences and ranges.
    """
    fingerprint = cache_fingerprint("", model, items, window, n_sink)
    if path is not None and Path(path).exists():
        with safe_open(str(path), framework="pt") as f:
            if (f.metadata() or {}).get("fingerprint") == fingerprint:
                return [f.get_tensor(f"future.{i}") for i in range(len(items))]
    was_training = model.training
    model.eval()
    out = []
    for item in tqdm(items, desc="future attention"):
        ids, boundary = item["input_ids"][None].to(model.device), int(item["boundary"])
        if not n_sink < boundary - window:
            raise ValueError(f"A prompt of {boundary} tokens leaves no evictable position with window {window}.")
        with captured_attention() as captured:
            model(ids)
        layers = [_future_mass(*captured[index], boundary, window, n_sink) for index in sorted(captured)]
        out.append(torch.stack(layers))
    model.train(was_training)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"future.{i}": f.contiguous() for i, f in enumerate(out)}
        save_file(tensors, str(path), metadata={"fingerprint": fingerprint})
    return out


def _future_mass(query, key, scale: float, boundary: int, window: int, n_sink: int) -> torch.Tensor:
    """One layer's `[H_kv, P]` share of the answer's attention (queries `>= boundary`) on each evictable prompt
    position `[n_sink, P - window)`, normalised to 1 per KV head (see `future_attention`)."""
    length = key.shape[2]
    group = query.shape[1] // key.shape[1]
    answer = (query[:, :, boundary:].float() * scale).reshape(1, key.shape[1], -1, query.shape[-1])
    logits = torch.matmul(answer, key.float().transpose(-1, -2))  # [1, H_kv, group * A, T]
    rows = torch.arange(boundary, length, device=key.device).repeat(group)
    visible = torch.arange(length, device=key.device)[None] <= rows[:, None]
    probs = torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1)
    mass = probs.sum(dim=2)[0, :, :boundary]  # [H_kv, P]
    mass[:, :n_sink] = 0
    mass[:, boundary - window :] = 0
    return mass / mass.sum(dim=-1, keepdim=True)


def _prefill_scores(entry: tuple, boundary: int, window: int, pool: str, kernel: int) -> torch.Tensor:
    """One layer's `(query, key, scale)` -> `[H_kv, P]`: the pooled SnapKV scores of the prefill window over the
    prompt, as a policy selecting at the prefill computes them (differentiable)."""
    query, key, scale = entry
    scores = window_scores(query[:, :, boundary - window : boundary], key[:, :, :boundary], scale)
    return pool_scores(scores, kernel, pool)[0]


def alignment_loss(
    captured: dict[int, tuple],
    future: torch.Tensor,
    boundary: int,
    window: int,
    n_sink: int,
    pool: str = "avg",
    kernel: int = 5,
) -> torch.Tensor:
    """
    Mean over layers and KV heads of KL(future || window scores normalised over `[n_sink, P - window)`).

    Args:
        captured: `captured_attention()`'s dict from a forward over the sequence (autograd intact).
        future: `[L, H_kv, P]` from `future_attention`, layers in ascending index order.
    """
    losses = []
    for row, index in enumerate(sorted(captured)):
        scores = _prefill_scores(captured[index], boundary, window, pool, kernel)[:, n_sink : boundary - window]
        log_share = (scores / scores.sum(dim=-1, keepdim=True)).clamp_min(1e-12).log()
        target = future[row, :, n_sink : boundary - window].to(scores.device)
        losses.append((target * (target.clamp_min(1e-12).log() - log_share)).sum(-1).mean())
    if not losses:
        raise ValueError("No attention was captured: the drafter must use the 'rift' attention backend.")
    return torch.stack(losses).mean()


@torch.no_grad()
def selection_recall(captured: dict[int, tuple], future: torch.Tensor, boundary: int, count: int, window: int,
                     pool: str = "avg", kernel: int = 5) -> float:  # fmt: skip
    """
    Share of `future`'s mass (`[L, H_kv, P]`) on the `count` positions per layer and KV head that the window's
    SnapKV scores rank highest among `[0, P - count)` (rift-stat's selection when the other `count` are recent),
    averaged over layers and KV heads.
    """
    kept = []
    for row, index in enumerate(sorted(captured)):
        scores = _prefill_scores(captured[index], boundary, window, pool, kernel)[:, : boundary - count]
        top = scores.topk(min(count, scores.shape[-1]), dim=-1).indices
        kept.append(future[row].to(scores.device).gather(-1, top).sum(-1).mean())
    return float(torch.stack(kept).mean())
