"""Fit a selection head (`rift_hf.SelectionHead`) to where the drafter's answer tokens read, the drafter untouched.

Per training sequence (a prompt and its known answer, `recipe.training_sequences`), one full-cache forward of the
drafter gives, for every attention layer, the prefill window's queries, the prompt's keys and the share of the
answer's attention on each evictable prompt position (`future_attention`'s target). Those are cached to a
safetensors file; fitting the head is then cheap (no drafter forward): per sequence, layer and KV head, the pooled
SnapKV scores of the head's re-weighted window queries, normalised over the evictable positions, are pulled towards
the answer's attention by KL(future || scores), the alignment loss of `selection.alignment_loss`.
"""

from __future__ import annotations

import hashlib
import math
import random
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm.auto import tqdm

from ..kernels import pool_scores
from ..selection_head import SelectionHead
from .selection import _future_mass, captured_attention, window_scores


@torch.no_grad()
def head_examples(model, items: list[dict], window: int, n_sink: int, path: Path | None = None) -> list[dict]:
    """
    Per sequence: `query` `[L, H_q, window, D]` (the prefill window), `key` `[L, H_kv, P, D]` (the prompt), both
    bf16, `future` `[L, H_kv, P]` fp32, `layers` (the attention layers' indices), `scale` and `boundary` P. One
    forward per sequence with the "rift" attention backend; with `path`, stored there and reused for the same model,
    sequences and ranges.
    """
    digest = hashlib.sha256(f"head:{window}:{n_sink}:{getattr(model.config, '_name_or_path', '')}".encode())
    for item in items:
        digest.update(item["input_ids"].cpu().numpy().tobytes() + str(item["boundary"]).encode())
    fingerprint = digest.hexdigest()
    if path is not None and Path(path).exists():
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("fingerprint") == fingerprint:
                layers = [int(i) for i in meta["layers"].split(",")]
                return [
                    {
                        **{name: f.get_tensor(f"{name}.{i}") for name in ("query", "key", "future")},
                        "layers": layers,
                        "scale": float(meta["scale"]),
                        "boundary": int(item["boundary"]),
                    }
                    for i, item in enumerate(items)
                ]
    was_training = model.training
    model.eval()
    out = []
    for item in tqdm(items, desc="selection-head examples"):
        ids, boundary = item["input_ids"][None].to(model.device), int(item["boundary"])
        if not n_sink < boundary - window:
            raise ValueError(f"A prompt of {boundary} tokens leaves no evictable position with window {window}.")
        with captured_attention() as captured:
            model(ids)
        if not captured:
            raise ValueError("No attention was captured: load the drafter with attn_implementation='rift'.")
        layers = sorted(captured)
        scale = captured[layers[0]][2]
        out.append(
            {
                "query": torch.stack([captured[i][0][0, :, boundary - window : boundary] for i in layers]).bfloat16(),
                "key": torch.stack([captured[i][1][0, :, :boundary] for i in layers]).bfloat16(),
                "future": torch.stack([_future_mass(*captured[i], boundary, window, n_sink) for i in layers]),
                "layers": layers,
                "scale": float(scale),
                "boundary": boundary,
            }
        )
    model.train(was_training)
    if path is not None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        names = ("query", "key", "future")
        tensors = {f"{name}.{i}": e[name].contiguous() for i, e in enumerate(out) for name in names}
        layers = ",".join(map(str, out[0]["layers"]))
        meta = {"fingerprint": fingerprint, "layers": layers, "scale": str(out[0]["scale"])}
        save_file(tensors, str(path), metadata=meta)
    return out


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
