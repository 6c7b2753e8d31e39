"""The whole compressibility recipe on a real preset: evaluate, distil, evaluate again, write a Hub-ready folder.

    python -m lab train --preset qwen-coder --steps 120 --out ~/.cache/rift-hf/trained/qwen-coder-rift-stat

Training sequences are shaped like the evaluation's use: a `repeat` or `continue` chat prompt built from a
standard-library module (`rift_hf.prompts.build_prompt`) followed by its known answer (the text to repeat, or the
module's next tokens). The compressed cache starts at the prompt's end, as it does after a real prefill. Training,
hyper-parameter proxy and evaluation modules are disjoint (`TRAIN_MODULES`, `PROXY_MODULES`,
`rift_hf.prompts.MODULES`).

The teacher is the target (`teacher="target"`: the tokens the drafter is judged against; its top-k
log-probabilities are computed once into `<out>/teacher-top<k>.safetensors`) or a frozen copy of the drafter
(`teacher="self"`). Only the attention projections train (fp32). Training is resumable: the `Trainer` checkpoints
to `<out>/trainer` and a rerun with the same `out` continues from the last checkpoint.

Two evaluations, before and after:
- a proxy, cheap enough for a hyper-parameter look: on held-out proxy sequences, the share of answer positions where
  the drafter's argmax equals the target's, under each evaluated cache (teacher-forced masks) and with the full
  cache; proxy retention = the ratio;
- acceptance length by exact replay (`rift_hf.replay`) on the `python -m lab replay` prompt set (8 prompts per regime,
  ~4K tokens, 512 new by default) for the full cache and each (policy, compression); retention per prompt = AL / the
  same drafter's full-cache AL on that prompt. `before_dir` may name an existing replay folder of the untouched
  drafter (e.g. `benchmarks/results/E1/...`), which the before-evaluation resumes instead of recomputing; `after_dir`
puts the after-evaluation's rows elsewhere than `<out>/replay-after` (e.g. next to the results kept in the repo).
"""

from __future__ import annotations

import copy
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

from lab.records import TARGETS, Experiment, machine
from rift_hf.config import RiftConfig, policy_settings

TRAIN_MODULES = (
    "email.message",
    "http.client",
    "zipfile",
    "pathlib",
    "shutil",
    "smtplib",
    "calendar",
    "pprint",
    "fractions",
    "statistics",
    "heapq",
    "ftplib",
    "imaplib",
    "mailbox",
    "inspect",
    "subprocess",
    "threading",
    "tempfile",
    "gzip",
    "pdb",
    "tokenize",
    "urllib.parse",
    "http.server",
    "plistlib",
    "ast",
    "dataclasses",
    "enum",
    "functools",
    "typing",
    "uuid",
    "ipaddress",
    "random",
    "locale",
    "pickle",
    "_pyio",
)
PROXY_MODULES = ("optparse", "nntplib", "zipimport", "trace")
TRAINABLE = ("q_proj", "k_proj", "v_proj", "o_proj")
TASKS = ("repeat", "continue")


def training_sequences(tokenizer, modules, prompt_tokens: int, answer_tokens: int, tasks=TASKS) -> list[dict]:
    """
    One sequence per module and task: `build_prompt`'s chat prompt of `prompt_tokens` source tokens followed by
    `answer_tokens` tokens of its known answer (`repeat`: the text itself; `continue`: the module's next tokens).
    Returns dicts with `input_ids` (`[T]`), `boundary` (the prompt length) and `name`. A module too short for a
    prompt and its answer is left out.
    """
    from rift_hf.prompts import build_prompt, source_text

    items = []
    for module in modules:
        ids = tokenizer(source_text(module), add_special_tokens=False)["input_ids"]
        if len(ids) < prompt_tokens + answer_tokens:
            continue
        for task in tasks:
            prompt = build_prompt(tokenizer, module, task, prompt_tokens)
            answer = ids[prompt_tokens : prompt_tokens + answer_tokens] if task == "continue" else ids[:answer_tokens]
            sequence = torch.cat([prompt.input_ids[0], torch.tensor(answer, dtype=prompt.input_ids.dtype)])
            items.append({"input_ids": sequence, "boundary": prompt.tokens, "name": prompt.name})
    if not items:
        raise ValueError(f"No module is {prompt_tokens + answer_tokens} tokens long; lower prompt or answer tokens.")
    return items


