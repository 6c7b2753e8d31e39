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
from ..policies.selection_head import HEAD_NAME, SelectionHead
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


def run_head(
    preset: str,
    out: Path,
    *,
    policy: str = "rift-stat",
    compressions=(4.0, 8.0),
    prompt_tokens: int = 768,
    answer_tokens: int = 256,
    epochs: int = 8,
    learning_rate: float = 3e-2,
    window: int = 64,
    delta: int = 128,
    eval_input_tokens: int = 4096,
    eval_new_tokens: int = 512,
    eval_per_task: int = 8,
    gamma: int = 11,
    replay: bool = True,
    refresh: bool = False,
    before_dir: Path | None = None,
    after_dir: Path | None = None,
    targets_dir: Path = Path("benchmarks/results/targets"),
) -> dict:
    """
    Fit a selection head for `policy` on a preset's drafter and evaluate it before/after; write `out`.

    The recipe's data (`recipe.training_sequences`: repeat/continue prompts of `prompt_tokens` source tokens and
    `answer_tokens` of their answer, training and proxy modules disjoint from the evaluation's), one forward per
    sequence (`head_examples`, cached in `out`), then `train_selection_head`. Proxy: `head_recall` on the proxy
    sequences per compression and regime. Replay (as `recipe.run`): the full cache and `policy` on the `rift-hf
    replay` prompt set, before (`before_dir`, resumed) and with the head (`after_dir`). The drafter's weights are not
    touched, so its full-cache rows are carried from `before_dir` into `after_dir` instead of replayed again.
    `out/model` is the head's Hub-ready repository: `selection_head.safetensors` and `rift_config.json` naming it (and
    the card); the drafter is the base model itself, from its own repository. With `refresh`, the examples are taken
    at rift-dyn's refresh points too
    (`refresh_points` with `delta`: the decode queries before each point, the next `delta` tokens' attention as the
    target) instead of at the prefill alone.
    """
    import datetime
    import json
    import platform
    import statistics

    from transformers import AutoTokenizer

    from ..config import RiftConfig
    from ..generation.candidate import use_rift_attention
    from ..models import PRESETS, ensure_local, load_model
    from ..replay import replay_compare
    from .recipe import PROXY_MODULES, TASKS, TRAIN_MODULES, checked_run, replay_summary, training_sequences

    tick = time.perf_counter()
    compressions = checked_run(preset, compressions)
    shape = RiftConfig(policy=policy, window=window, selection_head="selection_head.safetensors")  # validates policy
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target_spec, draft_spec = PRESETS[preset]
    tokenizer = AutoTokenizer.from_pretrained(ensure_local(target_spec))
    draft = load_model(draft_spec, torch.float32)
    use_rift_attention(draft, shape)
    train_items = training_sequences(tokenizer, TRAIN_MODULES, prompt_tokens, answer_tokens)
    proxy_items = training_sequences(tokenizer, PROXY_MODULES, prompt_tokens, answer_tokens)
    points = delta if refresh else None
    points_text = (
        f"the prefill and every {delta // 2} answer tokens (next {delta} tokens' attention)"
        if refresh
        else "the prefill (the whole answer's attention)"
    )
    kind = f"-refresh{delta}" if refresh else ""
    cached = [out / f"head-{name}-{prompt_tokens}{kind}.safetensors" for name in ("examples", "proxy")]
    examples = head_examples(draft, train_items, window, shape.n_sink, cached[0], delta=points)
    proxy_examples = head_examples(draft, proxy_items, window, shape.n_sink, cached[1], delta=points)
    seconds = [forward_seconds(path) for path in cached]  # the forwards may have run in an earlier invocation
    examples_seconds = None if None in seconds else sum(seconds)

    def recall(head) -> dict:
        return {
            f"{c:g}x": {
                task: head_recall(
                    head,
                    [e for e in proxy_examples if proxy_items[e["sequence"]]["name"].startswith(task)],
                    c,
                )
                for task in TASKS
            }
            for c in compressions
        }

    model_dir = out / "model"
    fit = {"policy": policy, "epochs": epochs, "learning_rate": learning_rate, "sequences": len(train_items),
           "examples": len(examples), "prompt_tokens": prompt_tokens, "answer_tokens": answer_tokens,
           "window": window, "points": points_text}  # fmt: skip
    earlier = json.loads((out / "eval.json").read_text()) if (out / "eval.json").is_file() else None
    if earlier is not None and (model_dir / HEAD_NAME).is_file() and all(earlier.get(k) == v for k, v in fit.items()):
        # The same fit already ran (e.g. a proxy-only run): its head is reused, and its loss and time reported.
        head = SelectionHead.load(model_dir)
        per_epoch, fit_seconds = earlier["loss_per_epoch"], earlier["fit_seconds"]
        recall_before, recall_after = earlier["recall_before"], earlier["recall_after"]
        if set(recall_after) != {f"{c:g}x" for c in compressions}:
            recall_before, recall_after = recall(None), recall(head)
        head_path = model_dir / HEAD_NAME
    else:
        recall_before = recall(None)
        fit_tick = time.perf_counter()
        log = train_selection_head(head := SelectionHead.for_model(draft.config), examples, epochs=epochs,
                                   lr=learning_rate, n_sink=shape.n_sink, window=window)  # fmt: skip
        fit_seconds = time.perf_counter() - fit_tick
        per_epoch = [statistics.mean(log[i : i + len(examples)]) for i in range(0, len(log), len(examples))]
        recall_after = recall(head)
        head_path = head.save(model_dir, {"preset": preset, "policy": policy, "window": window})

    before = after = None
    before_dir = Path(before_dir) if before_dir is not None else out / "replay-before"
    after_dir = Path(after_dir) if after_dir is not None else out / "replay-after"
    if replay:
        common = dict(
            targets_dir=targets_dir, models=(None, draft, tokenizer), summary_path=None, experiment="training"
        )
        settings = (eval_input_tokens, eval_new_tokens, eval_per_task, gamma, window, delta)
        replay_compare(preset, ["full", policy], compressions, *settings, before_dir, **common)
        for c in compressions:  # the untouched drafter's full-cache rows, carried over (the head only scores)
            rows = [
                line
                for line in (before_dir / f"{c:g}x" / "rows.jsonl").read_text().splitlines()
                if json.loads(line)["policy"] == "full"
            ]
            path = after_dir / f"{c:g}x" / "rows.jsonl"
            held = path.read_text().splitlines() if path.exists() else []
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("\n".join([*rows, *(r for r in held if json.loads(r)["policy"] != "full")]) + "\n")
        replay_compare(
            preset, [policy], compressions, *settings, after_dir, **common, extra={"selection_head": str(head_path)}
        )
        before = replay_summary(before_dir, [policy], compressions)
        after = replay_summary(after_dir, [policy], compressions)

    # The Hub-ready folder is the head's own small repository (head, config, card): the drafter's weights are the
    # base model's, unchanged, loaded from its own repository.
    recommended = {"policy": policy, "budget": 1.0 / compressions[0], "window": window,
                   "selection_head": head_path.name}  # fmt: skip
    RiftConfig.from_dict(recommended).save_pretrained(model_dir)
    result = {
        "kind": "selection-head",
        "preset": preset,
        "base_model": draft_spec.upstream,
        "policy": policy,
        "compressions": compressions,
        "parameters": head.factors.numel(),
        "epochs": epochs,
        "learning_rate": learning_rate,
        "sequences": len(train_items),
        "examples": len(examples),
        "points": points_text,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "train_modules": [m for m in TRAIN_MODULES if any(i["name"].endswith(f":{m}") for i in train_items)],
        "proxy_modules": list(PROXY_MODULES),
        "loss_per_epoch": per_epoch,
        "recall_before": recall_before,
        "recall_after": recall_after,
        "examples_seconds": examples_seconds,  # None: cached by a run that did not record the time
        "fit_seconds": fit_seconds,
        "total_seconds": time.perf_counter() - tick,
        "eval": {
            "method": "replay",
            "input_tokens": eval_input_tokens,
            "new_tokens": eval_new_tokens,
            "per_task": eval_per_task,
            "gamma": gamma,
            "window": window,
            "before_dir": str(before_dir),
            "after_dir": str(after_dir),
            "full_rows": "carried from before_dir (the head does not change the drafter)",
        },
        "gamma": gamma,
        "window": window,
        "recommended_config": recommended,
        "before": before,
        "after": after,
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads (CPU)",
        "dtype": "float32 (drafter, examples, fit and replay); target bfloat16",
        "date": datetime.date.today().isoformat(),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
