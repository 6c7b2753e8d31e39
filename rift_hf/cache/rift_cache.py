"""`RiftCache`: the `transformers.Cache` that holds one layer object per model layer and decides when they commit."""

from __future__ import annotations

import torch
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    Cache,
    CacheLayerMixin,
    DynamicSlidingWindowLayer,
    get_layer_types_and_kwargs,
)

from ..budget import layout
from ..config import RiftConfig
from ..policies import RetrievalPolicy, Signals, StorePolicy, is_resolver
from ..policies.selection_head import SelectionHead
from ..storage import check_group_sizes
from .layer import RiftLayer
from .reading import PromptReading, reading_sizes
from .refresh import Refresh, bounded_rollback, choose_in_round, commit_layers, undo_in_round
from .retrieval_layer import RiftRetrievalLayer
from .select_layer import RiftSelectLayer
from .state_layer import RiftStateLayer
from .store_layer import RiftStoreLayer

_PASSTHROUGH_TYPES = ("sliding_attention", "chunked_attention", "dummy")
_STATE_TYPES = ("linear_attention", "conv")


def build_layers(cache: RiftCache, config) -> list:
    """One layer object per layer of `config` (a model's config): full attention gets the policy's compressed layer
    class, sliding / chunked attention transformers' own (already bounded), linear attention / SSM / short conv a
    `RiftStateLayer`. Quantisation groups that do not tile the model's head dim are refused first."""
    decoder = config.get_text_config(decoder=True)
    cache.config.check_context(getattr(decoder, "max_position_embeddings", None))
    check_group_sizes(
        cache.config, getattr(decoder, "head_dim", None) or decoder.hidden_size // decoder.num_attention_heads
    )
    # The layer class follows from the policy's mode: its base class (for `auto`, the base its choices share).
    mode = getattr(cache.config.policy_type, "mode", cache.config.policy_type)
    compressed = (
        RiftRetrievalLayer
        if issubclass(mode, RetrievalPolicy)
        else RiftStoreLayer
        if issubclass(mode, StorePolicy)
        else RiftSelectLayer
    )
    layer_types, per_layer_kwargs = get_layer_types_and_kwargs(decoder)
    layers = []
    for idx, (layer_type, kwargs) in enumerate(zip(layer_types, per_layer_kwargs, strict=True)):
        if layer_type == "full_attention":
            layers.append(compressed(cache, idx))
        elif layer_type in _STATE_TYPES:
            layers.append(RiftStateLayer(**kwargs))
        elif layer_type in _PASSTHROUGH_TYPES:
            layers.append(DYNAMIC_LAYER_TYPE_MAPPING[layer_type](**kwargs))
        else:
            raise ValueError(
                f"RiftCache does not support layer type {layer_type!r} (layer {idx} of {config.model_type}); "
                f"supported: full_attention, {', '.join(_PASSTHROUGH_TYPES + _STATE_TYPES)}."
            )
    return layers


def use_policy(cache: RiftCache, config: RiftConfig) -> None:
    """Give `cache` `config` and its policy, with that policy's refresh clock (schedule, signals; the events list
    stays, as a RiftStats holds it) and whether the layers record their queries: at construction, and again once the
    prompt is seen (the fitted config; `auto` has then chosen its policy, and until then there is none)."""
    cache.config = config
    if is_resolver(config.policy):  # no policy, no schedule yet; the rounds' signals are logged all the same
        cache.policy = cache.refresh = cache.schedule = None
        cache.signals = Signals(alpha=config.al_alpha, entropy_window=config.check_interval)
        cache.records_queries = False
        return
    cache.policy = config.policy_object
    cache.refresh = Refresh(cache.policy, config, cache.events)
    cache.schedule, cache.signals = cache.refresh.schedule, cache.refresh.signals
    cache.records_queries = config.keeps_store or cache.schedule.needs_drift


