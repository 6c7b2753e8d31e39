"""The selection-head recipe on a real preset: capture examples, fit the head, evaluate before and after by replay,
write a Hub-ready folder (`python -m lab train-head`). The head and its training live in `rift_hf.training.head`."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from lab.records import TARGETS
from rift_hf.policies.selection_head import HEAD_NAME, SelectionHead
from rift_hf.training.head import forward_seconds, head_examples, head_recall, train_selection_head

CARRIED = "carried from before_dir (the head does not change the drafter)"


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
    targets_dir: Path = TARGETS,
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
    import statistics

    from transformers import AutoTokenizer

    from lab.recipe import (
        PROXY_MODULES,
        TASKS,
        TRAIN_MODULES,
        checked_run,
        evaluation_record,
        replay_summary,
        training_sequences,
    )
    from lab.records import Experiment, machine
    from lab.replay_runs import replay_compare
    from rift_hf.attention import use_rift_attention
    from rift_hf.config import RiftConfig
    from rift_hf.models import PRESETS, ensure_local, load_model

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
    evaluation = Experiment(preset, ("full", policy), eval_input_tokens, eval_new_tokens, eval_per_task, gamma=gamma,
                            window=window, delta=delta, name="training")  # fmt: skip
    if replay:
        common = dict(targets_dir=targets_dir, models=(None, draft, tokenizer))
        replay_compare(evaluation, compressions, before_dir, **common)
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
        with_head = dataclasses.replace(evaluation, policies=(policy,), extra={"selection_head": str(head_path)})
        replay_compare(with_head, compressions, after_dir, **common)
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
        "eval": evaluation_record(evaluation, before_dir, after_dir, full_rows=CARRIED),
        "gamma": gamma,
        "window": window,
        "recommended_config": recommended,
        "before": before,
        "after": after,
        "machine": machine(),
        "dtype": "float32 (drafter, examples, fit and replay); target bfloat16",
        "date": datetime.date.today().isoformat(),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