@torch.no_grad()
def proxy_agreement(draft, items, top_k, configs: dict[str, dict | None]) -> dict[str, float]:
    """
    Teacher-forced agreement with the target: per named cache config (None: the full cache), the share of answer
    positions (after each item's `boundary`) where the drafter's argmax equals the target's (`top_k`'s first index).
    """
    from rift_hf.training.masks import compressed_attention_masks, masked_attention

    was_training = draft.training
    draft.eval()
    hits = {name: 0 for name in configs}
    total = 0
    for item, (indices, _) in zip(items, top_k, strict=True):
        ids, boundary = item["input_ids"][None].to(draft.device), item["boundary"]
        target = indices[boundary:, 0].to(draft.device)
        total += target.numel()
        for name, config in configs.items():
            masks = None if config is None else compressed_attention_masks(draft, ids, boundary, config)
            with masked_attention(masks):
                logits = draft(ids).logits[0, boundary:]
            hits[name] += int((logits.argmax(-1) == target).sum())
    draft.train(was_training)
    return {name: hits[name] / total for name in configs}


def replay_summary(run_dir: Path, policies, compressions) -> dict:
    """
    `{"full": ..., "<policy> <c>x": ...}` from a replay folder's rows: mean AL, mean per-prompt retention with its
    min/max, per regime (`by_task`) and over all prompts; `prompts` names the prompts measured.
    """
    rows = {}
    for compression in compressions:
        path = Path(run_dir) / f"{compression:g}x" / "rows.jsonl"
        for line in path.read_text().splitlines():
            row = json.loads(line)
            label = row["policy"] if row["policy"] == "full" else f"{row['policy']} {compression:g}x"
            if row["policy"] == "full" or row["policy"] in policies:
                rows.setdefault(label, {})[row["prompt"]] = row
    full = rows["full"]

    def stats(selected: list[dict]) -> dict:
        retention = [r["al"] / full[r["prompt"]]["al"] for r in selected]
        return {
            "al": statistics.mean(r["al"] for r in selected),
            "retention": statistics.mean(retention),
            "retention_min": min(retention),
            "retention_max": max(retention),
            "prompts": len(selected),
        }

    out = {}
    for label, by_prompt in rows.items():
        selected = [r for name, r in by_prompt.items() if name in full]
        tasks = sorted({r["task"] for r in selected})
        out[label] = {
            **stats(selected),
            "by_task": {task: stats([r for r in selected if r["task"] == task]) for task in tasks},
            "per_prompt": {r["prompt"]: r["al"] for r in selected},
        }
    return out


def evaluation_record(evaluation: Experiment, before_dir: Path, after_dir: Path, **notes) -> dict:
    """The `eval` entry of a recipe's `eval.json`: how the drafter was replayed before and after (`notes` added)."""
    return {
        "method": "replay",
        **{name: getattr(evaluation, name) for name in ("input_tokens", "new_tokens", "per_task", "gamma", "window")},
        "before_dir": str(before_dir),
        "after_dir": str(after_dir),
        **notes,
    }


def checked_run(preset: str, compressions) -> list[float]:
    """A real preset's name and the evaluated compressions, sorted; a ValueError naming the fix otherwise."""
    from rift_hf.models import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"Unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}.")
    compressions = sorted(float(c) for c in compressions)
    if not compressions or compressions[0] <= 1:
        raise ValueError(f"`compressions` must be numbers > 1 (4 keeps a quarter), got {compressions}.")
    return compressions


class _Sequences(torch.utils.data.Dataset):
    def __init__(self, items, teacher_top_k=None, future=None):
        self.items = items
        self.teacher_top_k = teacher_top_k
        self.future = future

    def __len__(self):
        return len(self.items)

    def __getitem__(self, index):
        item = {"input_ids": self.items[index]["input_ids"], "boundary": self.items[index]["boundary"]}
        if self.teacher_top_k is not None:
            item["teacher_top_k_indices"], item["teacher_top_k_log_probs"] = self.teacher_top_k[index]
        if self.future is not None:
            item["future_attention"] = self.future[index]
        return item