class RiftCache(Cache):
    """
    A cache whose full-attention layers keep a fixed budget of past tokens, chosen by a RIFT policy.

    Args:
        config (`PreTrainedConfig`): the model's config (its `layer_types` decide each layer's object).
        rift_config (`RiftConfig`, `dict` or `str`, *optional*): the policy; a dict of `RiftConfig` fields or a
            preset name also work.
        **overrides: `RiftConfig` fields that replace those of `rift_config`.

    Example:

    ```python
    >>> import rift_hf
    >>> cache = rift_hf.RiftCache(model.config, {"policy": "swa", "budget": 256})
    >>> out = model.generate(ids, past_key_values=cache, max_new_tokens=64)
    >>> cache.get_seq_length(), cache.stored_tokens()
    ```
    """

    def __init__(self, config, rift_config: RiftConfig | dict | str | None = None, **overrides):
        rift_config = RiftConfig.coerce(rift_config)
        if overrides:
            rift_config = RiftConfig.from_dict({**rift_config.to_dict(), **overrides})
        self.config = rift_config
        super().__init__(layers=build_layers(self, config))
        self.rift_layers = [layer for layer in self.layers if isinstance(layer, RiftLayer)]
        self.state_layers = [layer for layer in self.layers if isinstance(layer, RiftStateLayer)]
        self.sliding_layers = [layer for layer in self.layers if isinstance(layer, DynamicSlidingWindowLayer)]
        self._first_attention = next(
            (i for i, layer in enumerate(self.layers) if isinstance(layer, CacheLayerMixin)), None
        )
        self.selection_head = None
        if rift_config.selection_head is not None:
            self.selection_head = SelectionHead.load(rift_config.selection_head).requires_grad_(False)
        self.events: list[dict] = []  # one entry per refresh (position, seconds, reason, signals)
        use_policy(self, rift_config)
        self.budget: float = float("inf")
        self.recent = self.n_select = 0
        self.prompt_length: int | None = None
        self.reading: PromptReading | None = None  # while a prompt is read in chunks (`reading.read_prompt`)
        self.record_past = False
        # The target's attention at its last verification, `[positions]` (guided policies; `generation/guide.py`).
        self.guide: torch.Tensor | None = None
        self.peak_bytes = 0  # KV held (working sets and stores), at its largest: just before a commit
        # Commit points in assisted generation: the forward after a rollback (or the prefill) feeds only verified
        # tokens; its end (`verified_length`) is where state layers snapshot and below which no rollback goes.
        self.verified_length: int | None = None
        self._awaiting_verified = self._verified_forward_done = False

    def scoring_query(self, layer_idx: int, query: torch.Tensor) -> torch.Tensor:
        """The queries the policy scores with: `query` itself, or re-weighted by the config's selection head."""
        return query if self.selection_head is None else self.selection_head(layer_idx, query)

    def stored_tokens(self) -> list[int]:
        """Entries stored per compressed layer (per KV head), in-flight draft tokens included."""
        return [layer.stored for layer in self.rift_layers]

    def get_mask_sizes(self, query_length: int, layer_idx: int) -> tuple[int, int]:
        self.begin_forward()
        return super().get_mask_sizes(query_length, layer_idx)

    def begin_forward(self) -> None:
        """
        A forward is starting. If everything stored is verified (plain generation, or the previous forward fed only
        verified tokens: the prompt, or a round's re-fed tokens), settle it now, before the mask is sized, so that
        every compressed layer reports the same size to it and drafting starts from the budget.
        """
        if not self.record_past or self._verified_forward_done:
            self._verified_forward_done = False
            self._commit()
        elif self.config.rechoose_after:
            choose_in_round(self)

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if key_states.shape[0] != 1:
            raise ValueError(
                f"RiftCache supports batch size 1, got {key_states.shape[0]}: call generate once per prompt."
            )
        if isinstance(layer, RiftLayer) and self.prompt_length is None:
            length = self.reading.length if self.reading else layer.seen + key_states.shape[-2]
            self._resolve_budget(length, key_states)
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if self._awaiting_verified and layer_idx == self._first_attention:
            self.verified_length = layer.get_seq_length()
            self._awaiting_verified = False
            self._verified_forward_done = True
        return out

    def _resolve_budget(self, prompt_length: int, like: torch.Tensor) -> None:
        self.prompt_length = prompt_length
        config, self.budget, self.recent, self.n_select = layout(self.config, prompt_length, like)
        use_policy(self, config)
        self.refresh.restart(prompt_length)
        if self.reading and self.budget != float("inf"):
            self.reading.final = (self.budget, self.recent, self.n_select)
            self.budget, self.recent, self.n_select = reading_sizes(config, prompt_length, *self.reading.final)

    def commit_chunk(self) -> None:
        """A chunk of a prompt read in chunks was fed (`reading.read_prompt`): commit it, choosing the working set."""
        self._verified_forward_done = False
        self._commit()
        if self.record_past:
            self._await_verified_forward()

    def activate_past_recording(self, **_) -> None:
        # transformers 5.25 asks the target's cache to keep per-token recurrent states (`recurrent_states_to_keep`);
        # a verifier RiftCache rolls back by snapshot instead (stateful.py), so the layers keep none.
        super().activate_past_recording()
        self.record_past = True
        self._await_verified_forward()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        """Tokens seen, read from an attention layer when `layer_idx` is a state layer (as transformers 5.23 does;
        5.25 would read a linear-attention layer's own count)."""
        if layer_idx == 0 and self.state_layers and self._first_attention is not None:
            layer_idx = self._first_attention
        return super().get_seq_length(layer_idx)

    def _await_verified_forward(self) -> None:
        self._awaiting_verified = True
        for layer in self.state_layers:
            layer.arm_snapshot()

    def crop(self, tokens_to_remove: int) -> None:
        """
        Roll back `-tokens_to_remove` tokens (assisted generation), then commit: what remains has been verified.

        The cache never goes below the end of the last verified forward (transformers re-feeds one verified token
        when no draft was accepted; keeping it is equivalent, and its entry may already be compressed). With
        linear-attention / SSM layers the states are restored to the snapshot taken at that point and the attention
        layers cropped to it, so the drafter re-feeds the accepted tokens and its state equals a fresh recompute.
        """
        if tokens_to_remove > 0:
            raise ValueError(f"RiftCache.crop takes a negative number of tokens to remove, got {tokens_to_remove}.")
        if self.get_seq_length() == 0:
            # Nothing written yet (transformers crops before the first round when the prompt has 1-2 tokens): layers
            # that were never initialised, such as sliding-window ones, cannot be cropped.
            return
        super().crop(bounded_rollback(self, tokens_to_remove))
        undo_in_round(self)
        self._commit(rollback=True)
        if self.record_past:
            self._await_verified_forward()

    def settle(self) -> None:
        """
        Commit now if the last forward fed only verified tokens (assisted generation calls this after each drafting
        round). A round that drafts a single token runs no second forward, which would otherwise commit; without this
        the drafter's whole prompt cache would stay uncompressed through the target's prefill.
        """
        if self.record_past and self._verified_forward_done:
            self._verified_forward_done = False
            self._commit()

    def _commit(self, rollback: bool = False) -> None:
        """Commit every compressed layer; refresh the selection where the policy's schedule says so (after a rollback
        only if the policy refreshes there: `Policy.refresh_at_rollback`)."""
        held = self.kv_bytes()  # what a commit is about to shrink: the peak since the last one
        self.peak_bytes = max(self.peak_bytes, held["working"] + held["store"])
        for layer in self.sliding_layers:
            # Past recording keeps every row until transformers' first crop (after round one); rows before a commit
            # point are never rolled back, so they go now: a sliding layer holds its window from the first draft on.
            if layer.record_past and layer.is_initialized and layer.get_seq_length() >= layer.sliding_window:
                layer.crop(0)
        if not self.rift_layers or self.prompt_length is None or self.budget == float("inf"):
            return
        commit_layers(self, rollback)

    def kv_bytes(self) -> dict[str, int]:
        """Bytes held now: `working` (what attention reads: compressed working sets and other attention layers)
        and `store` (the full stores kept by store policies or the attention-mass measurement, page summaries)."""
        working = store = 0
        for layer in self.layers:
            if isinstance(layer, RiftLayer):
                layer_working, layer_store = layer.kv_bytes()
                working, store = working + layer_working, store + layer_store
            elif getattr(layer, "keys", None) is not None and getattr(layer, "is_initialized", False):
                working += 2 * layer.keys.numel() * layer.keys.element_size()
        return {"working": working, "store": store}

    def attention_mass_log(self) -> list[tuple[int, float]]:
        """`(position, share)` averaged over compressed layers (measurement mode, `track_attention_mass=True`)."""
        per_position: dict[int, list[float]] = {}
        for layer in self.rift_layers:
            for pos, share in layer.mass_log:
                per_position.setdefault(pos, []).append(share)
        return sorted((pos, sum(v) / len(v)) for pos, v in per_position.items())
