from pathlib import Path

import pytest
import torch
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
        ({"policy": "rift-stat", "pool_kernel": 4}, ValueError, "odd"),
        ({"policy": "rift-ada", "a_min": 600}, ValueError, "`a_min` \\(600\\) must not exceed"),
        ({"policy": "rift-dyn", "delta": 0}, ValueError, "`delta` must be a positive int"),
        ({"policy": "page-round", "pages_ahead": -1}, ValueError, "`pages_ahead` must be an int >= 0"),
        ({"policy": "rift-ada", "al_threshold": float("nan")}, ValueError, "finite"),
        ({"policy": "snapkv", "snapkv_grow": 1}, TypeError, "True or False"),
        ({"a_min": 600}, ValueError, "does not read `a_min`"),
    ],
)
def test_bad_config_raises_with_fix(kwargs, error, match):
    with pytest.raises(error, match=match):
        RiftConfig(**kwargs)


def test_round_trip_through_generation_config(tmp_path):
    config = RiftConfig(policy="rift-ada", budget=0.25, a_min=64, drift_threshold=0.2)
    gen = GenerationConfig(cache_implementation="rift", cache_config=config.to_dict())
    gen.save_pretrained(tmp_path)
    loaded = GenerationConfig.from_pretrained(tmp_path)
    assert loaded.cache_implementation == "rift"
    assert RiftConfig.coerce(loaded.cache_config) == config


def test_unknown_field_is_named():
    with pytest.raises(ValueError, match="bugdet"):
        RiftConfig.from_dict({"policy": "swa", "bugdet": 3})


@pytest.mark.parametrize("as_", ["policy", "preset"])
def test_a_benchmark_label_given_as_a_policy_is_answered_with_its_fields(as_):
    label = "page-round@pages_ahead=1,store_dtype=int4"
    with pytest.raises(ValueError) as raised:
        RiftConfig.coerce({"policy": label} if as_ == "policy" else label)
    fields = {"policy": "page-round", "pages_ahead": 1, "store_dtype": "int4"}
    assert repr(fields) in str(raised.value)
    assert RiftConfig.coerce(fields).pages_ahead == 1  # and what it names works


def test_transformers_outside_the_tested_range_is_refused_at_import():
    import pytest

    from rift_hf._compat import check_transformers

    for version in ("5.23.0", "5.23.4", "5.24.0", "5.25.0"):
        check_transformers(version)
    for version in ("5.22.1", "5.26.0", "4.57.0"):
        with pytest.raises(ImportError, match=r"pip install 'transformers>=5.23,<5.26'"):
            check_transformers(version)


def test_attend_in_place_needs_a_store_policy():
    assert RiftConfig(policy="rift-dyn", attend_in_place=True).attend_in_place
    with pytest.raises(ValueError, match="does not keep"):
        RiftConfig(policy="rift-stat", attend_in_place=True)
    with pytest.raises(TypeError, match="True or False"):
        RiftConfig(policy="rift-dyn", attend_in_place=1)


def test_from_pretrained_on_a_missing_folder_says_so():
    with pytest.raises(FileNotFoundError, match="not a Hub repository id"):
        RiftConfig.from_pretrained("no/such/folder/here")
    with pytest.raises(FileNotFoundError, match="No folder no-such-drafter here"):
        RiftConfig.from_pretrained("no-such-drafter", local_files_only=True)  # a valid repo id, nothing cached


