"""Weight-major small-batch linear layers (`rift_hf.speedups`): same products, same greedy output, reversible, refused
bad input."""

import copy
import json
import pickle

import pytest
import torch
import torch.nn.functional as F

import rift_hf
from rift_hf.config import policy_settings
from rift_hf.speedups import WeightMajorLinear, weight_major_linear
from tiny import draft_target_pair, make_prompt, tiny_model


def _linears(model):
    return [m for m in model.modules() if isinstance(m, torch.nn.Linear)]


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 16])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_matches_torch_within_rounding_for_small_inputs(rows, bias):
    torch.manual_seed(rows)
    layer = torch.nn.Linear(48, 80, bias=bias)
    x = torch.randn(1, rows, 48)
    expected = layer(x)
    weight_major_linear(layer)
    assert type(layer) is WeightMajorLinear
    got = layer(x)
    assert got.shape == expected.shape == (1, rows, 80)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # a 1-D input (one row, no batch dimension) keeps its shape
    torch.testing.assert_close(layer(x[0, 0]), F.linear(x[0, 0], layer.weight, layer.bias), rtol=1e-5, atol=1e-6)


def test_larger_inputs_and_other_dtypes_take_torchs_own_path_exactly():
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 24)
    weight_major_linear(layer, max_rows=4)
    big = torch.randn(2, 3, 32)  # 6 rows > 4
    assert torch.equal(layer(big), F.linear(big, layer.weight, layer.bias))
    empty = torch.randn(0, 32)
    assert layer(empty).shape == (0, 24)
    half = torch.nn.Linear(32, 24).to(torch.float16)
    weight_major_linear(half)
    x = torch.randn(2, 32)  # fp32 input, fp16 weights: torch's error, not a silent cast
    with pytest.raises(RuntimeError):
        half(x)


def test_model_switch_is_reversible_and_leaves_parameters_and_subclasses_alone():
    model = tiny_model("llama")

    class Adapter(torch.nn.Linear):  # a quantised or LoRA layer keeps its own forward
        pass

    model.model.layers[0].mlp.up_proj.__class__ = Adapter
    plain = len(_linears(model)) - 1
    state = {k: v.clone() for k, v in model.state_dict().items()}
    ids = make_prompt(5, seed=3)
    with torch.no_grad():
        before = model(ids).logits
        assert weight_major_linear(model, max_rows=8) == plain
        assert type(model.model.layers[0].mlp.up_proj) is Adapter
        assert all(m.max_rows == 8 for m in model.modules() if type(m) is WeightMajorLinear)
        during = model(ids).logits
        assert weight_major_linear(model) == 0  # already switched: nothing changes (max_rows is updated)
        assert weight_major_linear(model, enabled=False) == plain
        after = model(ids).logits
    torch.testing.assert_close(during, before, rtol=1e-5, atol=1e-5)
    assert torch.equal(after, before)
    assert not any(type(m) is WeightMajorLinear for m in model.modules())
    assert state.keys() == model.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items())


def test_switched_model_copies_pickles_and_trains():
    model = tiny_model("qwen2")
    weight_major_linear(model)
    clone = pickle.loads(pickle.dumps(copy.deepcopy(model)))
    assert any(type(m) is WeightMajorLinear for m in clone.modules())
    ids = make_prompt(6, seed=2)
    loss = model(ids, labels=ids).loss
    loss.backward()
    grads = [m.weight.grad for m in model.modules() if type(m) is WeightMajorLinear]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("policy", ["full", "page-round", "rift-dyn"])
def test_assisted_greedy_output_stays_the_targets_own(policy):
    target, draft = draft_target_pair("llama", gamma=4)
    weight_major_linear(target)
    weight_major_linear(draft)
    ids = make_prompt(40, seed=5)
    reference = target.generate(ids, max_new_tokens=24, do_sample=False)
    config = policy_settings(policy, {"budget": 16, "window": 4, "delta": 4, "block_size": 4})
    out = target.generate(
        ids, assistant_model=draft, max_new_tokens=24, do_sample=False, cache_implementation="rift", cache_config=config
    )
    assert torch.equal(out, reference)
    assert rift_hf.last_stats(target).rounds


def test_bad_arguments_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="max_rows must be a positive int"):
        weight_major_linear(torch.nn.Linear(2, 2), max_rows=0)
    with pytest.raises(ValueError, match="max_rows"):
        weight_major_linear(torch.nn.Linear(2, 2), max_rows=True)
    with pytest.raises(TypeError, match="torch.nn.Module"):
        weight_major_linear("Qwen/Qwen2.5-Coder-0.5B-Instruct")


def test_compare_records_weight_major_linear_and_refuses_unknown_ones(tmp_path):
    from lab import cli
    from lab.compare import compare
    from lab.records import Experiment

    out = tmp_path / "cmp"
    cli.main(
        ["compare", "--preset", "tiny-random", "--policies", "full", "--input-tokens", "64", "--new-tokens", "4",
         "--per-task", "1", "--tasks", "repeat", "--window", "8", "--linear", "weight-major", "--out", str(out)]
    )  # fmt: skip
    result = json.loads((out / "compare.json").read_text())
    assert result["linear"] == "weight-major"
    assert "linear layers weight-major" in (out / "compare.md").read_text()
    experiment = Experiment("tiny-random", ["full"], 64, 4, 1, gamma=4, window=8, delta=32)
    with pytest.raises(ValueError, match="linear must be one of torch, weight-major"):
        compare(experiment, 4.0, tmp_path / "x", linear="fast")
    with pytest.raises(ValueError, match="targets_dir saves target outputs for replay"):
        compare(experiment, 4.0, tmp_path / "y", targets_dir=tmp_path, linear="weight-major")
