"""page-round's re-choice inside a drafting round (`rechoose_after`): lossless, consistent with the store, and
really choosing from the round's drafted queries."""

import pytest
import torch

import rift_hf
from rift_hf import RiftCache, RiftConfig
from rift_hf.cache import rift_cache
from rift_hf.cache.store_layer import RiftStoreLayer
from tiny import ARCHITECTURES, after_updates, draft_target_pair, make_prompt

GAMMA = 4
PROMPT = 48
NEW = 40
SETTINGS = {
    "policy": "page-round",
    "draft_length": "fixed",
    "budget": 24,
    "window": 4,
    "n_sink": 1,
    "block_size": 2,
    "rechoose_after": 2,
}


@pytest.fixture(scope="module")
def pairs():
    return {arch: draft_target_pair(arch, GAMMA) for arch in ARCHITECTURES}


@pytest.fixture()
def rows_log(monkeypatch):
    """After every update of a compressed layer: whether each attended row holds the stored row of its position."""
    log = []

    def record(cache, layer_idx):
        layer = cache.layers[layer_idx]
        if isinstance(layer, RiftStoreLayer) and layer.compressed and not layer.indexed:
            positions = layer.working.used_positions
            keys, values = layer.store.gather(positions)
            log.append(
                torch.equal(layer.working.used_keys, keys.to(layer.working.used_keys))
                and torch.equal(layer.working.used_values, values.to(layer.working.used_values))
            )

    after_updates(monkeypatch, record)
    return log


@pytest.mark.parametrize("store_dtype", [None, "int4"])
@pytest.mark.parametrize("arch", ARCHITECTURES)
def test_greedy_output_unchanged_and_rows_match_the_store(pairs, arch, store_dtype, rows_log):
    target, draft = pairs[arch]
    ids = make_prompt(PROMPT, seed=3)
    reference = target.generate(ids, max_new_tokens=NEW, do_sample=False)
    out = target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config={**SETTINGS, "store_dtype": store_dtype},
    )
    assert torch.equal(out, reference)
    reasons = [event["reason"] for event in rift_hf.last_stats(target).rescorings]
    assert "in-round" in reasons, reasons
    assert rows_log and all(rows_log), "an attended row differs from the stored row of its position"


def test_in_round_choice_is_the_policys_choice_from_the_drafted_queries(pairs, monkeypatch):
    """Just after a re-choice, each layer's selection is what `select_pages` picks from the newest verified query and
    the drafted ones, below the recent window at the round's commit: and it differs from the commit's choice at least
    once in a generation (the drafted queries matter)."""
    target, draft = pairs["llama"]
    seen = []
    original = rift_cache.choose_in_round

    def rechoose(self):
        before = [None if layer.selected is None else layer.selected.clone() for layer in self.rift_layers]
        events = len(self.events)
        original(self)
        if len(self.events) == events:
            return
        policy, drafted = self.policy, self.config.rechoose_after
        for i, layer in enumerate(self.rift_layers):
            committed = layer.seen - drafted
            expected = policy.select_pages(
                layer.queries,
                layer.pages.used_keys,
                layer.scale,
                self.config.n_sink,
                committed - layer.recent_window(),
                self.n_select,
                self.config.score_queries + drafted,
            )
            assert torch.equal(layer.selected, expected)
            assert int(layer.selected.max()) < committed - layer.recent_window()
            seen.append(not torch.equal(layer.selected, before[i]))

    monkeypatch.setattr(rift_cache, "choose_in_round", rechoose)
    target.generate(
        make_prompt(PROMPT, seed=5),
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config=SETTINGS,
    )
    assert seen and any(seen), "no re-choice, or every re-choice kept the commit's pages"


def test_no_in_round_choice_when_off_or_outside_assisted_generation(pairs):
    target, draft = pairs["llama"]
    ids = make_prompt(PROMPT, seed=3)
    target.generate(
        ids,
        assistant_model=draft,
        max_new_tokens=NEW,
        do_sample=False,
        cache_implementation="rift",
        cache_config={**SETTINGS, "rechoose_after": 0},
    )
    assert all(e["reason"] != "in-round" for e in rift_hf.last_stats(target).rescorings)
    cache = RiftCache(draft.config, {**SETTINGS, "draft_length": "auto"})
    draft.generate(ids, past_key_values=cache, max_new_tokens=12, do_sample=False)  # commits at every step
    assert cache.events and all(e["reason"] != "in-round" for e in cache.events)


def test_rechoose_after_is_page_rounds_and_a_count():
    assert RiftConfig(policy="page-round", rechoose_after=4).rechoose_after == 4
    # page-round's own default, also when `auto` resolves to it; every other policy reads 0 (never).
    assert RiftConfig(policy="page-round").rechoose_after == 2 and RiftConfig(policy="rift-dyn").rechoose_after == 0
    assert RiftConfig(policy="auto", budget=0.25).fitted(4096).rechoose_after == 2
    assert RiftConfig(policy="auto", budget=0.25).fitted(32768).rechoose_after == 0
    with pytest.raises(ValueError, match="rechoose_after"):
        RiftConfig(policy="auto", rechoose_after=4)
    with pytest.raises(ValueError, match="does not read `rechoose_after`"):
        RiftConfig(policy="rift-dyn", rechoose_after=4)
    with pytest.raises(ValueError, match="rechoose_after"):
        RiftConfig(policy="page-round", rechoose_after=-1)
    with pytest.raises(ValueError, match="rechoose_after"):
        RiftConfig(policy="page-round", rechoose_after=True)
