import pytest
from transformers import GenerationConfig

from rift_hf import POLICIES, PRESETS, RiftConfig, preset


def test_presets_cover_every_policy():
    assert set(PRESETS) == set(POLICIES)
    assert preset("rift-dyn").delta == 128
    assert RiftConfig(policy="swa", budget=64).recent_tokens(64) == 64
    assert RiftConfig(policy="snapkv", budget=256, window=64).recent_tokens(256) == 64
    assert RiftConfig(policy="rift-stat", budget=256).recent_tokens(256) == 128
    assert RiftConfig(policy="rift-stat", budget=256, n_sink=4).recent_tokens(256) == 128


def test_fractional_budget_resolves_against_prompt():
    config = RiftConfig(policy="rift-stat", budget=0.25, window=16)
    assert config.resolve_budget(1000) == 250
    with pytest.raises(ValueError, match="n_sink \\+ window"):
        config.resolve_budget(40)  # 10 tokens cannot hold the 16-query window


def test_block_budget_rounds_down_to_whole_blocks():
    config = RiftConfig(policy="rift-stat-block", budget=100, window=16, block_size=16)
    budget = config.resolve_budget(1000)
    assert budget == 96
    assert (budget - config.recent_tokens(budget)) % 16 == 0


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"policy": "h2o"}, ValueError, "choose one of full, swa"),
        ({"budget": 0}, ValueError, "positive number"),
        ({"budget": -3}, ValueError, "positive number"),
        ({"budget": 1.5}, ValueError, "in \\(0, 1\\)"),
        ({"budget": "big"}, TypeError, "int \\(tokens\\)"),
        ({"rho": 1.2}, ValueError, "rho"),
        ({"rho": -0.1}, ValueError, "rho"),
        ({"budget": 32, "window": 30, "n_sink": 4}, ValueError, "n_sink \\+ window"),
        ({"pool_kernel": 4}, ValueError, "odd"),
        ({"a_min": 600}, ValueError, "a_min"),
    ],
)
def test_bad_config_raises_with_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        RiftConfig(**kwargs)


def test_round_trip_through_generation_config(tmp_path):
    config = RiftConfig(policy="rift-ada", budget=0.25, delta=64, drift_threshold=0.2)
    gen = GenerationConfig(cache_implementation="rift", cache_config=config.to_dict())
    gen.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert loaded.cache_implementation == "rift"
    assert RiftConfig.coerce(loaded.cache_config) == config


def test_unknown_field_is_named():
    with pytest.raises(ValueError, match="bugdet"):
        RiftConfig.from_dict({"policy": "swa", "bugdet": 3})


def test_transformers_outside_the_tested_range_is_refused_at_import():
    import pytest

    from rift_hf._compat import check_transformers

    check_transformers("5.23.0")
    check_transformers("5.23.4")
    for version in ("5.22.1", "5.24.0", "4.57.0"):
        with pytest.raises(ImportError, match=r"pip install 'transformers>=5.23,<5.24'"):
            check_transformers(version)


def test_attend_in_place_needs_a_store_policy():
    assert RiftConfig(policy="rift-dyn", attend_in_place=True).attend_in_place
    with pytest.raises(ValueError, match="does not keep"):
        RiftConfig(policy="rift-stat", attend_in_place=True)
    with pytest.raises(TypeError, match="True or False"):
        RiftConfig(policy="rift-dyn", attend_in_place=1)
