"""The selection head: a learnt re-weighting of the queries the scorer reads, the drafter untouched."""

import pytest
import torch
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

import rift_hf
from rift_hf import RiftCache, RiftConfig, SelectionHead
from rift_hf.config import policy_settings
from rift_hf.training import head_examples, head_recall, train_selection_head
from rift_hf.training.head import forward_seconds
from rift_hf.training.selection import selection_recall
from tiny import draft_target_pair, make_prompt, tiny_model

SMALL = {"budget": 16, "window": 4, "delta": 4, "n_sink": 1}


def random_head(model, seed: int = 0, spread: float = 1.0) -> SelectionHead:
    head = SelectionHead.for_model(model.config)
    with torch.no_grad():
        head.factors.add_(spread * torch.randn(head.factors.shape, generator=torch.Generator().manual_seed(seed)))
    return head


def rope(x: torch.Tensor, positions: torch.Tensor, dim: int) -> torch.Tensor:
    freqs = 1.0 / (10000 ** (torch.arange(0, dim, 2).float() / dim))
    angles = positions[:, None].float() * freqs[None]
    emb = torch.cat([angles, angles], dim=-1)[None]
    return apply_rotary_pos_emb(x, x, emb.cos(), emb.sin())[0]


def test_the_head_commutes_with_rotary_embeddings_and_starts_as_the_identity():
    head = SelectionHead(2, 4, 16)
    query = torch.randn(1, 4, 6, 16)
    assert torch.equal(head(1, query), query)
    with torch.no_grad():
        head.factors.normal_()
    positions = torch.arange(100, 106)
    # Re-weighting then rotating equals rotating then re-weighting: scores stay a function of relative position.
    assert torch.allclose(head(1, rope(query, positions, 16)), rope(head(1, query), positions, 16), atol=1e-5)
    with pytest.raises(ValueError, match="trained for 4 query heads"):
        head(0, torch.randn(1, 3, 2, 16))
    with pytest.raises(ValueError, match="even"):
        SelectionHead(2, 4, 15)


def test_save_load_round_trip_and_clear_errors(tmp_path):
    head = random_head(tiny_model("llama"))
    path = head.save(tmp_path)
    assert path.name == "selection_head.safetensors"
    assert torch.equal(SelectionHead.load(tmp_path).factors, head.factors)
    with pytest.raises(FileNotFoundError, match="train one"):
        SelectionHead.load(tmp_path / "missing")
    from safetensors.torch import save_file

    save_file({"factors": torch.zeros(2)}, str(tmp_path / "other.safetensors"))
    with pytest.raises(ValueError, match="not a rift selection head"):
        SelectionHead.load(tmp_path / "other.safetensors")


def test_config_validates_and_resolves_a_saved_relative_head(tmp_path):
    with pytest.raises(TypeError, match="selection_head"):
        RiftConfig(policy="rift-stat", selection_head=3)
    for policy in ("full", "swa", "page-retrieval"):
        with pytest.raises(ValueError, match="nothing to act on"):
            RiftConfig(policy=policy, selection_head="head.safetensors")
    random_head(tiny_model("llama")).save(tmp_path)
    RiftConfig(policy="rift-stat", selection_head="selection_head.safetensors").save_pretrained(tmp_path)
    loaded = RiftConfig.from_pretrained(tmp_path)
    assert loaded.selection_head == str(tmp_path / "selection_head.safetensors")


def prefill_selection(model, ids, config):
    cache = RiftCache(model.config, RiftConfig.coerce(config))
    cache.activate_past_recording()
    with torch.no_grad():
        token = model(ids, past_key_values=cache).logits[:, -1:].argmax(-1)
        model(token, position_ids=torch.tensor([[ids.shape[1]]]), past_key_values=cache)
        cache.settle()  # commits: the prompt's first compression selects from its scores
    return [layer.selected.clone() for layer in cache.rift_layers]


def test_an_identity_head_selects_as_plain_scoring_and_a_trained_one_differently(tmp_path):
    model = tiny_model("llama", seed=2, attn="rift")
    ids = make_prompt(40, seed=5)
    config = policy_settings("rift-stat", SMALL)
    plain = prefill_selection(model, ids, config)
    SelectionHead.for_model(model.config).save(tmp_path / "identity.safetensors")
    same = prefill_selection(model, ids, {**config, "selection_head": str(tmp_path / "identity.safetensors")})
    assert all(torch.equal(a, b) for a, b in zip(plain, same, strict=True))
    random_head(model, spread=3.0).save(tmp_path / "random.safetensors")
    moved = prefill_selection(model, ids, {**config, "selection_head": str(tmp_path / "random.safetensors")})
    assert any(not torch.equal(a, b) for a, b in zip(plain, moved, strict=True))


