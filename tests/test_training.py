"""Compressibility training: masks equal inference with the compressed cache; distillation lowers the loss."""

import copy

import pytest
import torch
from transformers import TrainingArguments

from rift_hf import POLICIES, RiftCache
from rift_hf.config import policy_settings
from rift_hf.training import (
    CompressionSampler,
    RiftDistillationTrainer,
    compressed_attention_masks,
    distillation_loss,
    masked_attention,
)
from tiny import make_prompt, tiny_model

CONFIG = {
    "budget": 16,
    "window": 4,
    "delta": 4,
    "block_size": 4,
    "n_sink": 1,
    "a_min": 4,
    "a_max": 8,
    "check_interval": 2,
    "drift_threshold": 0.01,
}


@pytest.mark.parametrize("policy", [p for p in POLICIES if p != "full"])
@pytest.mark.parametrize("arch", ["llama", "gemma3", "gpt_oss", "qwen3_5"])
def test_masked_forward_equals_inference_with_the_compressed_cache(arch, policy):
    model = tiny_model(arch, seed=3, attn="rift")
    ids, boundary = make_prompt(48, seed=4), 30
    config = policy_settings(policy, CONFIG)
    masks = compressed_attention_masks(model, ids, boundary, config)
    with torch.no_grad():
        cache = RiftCache(model.config, config)
        steps = [model(ids[:, :boundary], past_key_values=cache, use_cache=True).logits[0, -1]]
        for t in range(boundary, ids.shape[1]):
            steps.append(model(ids[:, t : t + 1], past_key_values=cache, use_cache=True).logits[0, -1])
        with masked_attention(masks):
            full = model(ids).logits[0, boundary - 1 :]
    torch.testing.assert_close(torch.stack(steps), full, atol=1e-5, rtol=1e-4)
    for mask in masks.values():
        visible = mask[0, :, boundary:].sum(-1)  # per head and position after the boundary
        assert int(visible.max()) <= 17 and int(visible.min()) >= 1
        assert bool(
            mask[0, :, :boundary].equal(
                torch.ones(boundary, 48, dtype=torch.bool).tril().expand_as(mask[0, :, :boundary])
            )
        )


def test_sampler_validates_and_mixes_unmasked_steps():
    with pytest.raises(ValueError, match="range"):
        CompressionSampler(budget=(0.3, 0.1))
    with pytest.raises(ValueError, match="choose one of"):
        CompressionSampler(policies=("h2o",))
    sampler = CompressionSampler(unmasked_rate=0.5, overrides={"window": 4}, seed=1)
    shapes = [sampler.sample() for _ in range(200)]
    unmasked = sum(config is None for _, config in shapes)
    assert 60 < unmasked < 140
    assert all(0.5 <= b <= 0.8 for b, _ in shapes)
    assert {c.policy for _, c in shapes if c is not None} == set(sampler.policies)


class _Sequences(torch.utils.data.Dataset):
    def __init__(self, n, length):
        self.items = [make_prompt(length, seed=100 + i)[0] for i in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return {"input_ids": self.items[i]}


def test_a_few_trainer_steps_lower_the_distillation_loss(tmp_path):
    student = tiny_model("llama", seed=5, attn="rift")
    teacher = copy.deepcopy(student)  # self-distillation against the frozen full-context drafter
    sampler = CompressionSampler(
        boundary=(0.6, 0.6), budget=(0.25, 0.25), policies=("rift-stat",), unmasked_rate=0.0, overrides={"window": 4}
    )
    data = _Sequences(4, 40)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=2,
        max_steps=12,
        learning_rate=3e-3,
        logging_steps=1,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=True,
        save_strategy="no",
    )

    def evaluate_loss():
        _, config = sampler.current
        losses = []
        for item in data.items:
            ids = item[None]
            masks = compressed_attention_masks(student, ids, 24, config)
            with torch.no_grad():
                target = teacher(ids).logits[0]  # full context: outside the masked block
                with masked_attention(masks):
                    losses.append(distillation_loss(student(ids).logits[0], target, 24))
        return float(torch.stack(losses).mean())

    sampler.sample()
    before = evaluate_loss()
    trainer = RiftDistillationTrainer(model=student, args=args, train_dataset=data, sampler=sampler, teacher=teacher)
    trainer.train()
    after = evaluate_loss()
    assert before > 0 and after < 0.8 * before, (before, after)
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 12