def test_push_to_hub_and_from_pretrained_with_revision_and_token(tmp_path, monkeypatch):
    """Against a stand-in for the Hub API: the upload carries the config and its head; a download passes revision
    and token through and fetches the head from the same repository."""
    import huggingface_hub
    from safetensors.torch import save_file

    head = tmp_path / "elsewhere" / "selection_head.safetensors"
    head.parent.mkdir()
    save_file({"w": torch.zeros(2)}, str(head))
    hub: dict = {}
    calls: list = []

    class FakeApi:
        def __init__(self, token=None):
            calls.append(("token", token))

        def create_repo(self, repo_id, private=None, exist_ok=False):
            calls.append(("create", repo_id, private, exist_ok))

        def upload_folder(self, repo_id, folder_path, revision=None, commit_message=None, create_pr=False):
            calls.append(("upload", repo_id, revision))
            for path in Path(folder_path).iterdir():
                hub[(repo_id, revision or "main", path.name)] = path.read_bytes()
            return "commit"

    def fake_download(repo_id, filename, revision=None, token=None, cache_dir=None, local_files_only=False):
        calls.append(("download", repo_id, filename, revision, token))
        target = tmp_path / "cache" / (revision or "main") / filename
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(hub[(repo_id, revision or "main", filename)])
        return str(target)

    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    config = RiftConfig(policy="rift-stat", budget=64, selection_head=str(head))
    assert config.push_to_hub("me/drafter-rift", token="hf_x", revision="v1", private=True) == "commit"
    assert ("create", "me/drafter-rift", True, True) in calls and ("token", "hf_x") in calls
    assert {name for (_, _, name) in hub} == {"rift_config.json", "selection_head.safetensors"}
    loaded = RiftConfig.from_pretrained("me/drafter-rift", revision="v1", token="hf_x")
    assert loaded.budget == 64 and loaded.policy == "rift-stat"
    assert Path(loaded.selection_head).read_bytes() == head.read_bytes()
    assert ("download", "me/drafter-rift", "selection_head.safetensors", "v1", "hf_x") in calls
    # save_pretrained(push_to_hub=True) uploads what it wrote, to the folder's name unless a repo_id is given
    RiftConfig(policy="swa", budget=32).save_pretrained(tmp_path / "swa-drafter", push_to_hub=True)
    assert ("upload", "swa-drafter", None) in calls
    with pytest.raises(FileNotFoundError, match="has no rift_config.json"):
        monkeypatch.setattr(
            huggingface_hub,
            "hf_hub_download",
            lambda *a, **k: (_ for _ in ()).throw(huggingface_hub.errors.EntryNotFoundError("missing")),
        )
        RiftConfig.from_pretrained("me/other")


def test_stats_repr_is_one_short_line_with_details_on_request():
    from rift_hf.generation.stats import RiftStats

    rounds = [{"drafted": 4, "accepted": 2, "draft_seconds": 0.01, "signals": {}} for _ in range(500)]
    stats = RiftStats("page-round", rounds=rounds, prompt_tokens=4096, budget=1024, peak_kv_bytes=3 * 2**20)
    text = repr(stats)
    assert "\n" not in text and len(text) < 300
    assert "rounds=500" in text and "AL=3.00" in text and "1024/4096" in text and "peak_kv=3.00 MiB" in text
    assert len(stats.to_dict()["rounds"]) == 500  # the details stay available


@pytest.mark.parametrize(
    "fields, field",
    [
        ({"policy": "swa", "pages_ahead": 3}, "pages_ahead"),
        ({"policy": "rift-stat", "block_size": 8}, "block_size"),
        ({"policy": "page-round", "delta": 16}, "delta"),
        ({"policy": "full", "window": 8}, "window"),
        ({"policy": "rift-dyn", "a_max": 64}, "a_max"),
        ({"policy": "page-round", "pool": "max"}, "pool"),
        ({"policy": "rift-stat", "snapkv_grow": True}, "snapkv_grow"),
    ],
)
def test_a_field_the_policy_does_not_read_is_refused(fields, field):
    with pytest.raises(ValueError, match=f"does not read `{field}`.*Drop `{field}`"):
        RiftConfig(**fields)


def test_saved_configs_of_every_policy_load_and_shared_settings_go_where_they_are_read(tmp_path):
    from rift_hf.config import policy_settings

    for policy in POLICIES:  # the flat JSON holds every field, filled ones included
        config = RiftConfig(**policy_settings(policy, {"budget": 64, "window": 8, "delta": 16, "block_size": 8}))
        config.save_pretrained(tmp_path / policy)
        assert RiftConfig.from_pretrained(tmp_path / policy) == config
    assert policy_settings("swa", {"budget": 64, "window": 8, "delta": 16}) == {"policy": "swa", "budget": 64}
    assert policy_settings("rift-dyn", {"window": 8, "delta": 16, "block_size": 8, "n_sink": 2}) == {
        "policy": "rift-dyn", "window": 8, "delta": 16, "n_sink": 2,
    }  # fmt: skip


