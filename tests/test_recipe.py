"""The training recipe's pieces: task-shaped sequences, the per-sequence boundary, the proxy, replay summaries."""

import json

import pytest
import torch
from transformers import TrainingArguments

from lab.recipe import proxy_agreement, replay_summary, training_sequences
from rift_hf.models import ByteTokenizer
from rift_hf.prompts import source_text
from rift_hf.training import CompressionSampler, RiftDistillationTrainer, compressed_attention_masks, teacher_top_k
from rift_hf.training.distill import distillation_loss
from rift_hf.training.masks import masked_attention
from tiny import make_prompt, tiny_model


def test_training_sequences_are_a_prompt_then_its_known_answer():
    tokenizer = ByteTokenizer()
    items = training_sequences(tokenizer, ["textwrap", "bisect"], prompt_tokens=3000, answer_tokens=1000)
    source = list(source_text("textwrap").encode())
    assert len(source_text("bisect").encode()) < 4000  # too short for a prompt and its answer: left out
    assert [i["name"] for i in items] == ["repeat:textwrap", "continue:textwrap"]
    for item in items:
        answer = item["input_ids"][item["boundary"] :].tolist()
        assert len(answer) == 1000
        task = item["name"].split(":")[0]
        assert answer == (source[:1000] if task == "repeat" else source[3000:4000])
        prompt = bytes(item["input_ids"][: item["boundary"]].tolist()).decode()
        assert prompt.endswith(bytes(source[:3000]).decode()) == (task == "continue")
    with pytest.raises(ValueError, match="lower"):
        training_sequences(tokenizer, ["bisect"], 3000, 1000)


def test_a_sequence_boundary_overrides_the_sampled_fraction(tmp_path):
    model = tiny_model("llama", seed=5, attn="rift")
    teacher = tiny_model("llama", seed=9)
    ids = make_prompt(40, seed=3)
    sampler = CompressionSampler(
        boundary=(0.6, 0.6), budget=(0.25, 0.25), policies=("rift-stat",), unmasked_rate=0.0, overrides={"window": 4}
    )
    _, config = sampler.sample()
    args = TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True, remove_unused_columns=False)
    trainer = RiftDistillationTrainer(model=model, args=args, train_dataset=[], sampler=sampler, teacher=teacher)

    def expected(boundary):
        masks = compressed_attention_masks(model, ids, boundary, config)
        with torch.no_grad(), masked_attention(masks):
            return float(distillation_loss(model(ids).logits[0], teacher(ids).logits[0], boundary))

    with torch.no_grad():
        sampled = float(trainer.compute_loss(model, {"input_ids": ids}))
        given = float(trainer.compute_loss(model, {"input_ids": ids, "boundary": torch.tensor([30])}))
    assert sampled == pytest.approx(expected(24), rel=1e-5)
    assert given == pytest.approx(expected(30), rel=1e-5) and given != pytest.approx(sampled)


def test_proxy_agreement_counts_argmax_matches_after_the_boundary():
    draft = tiny_model("llama", seed=5, attn="rift")
    items = [{"input_ids": make_prompt(48, seed=s)[0], "boundary": 30} for s in (1, 2)]
    own = teacher_top_k(draft, [i["input_ids"] for i in items], 4)  # the drafter's own argmax: full agrees fully
    other = teacher_top_k(tiny_model("llama", seed=9), [i["input_ids"] for i in items], 4)
    configs = {"full": None, "rift-stat": {"policy": "rift-stat", "budget": 12, "window": 4, "n_sink": 1}}
    assert proxy_agreement(draft, items, own, configs)["full"] == 1.0
    got = proxy_agreement(draft, items, other, configs)
    hits = 0
    for item, (indices, _) in zip(items, other, strict=True):
        with torch.no_grad():
            hits += int((draft(item["input_ids"][None]).logits[0, 30:].argmax(-1) == indices[30:, 0]).sum())
    assert got["full"] == pytest.approx(hits / 36)
    assert 0.0 <= got["rift-stat"] <= 1.0 and not draft.training


def test_replay_summary_is_per_prompt_retention_by_regime(tmp_path):
    rows = [
        ("repeat:a", "repeat", "full", 4.0),
        ("repeat:a", "repeat", "rift-stat", 2.0),
        ("repeat:b", "repeat", "full", 5.0),
        ("repeat:b", "repeat", "rift-stat", 4.0),
        ("continue:a", "continue", "full", 3.0),
        ("continue:a", "continue", "rift-stat", 3.0),
        ("continue:a", "continue", "snapkv", 1.0),
    ]
    (tmp_path / "4x").mkdir()
    (tmp_path / "4x" / "rows.jsonl").write_text(
        "".join(json.dumps({"prompt": p, "task": t, "policy": q, "al": al}) + "\n" for p, t, q, al in rows)
    )
    summary = replay_summary(tmp_path, ["rift-stat"], [4.0])
    assert set(summary) == {"full", "rift-stat 4x"}
    stat = summary["rift-stat 4x"]
    assert stat["by_task"]["repeat"]["retention"] == pytest.approx((0.5 + 0.8) / 2)
    assert stat["by_task"]["repeat"]["retention_min"] == 0.5 and stat["by_task"]["continue"]["retention"] == 1.0
    assert stat["retention"] == pytest.approx((0.5 + 0.8 + 1.0) / 3) and stat["prompts"] == 3
    assert summary["full"]["al"] == 4.0