def test_top_k_teacher_is_cached_on_disk_and_matches_dense_kl_at_full_k(tmp_path):
    from rift_hf.training import teacher_top_k
    from tiny import VOCAB

    teacher = tiny_model("llama", seed=9)
    data = _Sequences(3, 24)
    path = tmp_path / "teacher.safetensors"
    pairs = teacher_top_k(teacher, data.items, 8, path)
    assert path.exists() and [p[0].shape for p in pairs] == [(24, 8)] * 3

    calls = []
    teacher.register_forward_hook(lambda *_: calls.append(1))
    again = teacher_top_k(teacher, data.items, 8, path)  # read back: no forward
    assert not calls
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(pairs, again, strict=True))
    teacher_top_k(teacher, data.items[:2], 8, path)  # other sequences: recomputed
    assert len(calls) == 2

    student = tiny_model("llama", seed=5)(data.items[0][None]).logits[0].detach()
    dense = teacher(data.items[0][None]).logits[0].detach()
    everything = teacher_top_k(teacher, data.items[:1], VOCAB)[0]
    torch.testing.assert_close(
        distillation_loss(student, everything, 10), distillation_loss(student, dense, 10), atol=2e-3, rtol=2e-3
    )
    with pytest.raises(ValueError, match="positive int"):
        teacher_top_k(teacher, data.items, 0)
    with pytest.raises(ValueError, match="tokenizer"):
        distillation_loss(student[:, :10], everything, 10)
    with pytest.raises(ValueError, match="vocabulary"):
        distillation_loss(student, dense[:, :10], 10)


def test_trainer_distils_from_a_cached_top_k_target_teacher(tmp_path):
    from rift_hf.training import teacher_top_k

    student, target = tiny_model("llama", seed=5, attn="rift"), tiny_model("llama", seed=9)
    data = _Sequences(4, 40)
    pairs = teacher_top_k(target, data.items, 16, tmp_path / "top.safetensors")

    class WithTeacher(torch.utils.data.Dataset):
        def __len__(self):
            return len(data.items)

        def __getitem__(self, i):
            indices, log_probs = pairs[i]
            return {"input_ids": data.items[i], "teacher_top_k_indices": indices, "teacher_top_k_log_probs": log_probs}

    sampler = CompressionSampler(
        boundary=(0.6, 0.6), budget=(0.25, 0.25), policies=("rift-stat",), unmasked_rate=0.0, overrides={"window": 4}
    )
    sampler.sample()

    def loss():
        _, config = sampler.current
        total = 0.0
        for item, pair in zip(data.items, pairs, strict=True):
            masks = compressed_attention_masks(student, item[None], 24, config)
            with torch.no_grad(), masked_attention(masks):
                total += float(distillation_loss(student(item[None]).logits[0], pair, 24))
        return total / len(pairs)

    before = loss()
    args = TrainingArguments(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=2,
        max_steps=12,
        learning_rate=3e-3,
        report_to=[],
        remove_unused_columns=False,
        use_cpu=True,
        save_strategy="no",
    )
    RiftDistillationTrainer(model=student, args=args, train_dataset=WithTeacher(), sampler=sampler).train()
    assert loss() < 0.8 * before


@pytest.mark.parametrize("policy", ["swa", "snapkv", "rift-stat", "rift-stat-block", "rift-dyn"])
@pytest.mark.parametrize("arch", ["llama", "qwen3_5"])
def test_fast_masks_equal_the_forward_per_position(arch, policy):
    model = tiny_model(arch, seed=6, attn="rift")
    ids = make_prompt(56, seed=7)
    config = policy_settings(policy, CONFIG)
    fast = compressed_attention_masks(model, ids, 33, config)
    slow = compressed_attention_masks(model, ids, 33, config, fast=False)
    assert fast.keys() == slow.keys()
    for index, mask in fast.items():
        assert bool(mask.equal(slow[index])), index


def pointed_at(like: torch.Tensor, position: int) -> torch.Tensor:
    pointed = torch.zeros_like(like)
    pointed[..., position] = 1.0
    return pointed