def test_training_overrides_no_sampled_policy_reads_are_refused():
    from rift_hf.training import CompressionSampler

    CompressionSampler(policies=("rift-stat", "rift-dyn"), overrides={"delta": 16, "window": 8})  # rift-dyn reads it
    with pytest.raises(ValueError, match="No sampled policy .* reads block_size"):
        CompressionSampler(policies=("rift-stat", "rift-dyn"), overrides={"block_size": 8})


def test_the_cache_keyword_is_the_installed_transformers_own():
    import dataclasses

    from transformers.modeling_outputs import CausalLMOutputWithPast

    from rift_hf._compat import CACHE, pop_cache

    assert CACHE in {field.name for field in dataclasses.fields(CausalLMOutputWithPast)}
    marker = object()
    for name in {"past_key_values", CACHE}:  # a wrapper takes the cache under either name, and removes it
        kwargs = {name: marker, "use_cache": True}
        assert pop_cache(kwargs) is marker and kwargs == {"use_cache": True}
    assert pop_cache({}) is None


def test_auto_is_page_round_on_shorter_prompts_and_rift_dyn_with_a_carry_on_longer_ones():
    from rift_hf.policies.auto import LONG_PROMPT

    config = RiftConfig()
    assert config.policy == "auto" and config.store_dtype == "int4"
    short, long = config.fitted(LONG_PROMPT - 1), config.fitted(LONG_PROMPT)
    assert (short.policy, short.block_size, short.pages_ahead, short.store_dtype) == ("page-round", 8, 2, "int4")
    assert (long.policy, long.tokens_ahead, long.delta, long.store_dtype) == ("rift-dyn", 128, 128, "int4")
    assert long.block_size == preset("rift-dyn").block_size and long.pages_ahead == 0
    # what both read passes through; the budget is the chosen policy's (page-round rounds to whole pages)
    chosen = RiftConfig(budget=0.125, window=32, store_dtype=None)
    resolved = chosen.fitted(40000)
    assert (resolved.window, resolved.store_dtype, resolved.budget) == (32, None, 0.125)
    assert chosen.resolve_budget(1001) == preset("page-round", budget=0.125, window=32).resolve_budget(1001)
    assert chosen.resolve_budget(40000) == 5000


@pytest.mark.parametrize("field, value", [("tokens_ahead", 64), ("score_queries", 4), ("delta", 64), ("block_size", 4)])
def test_auto_refuses_a_field_only_one_of_its_policies_reads(field, value):
    with pytest.raises(ValueError, match=f"does not read `{field}`"):
        RiftConfig(**{field: value})
    RiftConfig(policy="rift-dyn" if field in ("tokens_ahead", "delta") else "page-round", **{field: value})


def test_auto_is_a_resolver_not_a_policy():
    """`auto` has no policy object until the prompt's length picks one; what is known before is what both of its
    choices share, and a config naming it is valid only if it is valid for each."""
    from rift_hf.policies import Policy, is_resolver, policy_class, register_resolver
    from rift_hf.policies.auto import LONG_PROMPT, Auto

    assert is_resolver("auto") and not issubclass(Auto, Policy) and not is_resolver("page-round")
    with pytest.raises(ValueError, match=r"fitted\(prompt_length\)\.policy_object"):
        _ = RiftConfig().policy_object
    for length, chosen in Auto.choices().items():
        kind = policy_class(chosen["policy"])
        assert issubclass(kind, Auto.mode), length
        for trait in ("compresses", "scored", "keeps_store", "retrieves"):
            assert getattr(Auto, trait) == getattr(kind, trait), (length, trait)
        assert not RiftConfig().fitted(length).is_guided
        assert Auto.params <= kind.params and kind.store_dtype in (None, Auto.store_dtype)
    assert RiftConfig().fitted(LONG_PROMPT).policy_object.name == "rift-dyn" and not RiftConfig().is_guided
    assert RiftConfig(policy="page-round", guide="target").is_guided and not RiftConfig(policy="page-round").is_guided
    # valid for one choice only: refused at construction, naming the choice (a window the rift-dyn budget cannot hold)
    with pytest.raises(ValueError, match="resolves to"):
        RiftConfig(budget=40, window=48)
    with pytest.raises(TypeError, match="must define `resolve`"):

        @register_resolver
        class NotOne(Policy):
            name = "test-not-a-resolver"
            resolve = staticmethod(lambda config, n: config)