@pytest.mark.parametrize("policy", ["snapkv", "rift-stat", "rift-dyn", "page-round"])
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_assisted_output_with_a_head_equals_target_greedy(tmp_path, arch, policy):
    target, draft = draft_target_pair(arch)
    path = random_head(draft, spread=3.0).save(tmp_path)
    ids = make_prompt(40, seed=3)
    reference = target.generate(ids, max_new_tokens=32, do_sample=False)
    # A head outside any model folder: named by a RiftConfig made in code (a dict may only name one inside the folder)
    config = RiftConfig(**policy_settings(policy, {**SMALL, "block_size": 4, "selection_head": str(path)}))
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=32, do_sample=False, cache_implementation="rift", cache_config=config
    )
    assert torch.equal(out, reference)
    assert sum(r["accepted"] + 1 for r in rift_hf.last_stats(target).rounds) == 32


def test_fitting_raises_recall_towards_where_the_answer_reads(tmp_path):
    from rift_hf.training.selection import captured_attention

    model = tiny_model("llama", seed=3, attn="rift")
    items = [{"input_ids": make_prompt(48, seed=40 + i)[0], "boundary": 32} for i in range(6)]
    examples = head_examples(model, items, window=4, n_sink=1, path=tmp_path / "examples.safetensors")
    assert examples[0]["query"].shape == (2, 4, 4, 16) and examples[0]["future"].shape == (2, 2, 32)
    # Cached: the same items read back from disk without a forward.
    again = head_examples(model, items, window=4, n_sink=1, path=tmp_path / "examples.safetensors")
    assert torch.equal(again[3]["future"], examples[3]["future"])
    assert forward_seconds(tmp_path / "examples.safetensors") > 0
    # With no head, recall is the plain SnapKV selection recall the training proxy reports.
    with torch.no_grad(), captured_attention() as captured:
        model(items[0]["input_ids"][None])
    plain = selection_recall(captured, examples[0]["future"], 32, 4, 4)
    assert abs(head_recall(None, examples[:1], 4.0) - plain) < 1e-5
    # A target some head reaches exactly: the (normalised, evictable) scores of a random head.
    from rift_hf.training.head import _scores, head_loss

    teacher = random_head(model, seed=9, spread=2.0)
    for example in examples:
        rows = []
        for row in range(len(example["layers"])):
            scores = _scores(teacher, example, row, "avg", 5).detach()
            scores[:, :1] = 0
            scores[:, 32 - 4 :] = 0
            rows.append(scores / scores.sum(-1, keepdim=True))
        example["future"] = torch.stack(rows)
    with torch.no_grad():
        assert float(head_loss(teacher, examples[0], 1, 4)) < 1e-5
    head = SelectionHead.for_model(model.config)
    with torch.no_grad():
        before = [float(head_loss(head, e, 1, 4)) for e in examples]
    log = train_selection_head(head, examples, epochs=30, lr=0.1, n_sink=1, window=4)
    with torch.no_grad():
        after = [float(head_loss(head, e, 1, 4)) for e in examples]
    assert len(log) == 30 * len(examples)
    assert sum(after) < 0.5 * sum(before), (before, after)
    assert head_recall(head, examples, 4.0) > head_recall(None, examples, 4.0)
    with pytest.raises(ValueError, match="No training examples"):
        train_selection_head(head, [], window=4)


def test_refresh_point_examples_read_the_decode_queries_and_the_next_delta_tokens(tmp_path):
    from rift_hf.training.head import refresh_points
    from rift_hf.training.selection import _future_mass, captured_attention

    assert refresh_points(32, 48, None) == [32] and refresh_points(32, 48, 8) == [32, 36, 40, 44]
    model = tiny_model("llama", seed=3, attn="rift")
    items = [{"input_ids": make_prompt(48, seed=50 + i)[0], "boundary": 32} for i in range(2)]
    path = tmp_path / "refresh.safetensors"
    examples = head_examples(model, items, window=4, n_sink=1, path=path, delta=8)
    assert [e["boundary"] for e in examples] == [32, 36, 40, 44] * 2
    with torch.no_grad(), captured_attention() as captured:
        model(items[1]["input_ids"][None])
    for example in examples[4:]:
        t = example["boundary"]
        assert example["query"].shape == (2, 4, 4, 16) and example["key"].shape == (2, 2, t, 16)
        query, key, scale = captured[sorted(captured)[1]]
        assert torch.equal(example["query"][1], query[0, :, t - 4 : t].bfloat16())
        # the target: the attention of the next 8 tokens (not the whole rest), on [1, t - 4)
        expected = _future_mass(query[:, :, : t + 8], key[:, :, : t + 8], scale, t, 4, 1)
        assert torch.allclose(example["future"][1], expected)
        assert float(example["future"][1, :, 1 : t - 4].sum(-1).sub(1).abs().max()) < 1e-5
    again = head_examples(model, items, window=4, n_sink=1, path=path, delta=8)  # read back, no forward
    pairs = zip(again, examples, strict=True)
    assert all(torch.equal(a["key"], b["key"]) and a["boundary"] == b["boundary"] for a, b in pairs)
    # The prefill-only examples of the same items are keyed apart (another file content, not these).
    assert len(head_examples(model, items, window=4, n_sink=1, path=path)) == 2