def test_alignment_window_scores_are_the_policys_scores_and_the_loss_is_zero_on_its_own_target():
    from rift_hf.kernels.reference import window_attention_scores
    from rift_hf.training.selection import alignment_loss, captured_attention, future_attention, window_scores

    torch.manual_seed(0)
    query, key = torch.randn(1, 4, 6, 8), torch.randn(1, 2, 30, 8)
    assert torch.allclose(window_scores(query, key, 0.3), window_attention_scores(query, key, 0.3), atol=1e-6)

    model = tiny_model("llama", seed=3, attn="rift")
    ids = make_prompt(48, seed=7)[0]
    item = {"input_ids": ids, "boundary": 32}
    (future,) = future_attention(model, [item], window=4, n_sink=1)
    layers = model.config.num_hidden_layers
    assert future.shape == (layers, model.config.num_key_value_heads, 32)
    assert torch.allclose(future.sum(-1), torch.ones(future.shape[:2]))
    assert future[..., :1].abs().sum() == 0 and future[..., 28:].abs().sum() == 0
    with torch.no_grad(), captured_attention() as captured:
        model(ids[None])
    # The window's own scores, as a target, give KL 0; a target the window does not share, a large one.
    own = []
    for index in sorted(captured):
        q, k, scale = captured[index]
        scores = window_scores(q[:, :, 28:32], k[:, :, :32], scale)[0]
        from rift_hf.kernels.reference import pool_scores

        scores = pool_scores(scores, 5, "avg")
        scores[:, :1] = 0
        scores[:, 28:] = 0
        own.append(scores / scores.sum(-1, keepdim=True))
    assert float(alignment_loss(captured, torch.stack(own), 32, 4, 1)) < 1e-5
    # Recall of the window's own scores: the mass of its own top positions among [0, P - count).
    from rift_hf.training.selection import selection_recall

    own = torch.stack(own)
    expected = own[..., :24].topk(8, dim=-1).values.sum(-1).mean()
    assert abs(selection_recall(captured, own, 32, 8, 4) - float(expected)) < 1e-5
    assert selection_recall(captured, pointed_at(own, 30), 32, 8, 4) == 0.0  # a position the selection cannot take
    assert float(alignment_loss(captured, pointed_at(future, 5), 32, 4, 1)) > 1.0


def test_trainer_with_selection_alignment_lowers_the_alignment_loss():
    from rift_hf.training.selection import alignment_loss, captured_attention, future_attention

    student = tiny_model("llama", seed=5, attn="rift")
    teacher = copy.deepcopy(student)
    sampler = CompressionSampler(budget=(0.25, 0.25), policies=("rift-stat",), unmasked_rate=0.0,
                                 overrides={"window": 4, "n_sink": 1})  # fmt: skip
    items = [{"input_ids": make_prompt(48, seed=200 + i)[0], "boundary": 32} for i in range(4)]
    future = future_attention(student, items, window=4, n_sink=1)

    class Data(torch.utils.data.Dataset):
        def __len__(self):
            return len(items)

        def __getitem__(self, i):
            return {"input_ids": items[i]["input_ids"], "boundary": 32, "future_attention": future[i]}

    def mean_alignment():
        with torch.no_grad():
            values = []
            for item, target in zip(items, future, strict=True):
                with captured_attention() as captured:
                    student(item["input_ids"][None])
                values.append(float(alignment_loss(captured, target, 32, 4, 1)))
            return sum(values) / len(values)

    before = mean_alignment()
    args = TrainingArguments(output_dir="/tmp/rift-align-test", per_device_train_batch_size=1, max_steps=16,
                             learning_rate=3e-3, logging_steps=1, report_to=[], remove_unused_columns=False,
                             use_cpu=True, save_strategy="no")  # fmt: skip
    trainer = RiftDistillationTrainer(model=student, args=args, train_dataset=Data(), sampler=sampler,
                                      teacher=teacher, alignment_weight=1.0)  # fmt: skip
    trainer.train()
    assert len(trainer.alignment_log) == 16
    after = mean_alignment()
    assert after < 0.7 * before, (before, after)
    with pytest.raises(ValueError, match="alignment_weight"):
        RiftDistillationTrainer(model=student, args=args, train_dataset=Data(), sampler=sampler, alignment_weight=-1)
