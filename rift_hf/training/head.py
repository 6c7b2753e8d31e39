"""Fit a selection head (`rift_hf.SelectionHead`) to where the drafter's answer tokens read, the drafter untouched.

Per training sequence (a prompt and its known answer, `recipe.training_sequences`), one full-cache forward of the
drafter gives, for every attention layer, the prefill window's queries, the prompt's keys and the share of the
answer's attention on each evictable prompt position (`future_attention`'s target). Those are cached to a
safetensors file; fitting the head is then cheap (no drafter forward): per sequence, layer and KV head, the pooled
SnapKV scores of the head's re-weighted window queries, normalised over the evictable positions, are pulled towards
the answer's attention by KL(future || scores), the alignment loss of `selection.alignment_loss`.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..kernels import pool_scores
from ..policies.selection_head import SelectionHead
from .selection import _future_mass, cache_fingerprint, captured_attention, window_scores


def refresh_points(boundary: int, length: int, delta: int | None) -> list[int]:
    """Where a policy re-selects in a sequence of `length` tokens whose prompt ends at `boundary`: the prefill only
    (`delta=None`), or also every `delta // 2` tokens inside the answer while `delta // 2` answer tokens follow
    (rift-dyn refreshes every `delta` verified tokens; half-steps give twice the examples of its phases)."""
    if delta is None:
        return [boundary]
    step = max(1, delta // 2)
    return list(range(boundary, length - step + 1, step))


@torch.no_grad()
def head_examples(
    model, items: list[dict], window: int, n_sink: int, path: Path | None = None, delta: int | None = None
) -> list[dict]:
    """
    Per sequence and selection point t (`refresh_points`; the prompt's end P without `delta`): `query`
    `[L, H_q, window, D]` (the `window` queries before t), `key` `[L, H_kv, t, D]` (everything before t), both bf16,
    `future` `[L, H_kv, t]` fp32 (the share of the attention of the tokens after t on each evictable position
    `[n_sink, t - window)`: the whole answer without `delta`, the next `delta` tokens with it, the span a rift-dyn
    selection made at t serves), `layers`, `scale`, `boundary` t and `sequence` (the item's index). One forward per
    sequence with the "rift" attention backend; with `path`, stored there and reused for the same model, sequences,
    ranges and `delta`.
    """
    fingerprint = cache_fingerprint(f"head:{delta}:", model, items, window, n_sink)
    if path is not None and Path(path).exists():
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") == fingerprint:
                layers = [int(i) for i in meta["layers"].split(",")]
                keys = [f.get_tensor(f"key.{i}") for i in range(len(items))]
                owners = [int(i) for i in meta["owners"].split(",")]
                points = [int(t) for t in meta["points"].split(",")]
                return [
                    {
                        "query": f.get_tensor(f"query.{j}"),
                        "key": keys[owner][:, :, :t],
                        "future": f.get_tensor(f"future.{j}"),
                        "layers": layers,
                        "scale": float(meta["scale"]),
                        "boundary": t,
                        "sequence": owner,
                    }
                    for j, (owner, t) in enumerate(zip(owners, points, strict=True))
                ]
    was_training = model.training
    model.eval()
    out, keys = [], []
    tick = time.perf_counter()
    for index, item in enumerate(tqdm(items, desc="selection-head examples")):
        ids, boundary = item["input_ids"][None].to(model.device), int(item["boundary"])
        if not n_sink < boundary - window:
            raise ValueError(f"A prompt of {boundary} tokens leaves no evictable position with window {window}.")
        with captured_attention() as captured:
            model(ids)
        if not captured:
            raise ValueError("No attention was captured: load the drafter with attn_implementation='rift'.")
        layers = sorted(captured)
        scale = captured[layers[0]][2]
        points = refresh_points(boundary, ids.shape[1], delta)
        keys.append(torch.stack([captured[i][1][0, :, : points[-1]] for i in layers]).bfloat16())
        for t in points:
            end = ids.shape[1] if delta is None else min(ids.shape[1], t + delta)
            future = [_future_mass(q[..., :end, :], k[..., :end, :], sc, t, window, n_sink) for q, k, sc in
                      (captured[i] for i in layers)]  # fmt: skip
            out.append(
                {
                    "query": torch.stack([captured[i][0][0, :, t - window : t] for i in layers]).bfloat16(),
                    "key": keys[-1][:, :, :t],
                    "future": torch.stack(future),
                    "layers": layers,
                    "scale": float(scale),
                    "boundary": t,
                    "sequence": index,
                }
            )
    model.train(was_training)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tensors = {f"key.{i}": k.contiguous() for i, k in enumerate(keys)}
        tensors |= {f"{name}.{j}": e[name].contiguous() for j, e in enumerate(out) for name in ("query", "future")}
        meta = {
            "fingerprint": fingerprint,
            "layers": ",".join(map(str, out[0]["layers"])),
            "scale": str(out[0]["scale"]),
            "owners": ",".join(str(e["sequence"]) for e in out),
            "points": ",".join(str(e["boundary"]) for e in out),
            "seconds": str(time.perf_counter() - tick),  # what the forwards cost, read back by `forward_seconds`
        }
        save_file(tensors, str(path), metadata=meta)
    return out


def forward_seconds(path: Path) -> float | None:
    """The seconds `head_examples` spent on the forwards it cached in `path` (None where it did not record them)."""
    with safe_open(str(path), framework="pt") as f:
        seconds = (f.metadata() or {}).get("seconds")
    return None if seconds is None else float(seconds)


def _scores(head: SelectionHead | None, example: dict, row: int, pool: str, kernel: int) -> torch.Tensor:
    """`[H_kv, P]` pooled SnapKV scores of one layer's prefill window over the prompt, through `head` if given."""
    query, key = example["query"][row][None].float(), example["key"][row][None].float()
    if head is not None:
        query = head(example["layers"][row], query)
    return pool_scores(window_scores(query, key, example["scale"]), kernel, pool)[0]


def head_loss(head, example: dict, n_sink: int, window: int, pool: str = "avg", kernel: int = 5) -> torch.Tensor:
    """Mean over layers and KV heads of KL(future || scores normalised over `[n_sink, P - window)`)."""
    hi = example["boundary"] - window
    losses = []
    for row in range(len(example["layers"])):
        scores = _scores(head, example, row, pool, kernel)[:, n_sink:hi]
        log_share = (scores / scores.sum(dim=-1, keepdim=True)).clamp_min(1e-12).log()
        target = example["future"][row, :, n_sink:hi]
        losses.append((target * (target.clamp_min(1e-12).log() - log_share)).sum(-1).mean())
    return torch.stack(losses).mean()


@torch.no_grad()
def head_recall(head, examples: list[dict], compression: float, pool: str = "avg", kernel: int = 5) -> float:
    """
    Mean over sequences, layers and KV heads of the share of the answer's attention on the `P / compression / 2`
    positions the (head's) scores rank highest among `[0, P - count)`: what rift-stat's prefill selection keeps when
    the other half of the budget is the recent window. `head=None` measures plain SnapKV.
    """
    kept = []
    for example in examples:
        count = int(example["boundary"] / compression) // 2
        for row in range(len(example["layers"])):
            scores = _scores(head, example, row, pool, kernel)[:, : example["boundary"] - count]
            top = scores.topk(min(count, scores.shape[-1]), dim=-1).indices
            kept.append(example["future"][row].gather(-1, top).sum(-1).mean())
    return float(torch.stack(kept).mean())


def train_selection_head(
    head: SelectionHead,
    examples: list[dict],
    *,
    epochs: int = 8,
    lr: float = 3e-2,
    n_sink: int = 0,
    window: int = 64,
    pool: str = "avg",
    kernel: int = 5,
    seed: int = 0,
) -> list[float]:
    """Fit `head` in place by Adam over the examples (one sequence per step, shuffled each epoch, cosine decay);
    returns the loss of every step."""
    if not examples:
        raise ValueError("No training examples: build them with `head_examples`.")
    optimizer = torch.optim.Adam(head.parameters(), lr=lr)
    total = epochs * len(examples)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    order = list(range(len(examples)))
    rng = random.Random(seed)
    log = []
    with tqdm(total=total, desc="selection head") as bar:
        for _ in range(epochs):
            rng.shuffle(order)
            for index in order:
                loss = head_loss(head, examples[index], n_sink, window, pool, kernel)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                schedule.step()
                log.append(loss.item())
                bar.update()
                bar.set_postfix(loss=f"{log[-1]:.3f}")
    return log
