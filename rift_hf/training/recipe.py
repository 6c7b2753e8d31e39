"""The whole compressibility recipe on a real preset: evaluate, distil, evaluate again, write a Hub-ready folder.

    rift-hf train --preset qwen-coder --steps 40 --out ~/.cache/rift-hf/trained/qwen-coder-rift

Training text and evaluation prompts come from disjoint sets of standard-library modules (`TRAIN_MODULES` versus
`rift_hf.prompts.MODULES`). The teacher is either the drafter's own full-context logits from a frozen copy
(`teacher="self"`, self-distillation: draft under compression what the uncompressed drafter would) or the target's
(`teacher="target"`, the tokens the drafter is judged against), whose top-k log-probabilities are computed once and
kept in `<out>/teacher-top<k>.safetensors`. Only the attention projections are trained (partial fine-tuning), which
keeps a CPU run to minutes.
"""

from __future__ import annotations

import copy
import datetime
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..config import RiftConfig

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
    "bisect",
    "string",
    "glob",
    "fnmatch",
    "copy",
)
TRAINABLE = ("q_proj", "k_proj", "v_proj", "o_proj")


def acceptance_lengths(target, draft, prompts, configs: dict[str, dict], new_tokens: int, gamma: int) -> dict:
    """AL per named cache config on every prompt (γ fixed, constant schedule, threshold 0)."""
    import rift_hf

    from ..models import fix_draft_length

    fix_draft_length(draft, gamma=gamma)
    out = {name: [] for name in configs}
    for prompt in tqdm(prompts, desc="evaluate"):
        for name, config in configs.items():
            with torch.no_grad():
                target.generate(
                    prompt.input_ids.to(target.device),
                    assistant_model=draft,
                    max_new_tokens=new_tokens,
                    min_new_tokens=new_tokens,
                    do_sample=False,
                    cache_implementation="rift",
                    cache_config=config,
                )
            out[name].append(rift_hf.last_stats(target).acceptance_length)
    return out


def _summarise(als: dict[str, list[float]]) -> dict:
    full = als["full"]
    rows = {}
    for name, values in als.items():
        retention = [v / f for v, f in zip(values, full, strict=True)]
        rows[name] = {
            "al": statistics.mean(values),
            "retention": statistics.mean(retention),
            "retention_min": min(retention),
            "retention_max": max(retention),
            "per_prompt": values,
        }
    return rows


class _Sequences(torch.utils.data.Dataset):
    def __init__(self, sequences, teacher_top_k=None):
        self.sequences = sequences
        self.teacher_top_k = teacher_top_k

    def __len__(self):
        return len(self.sequences)

    def __getitem__(self, index):
        item = {"input_ids": self.sequences[index]}
        if self.teacher_top_k is not None:
            item["teacher_top_k_indices"], item["teacher_top_k_log_probs"] = self.teacher_top_k[index]
        return item


def run(
    preset: str,
    steps: int,
    seq_tokens: int,
    eval_prompts: int,
    eval_tokens: int,
    new_tokens: int,
    gamma: int,
    learning_rate: float,
    out: Path,
    window: int = 32,
    teacher: str = "self",
    top_k: int = 64,
) -> dict:
    from transformers import AutoTokenizer, TrainingArguments

    from ..models import PRESETS, ensure_local, load_model
    from ..prompts import build_prompt, prompt_set
    from .distill import CompressionSampler, RiftDistillationTrainer, teacher_top_k

    tick = time.perf_counter()
    if preset not in PRESETS:
        raise ValueError(f"Unknown model preset {preset!r}; choose one of {', '.join(PRESETS)}.")
    if teacher not in ("self", "target"):
        raise ValueError(f"`teacher` must be 'self' (the drafter's full-context logits) or 'target', got {teacher!r}.")
    target_spec, draft_spec = PRESETS[preset]
    target = load_model(target_spec, torch.bfloat16)
    # The drafter trains in fp32: bf16 weights would round most small updates away.
    draft = load_model(draft_spec, torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(ensure_local(target_spec))
    held_out = prompt_set(tokenizer, eval_tokens, eval_prompts, tasks=("continue",))
    configs = {
        "full": {"policy": "full"},
        "rift-stat 4x": {"policy": "rift-stat", "budget": 0.25, "window": window},
        "rift-stat 8x": {"policy": "rift-stat", "budget": 0.125, "window": window},
    }
    before = _summarise(acceptance_lengths(target, draft, held_out, configs, new_tokens, gamma))

    sequences = [build_prompt(tokenizer, module, "continue", seq_tokens).input_ids[0] for module in TRAIN_MODULES]
    if teacher == "target":
        teacher_model, top = None, teacher_top_k(target, sequences, top_k, out / f"teacher-top{top_k}.safetensors")
    else:
        teacher_model, top = copy.deepcopy(draft), None
    for name, parameter in draft.named_parameters():
        parameter.requires_grad_(name.rsplit(".", 2)[-2] in TRAINABLE)
    trainable = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    sampler = CompressionSampler(
        boundary=(0.6, 0.8),
        budget=(0.125, 0.25),
        policies=("rift-stat", "swa"),
        unmasked_rate=0.25,
        overrides={"window": window},
    )
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=1,
        max_steps=steps,
        learning_rate=learning_rate,
        lr_scheduler_type="constant",
        logging_steps=1,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=not torch.cuda.is_available(),
        save_strategy="no",
        bf16=False,
    )
    trainer = RiftDistillationTrainer(
        model=draft, args=args, train_dataset=_Sequences(sequences, top), sampler=sampler, teacher=teacher_model
    )
    train_tick = time.perf_counter()
    trainer.train()
    train_seconds = time.perf_counter() - train_tick
    draft.eval()
    after = _summarise(acceptance_lengths(target, draft, held_out, configs, new_tokens, gamma))

    recommended = {"policy": "rift-stat", "budget": 0.25, "window": window}
    out.mkdir(parents=True, exist_ok=True)
    # The generation config stays plain transformers (a drafter must load and draft anywhere); the recommended
    # RiftConfig goes into its own file, which rift reads with RiftConfig.from_pretrained.
    draft.save_pretrained(out / "model")
    tokenizer.save_pretrained(out / "model")
    RiftConfig.from_dict(recommended).save_pretrained(out / "model")
    result = {
        "preset": preset,
        "base_model": draft_spec.upstream,
        "teacher": target_spec.upstream if teacher == "target" else "self (frozen full-context drafter)",
        "teacher_top_k": top_k if teacher == "target" else None,
        "steps": steps,
        "sequences": len(sequences),
        "tokens_seen": steps * seq_tokens,
        "seq_tokens": seq_tokens,
        "trainable_parameters": trainable,
        "learning_rate": learning_rate,
        "train_seconds": train_seconds,
        "total_seconds": time.perf_counter() - tick,
        "train_modules": TRAIN_MODULES,
        "eval_modules": [p.name for p in held_out],
        "eval_tokens": [p.tokens for p in held_out],
        "new_tokens": new_tokens,
        "gamma": gamma,
        "window": window,
        "recommended_config": recommended,
        "before": before,
        "after": after,
        "loss_log": [e["loss"] for e in trainer.state.log_history if "loss" in e],
        "machine": f"{platform.machine()}, {torch.get_num_threads()} threads (CPU)"
        if not torch.cuda.is_available()
        else torch.cuda.get_device_name(),
        "dtype": str(draft.dtype).split(".")[-1],
        "date": datetime.date.today().isoformat(),
    }
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    return result