def run(
    preset: str,
    steps: int,
    out: Path,
    *,
    policy: str = "rift-stat",
    compressions=(4.0, 8.0),
    learning_rate: float = 2e-5,
    teacher: str = "target",
    top_k: int = 64,
    prompt_tokens: int = 768,
    answer_tokens: int = 256,
    unmasked_rate: float = 0.25,
    alignment_weight: float = 0.0,
    window: int = 64,
    delta: int = 128,
    eval_input_tokens: int = 4096,
    eval_new_tokens: int = 512,
    eval_per_task: int = 8,
    gamma: int = 11,
    replay: bool = True,
    before_dir: Path | None = None,
    after_dir: Path | None = None,
    targets_dir: Path = TARGETS,
    save_steps: int = 20,
) -> dict:
    """Evaluate, distil for `policy` at budgets between the `compressions`, evaluate again; write `out`."""
    from safetensors.torch import load_model as load_safetensors_model
    from transformers import AutoTokenizer, TrainerState, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    from lab.replay_runs import replay_compare
    from rift_hf.attention import use_rift_attention
    from rift_hf.models import PRESETS, ensure_local, load_model
    from rift_hf.training.distill import CompressionSampler, RiftDistillationTrainer, teacher_top_k
    from rift_hf.training.selection import alignment_loss, captured_attention, future_attention, selection_recall

    tick = time.perf_counter()
    compressions = checked_run(preset, compressions)
    if teacher not in ("self", "target"):
        raise ValueError(f"`teacher` must be 'self' (the drafter's full-context logits) or 'target', got {teacher!r}.")
    if not RiftConfig(policy=policy).policy_type.compresses:  # an unknown policy fails here too, before any work
        raise ValueError(f"`policy` must be a compressing policy to train for, got {policy!r}.")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    target_spec, draft_spec = PRESETS[preset]
    tokenizer = AutoTokenizer.from_pretrained(ensure_local(target_spec))
    train_items = training_sequences(tokenizer, TRAIN_MODULES, prompt_tokens, answer_tokens)
    proxy_items = training_sequences(tokenizer, PROXY_MODULES, prompt_tokens, answer_tokens)
    target = load_model(target_spec, torch.bfloat16)
    # Target top-1 for the proxy always; the training teacher's top-k when the target teaches.
    proxy_sequences = [i["input_ids"] for i in proxy_items]
    proxy_top = teacher_top_k(target, proxy_sequences, top_k, out / f"proxy-top{top_k}.safetensors")
    train_top = None
    if teacher == "target":
        sequences = [i["input_ids"] for i in train_items]
        train_top = teacher_top_k(target, sequences, top_k, out / f"teacher-top{top_k}.safetensors")
    del target
    # The drafter trains in fp32: bf16 weights would round most small updates away.
    draft = load_model(draft_spec, torch.float32)
    generation = copy.deepcopy(draft.generation_config)  # replay fixes the draft length on it; saved as loaded
    evaluated = {"full": None} | {
        f"{policy} {c:g}x": policy_settings(policy, {"budget": 1.0 / c, "window": window, "delta": delta})
        for c in compressions
    }

    # Selection alignment: where the untrained drafter's answer tokens attend, per sequence (training and proxy).
    shape = RiftConfig(policy=policy, window=window)
    use_rift_attention(draft, shape)
    proxy_future = future_attention(draft, proxy_items, window, shape.n_sink, out / "proxy-future.safetensors")
    train_future = None
    if alignment_weight:
        train_future = future_attention(draft, train_items, window, shape.n_sink, out / "future.safetensors")

    def proxy() -> dict:
        agreement = proxy_agreement(draft, proxy_items, proxy_top, evaluated)
        result = {name: {"agreement": a, "retention": a / agreement["full"]} for name, a in agreement.items()}
        # Where the selection points: the alignment loss, and the share of the answer's attention (untrained drafter,
        # full cache) on what rift-stat's prefill selection keeps at each compression, per regime.
        losses, recall = [], {}
        with torch.no_grad():
            for item, future in zip(proxy_items, proxy_future, strict=True):
                boundary = item["boundary"]
                with captured_attention() as captured:
                    draft(item["input_ids"][None].to(draft.device))
                losses.append(float(alignment_loss(captured, future, boundary, window, shape.n_sink,
                                                   shape.pool, shape.pool_kernel)))  # fmt: skip
                for c in compressions:
                    count = int(boundary / c) // 2
                    kept = selection_recall(captured, future, boundary, count, window, shape.pool, shape.pool_kernel)
                    recall.setdefault(f"{c:g}x", {}).setdefault(item["name"].split(":")[0], []).append(kept)
        result["full"]["alignment_loss"] = statistics.mean(losses)
        result["full"]["selection_recall"] = {
            c: {task: statistics.mean(v) for task, v in by_task.items()} for c, by_task in recall.items()
        }
        return result

    evaluation = Experiment(preset, ("full", policy), eval_input_tokens, eval_new_tokens, eval_per_task, gamma=gamma,
                            window=window, delta=delta, name="training")  # fmt: skip

    def replayed(folder: Path) -> dict | None:
        if not replay:
            return None
        replay_compare(evaluation, compressions, folder, targets_dir=targets_dir, models=(None, draft, tokenizer))
        return replay_summary(folder, [policy], compressions)

    proxy_before = proxy()
    before_dir = Path(before_dir) if before_dir is not None else out / "replay-before"
    before = replayed(before_dir)

    teacher_model = copy.deepcopy(draft) if teacher == "self" else None
    for name, parameter in draft.named_parameters():
        parameter.requires_grad_(name.rsplit(".", 2)[-2] in TRAINABLE)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    sampler = CompressionSampler(
        budget=(1.0 / compressions[-1], 1.0 / compressions[0]),
        policies=(policy,),
        unmasked_rate=unmasked_rate,
        overrides={"window": window, "delta": delta},
    )
    checkpoints = out / "trainer"
    args = TrainingArguments(
        output_dir=str(checkpoints),
        per_device_train_batch_size=1,
        max_steps=steps,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(),
        save_strategy="steps",
        save_steps=save_steps,
        save_total_limit=1,
        save_only_model=False,
        bf16=False,
        seed=0,
    )
    trainer = RiftDistillationTrainer(
        model=draft,
        args=args,
        train_dataset=_Sequences(train_items, train_top, train_future),
        sampler=sampler,
        teacher=teacher_model,
        alignment_weight=alignment_weight,
    )
    resume = any(checkpoints.glob("checkpoint-*"))
    # A resumed run carries the training time and alignment log of the steps trained before (eval.json of the last
    # invocation, written when it finished), so the card describes the whole run, not the last leg.
    earlier = {"train_seconds": 0.0, "alignment_log": [], "legs": []}
    if resume and (out / "eval.json").is_file():
        previous = json.loads((out / "eval.json").read_text())
        legs = previous.get("legs") or [{"steps": previous["steps"], "train_seconds": previous["train_seconds"]}]
        earlier = {
            "train_seconds": sum(leg["train_seconds"] for leg in legs),
            "alignment_log": previous.get("alignment_log") or [],
            "legs": legs,
        }
    train_tick = time.perf_counter()
    last = get_last_checkpoint(str(checkpoints)) if resume else None
    saved = TrainerState.load_from_json(str(Path(last) / "trainer_state.json")) if last else None
    if saved is not None and saved.global_step >= steps:
        # `Trainer.train` would take one more step even when resuming at `max_steps`; evaluate the checkpoint as is.
        load_safetensors_model(draft, str(Path(last) / "model.safetensors"))
        trainer.state = saved
    else:
        trainer.train(resume_from_checkpoint=resume or None)
    leg_seconds = time.perf_counter() - train_tick
    train_seconds = earlier["train_seconds"] + leg_seconds
    legs = earlier["legs"] + [{"steps": trainer.state.global_step, "train_seconds": leg_seconds}]
    draft.eval()
    for parameter in draft.parameters():
        parameter.requires_grad_(False)
    proxy_after = proxy()
    after_dir = Path(after_dir) if after_dir is not None else out / "replay-after"
    after = replayed(after_dir)

    seq_tokens = round(statistics.mean(len(i["input_ids"]) for i in train_items))
    recommended = {"policy": policy, "budget": 1.0 / compressions[0], "window": window}
    # The generation config stays plain transformers (a drafter must load and draft anywhere); the recommended
    # RiftConfig goes into its own file, which rift reads with RiftConfig.from_pretrained.
    draft.generation_config = generation
    draft.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    RiftConfig.from_dict(recommended).save_pretrained(out / "model")
    result = {
        "preset": preset,
        "base_model": draft_spec.upstream,
        "teacher": target_spec.upstream if teacher == "target" else "self (frozen full-context drafter)",
        "teacher_top_k": top_k if teacher == "target" else None,
        "policy": policy,
        "compressions": compressions,
        "steps": trainer.state.global_step,
        "sequences": len(train_items),
        "seq_tokens": seq_tokens,
        "tokens_seen": trainer.state.global_step * seq_tokens,
        "prompt_tokens": prompt_tokens,
        "answer_tokens": answer_tokens,
        "unmasked_rate": unmasked_rate,
        "alignment_weight": alignment_weight,
        "alignment_log": earlier["alignment_log"] + trainer.alignment_log,
        "trainable_parameters": trainable,
        "learning_rate": learning_rate,
        "train_seconds": train_seconds,
        "legs": legs,  # each invocation: the step it reached and its training seconds
        "total_seconds": time.perf_counter() - tick,
        "train_modules": [m for m in TRAIN_MODULES if any(i["name"].endswith(f":{m}") for i in train_items)],
        "proxy_modules": list(PROXY_MODULES),
        "eval": evaluation_record(evaluation, before_dir, after_dir),
        "gamma": gamma,
        "window": window,
        "recommended_config": recommended,
        "proxy_before": proxy_before,
        "proxy_after": proxy_after,
        "before": before,
        "after": after,
        "loss_log": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "machine": machine(),
        "dtype": "float32 (drafter, training and replay); target bfloat16",
        "date": datetime.date.today().isoformat(),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
