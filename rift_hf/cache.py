"""`RiftCache`: a `transformers.Cache` whose full-attention layers keep a fixed budget of past tokens.

Layout (one layer object per model layer, as in `DynamicCache`):

- full attention  -> `RiftLayer`: logical length (tokens seen) kept apart from the stored entries, as
  `DynamicSlidingWindowLayer` does; eviction only at commit points, so a rollback never needs an evicted entry;
- sliding / chunked attention -> transformers' own `DynamicSlidingWindowLayer` (already bounded);
- linear attention / SSM / short conv -> `RiftStateLayer`: snapshots its states after the committed tokens of a
  round and restores them on rollback, so a stateful drafter drafts from the state a fresh recompute gives.

Commit points: in assisted generation (`activate_past_recording()` was called) every `crop` is one, since what
stays after it has been verified by the target; in plain generation every token is committed as soon as it is
written, and the cache settles the previous step when the next forward asks for its mask sizes.
"""

from __future__ import annotations

import time
from contextvars import ContextVar

import torch
from transformers.cache_utils import (
    DYNAMIC_LAYER_TYPE_MAPPING,
    Cache,
    CacheLayerMixin,
    DynamicSlidingWindowLayer,
    LinearAttentionLayer,
    get_layer_types_and_kwargs,
)

from .config import RiftConfig
from .kernels import uses_triton
from .policies import Signals, keep_mask
from .policies.selection_head import SelectionHead
from .storage import (
    QuantizedRows,
    QuantizedWorkingSet,
    Quantizer,
    RecentRows,
    Rows,
    WorkingSet,
    check_group_sizes,
)

# The compressed layer that was updated last: the attention backend, which runs right after `update` in the same
# attention module, hands it the queries that `update` never sees (it checks that it received the very key tensor
# this layer returned, so another model's attention can never feed this cache).
ACTIVE_LAYER: ContextVar[RiftLayer | None] = ContextVar("rift_active_layer", default=None)

_PASSTHROUGH_TYPES = ("sliding_attention", "chunked_attention", "dummy")
_STATE_TYPES = ("linear_attention", "conv")


class RiftLayer(CacheLayerMixin):
    """
    A full-attention cache layer compressed to `budget` past entries per KV head, for the policies that select once,
    from the prompt's scores (`snapkv`, `rift-stat`, `rift-stat-block`; `swa` selects nothing). The cache picks the
    class by the policy: `RiftStoreLayer` (a full store, re-selected from) and `RiftRetrievalLayer` (every token kept,
    each query attends its own pages) change what a commit does.

    Storage (`rift_hf.storage`) is kept apart from the policy (`cache.policy`): `working` is the `WorkingSet` the
    attention reads (`keys`/`values` `[B, H_kv, N, D]` and their absolute `positions` `[H_kv, N]` are views of its
    used rows), laid out as sinks and selection, a ring for the recent window, then the rows written since the last
    commit. Until the first compression the ring is unbounded (every token is kept in order). With a store policy or
    the attention-mass measurement, `store` keeps every token (possibly on another device; `store_keys`/`store_values`
    are views of it). A commit of k verified tokens writes k rows; only a new selection (the first one, or a
    rescoring) rebuilds the working set.
    """

    is_croppable = True
    # Rows reserved past the budget for the tokens of one drafting round (a longer round grows the buffer).
    HEADROOM = 32
    # Whether the first selection comes from the prompt's own scores (taken in `observe` at prefill).
    SCORES_PROMPT = True

    def __init__(self, cache: RiftCache, layer_idx: int):
        super().__init__()
        self.cache = cache
        self.layer_idx = layer_idx
        self.seen = 0
        self.committed = 0  # stored entries at the last commit; rollback may not go below
        self.working: WorkingSet | None = None
        self.store: Rows | None = None
        self.compressed = False
        self.selected: torch.Tensor | None = None  # [H_kv, S] positions picked by the scorer
        self.prefill_scores: torch.Tensor | None = None  # [H_kv, T] scores of the prompt
        # The recent queries (`[B, H_q, n, D]`, positions `[seen - n, seen)`), kept for policies that rescore or
        # measure drift: the last w verified ones and those since the last commit.
        self.recent_queries = RecentRows(cache.config.window + 2 * self.HEADROOM)
        self.scale: float | None = None
        self.sinks: torch.Tensor | None = None
        self.drift_reference: torch.Tensor | None = None
        self.record_past = False
        self.mass_log: list[tuple[int, float]] = []  # (position, share of attention mass kept), measurement mode
        # Indexed mode (`attend_in_place`): a store policy whose store sits on the compute device and whose kernels run
        # in Triton keeps no working-set copy; the backend attends the store in place at `positions`.
        self.indexed = False
        self.returned_keys: torch.Tensor | None = None
        # Retrieval policies (`Policy.retrieves`): the policy's summary of every committed page (`pages.keys`), and
        # the rows the queries of the last forward attended (`[B, H_kv, L, K]`).
        self.pages: Rows | None = None
        self.retrieved: torch.Tensor | None = None

    # Views of the storage (the mixin's `keys`/`values` attributes are read-only views here).
    @property
    def keys(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_keys

    @keys.setter
    def keys(self, value) -> None:
        if value is not None:
            raise AttributeError("RiftLayer.keys is a view of the working set; write through `update`.")

    @property
    def values(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_values

    @values.setter
    def values(self, value) -> None:
        if value is not None:
            raise AttributeError("RiftLayer.values is a view of the working set; write through `update`.")

    @property
    def positions(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_positions

    @property
    def queries(self) -> torch.Tensor | None:
        """The recent queries, `[B, H_q, n, D]` (None before any was recorded)."""
        return self.recent_queries.used

    @property
    def retrieving(self) -> bool:
        """Whether each new query attends its own rows, chosen by the policy (`RiftRetrievalLayer`, once compressed)."""
        return False

    @property
    def attended_positions(self) -> torch.Tensor | None:
        """`[H_kv, N]`: the positions the newest query attended (the working set's, or its own retrieved rows)."""
        if self.retrieving and self.retrieved is not None:
            return self.retrieved[0, :, -1]
        return self.positions

    @property
    def store_keys(self) -> torch.Tensor | None:
        return None if self.store is None else self.store.used_keys

    @property
    def store_values(self) -> torch.Tensor | None:
        return None if self.store is None else self.store.used_values

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        config = self.cache.config
        capacity = key_states.shape[-2] + self.HEADROOM
        if config.keeps_store:
            store = config.store_device or self.device
            if config.store_dtype is None:
                self.store = Rows(key_states, capacity, device=store)
            else:
                self.store = QuantizedRows(
                    key_states, config.store_dtype, config.store_group_size, config.store_residual, device=store
                )
            on_device = torch.device(store) == torch.device(self.device)
            self.indexed = (
                on_device and config.attend_in_place and self.cache.policy.keeps_store and uses_triton(key_states)
            )
        if config.kv_dtype is None:
            self.working = WorkingSet(key_states, capacity, with_kv=not self.indexed)
        else:  # the selection in kv_dtype; sinks and the recent window in the model's dtype
            self.working = QuantizedWorkingSet(
                key_states, capacity, config.kv_dtype, config.kv_group_size, config.n_sink
            )
        self.is_initialized = True

    def activate_past_recording(self, **_) -> None:
        self.record_past = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new states after the working set; return the working set plus them (`[B, H_kv, N + q, D]`)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        q = key_states.shape[-2]
        self.working.append(key_states, value_states, self.seen)
        if self.store is not None:
            self.store.append(key_states, value_states)
        self.seen += q
        if not self.record_past:
            self.committed = self.stored
        out = (self.store_keys, self.store_values) if self.indexed else (self.keys, self.values)
        # The backend recognises this forward by the very key tensor handed back here.
        self.returned_keys = out[0]
        ACTIVE_LAYER.set(self)
        return out

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        # Stored entries get the virtual positions just before the first query: all visible, new tokens causal.
        stored = self.stored
        return stored + query_length, self.seen - stored

    def get_max_length(self) -> int:
        return -1

    @property
    def stored(self) -> int:
        return 0 if self.working is None else self.working.attended

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove > 0:
            raise ValueError(
                f"RiftLayer.crop takes a negative number of tokens to remove, got {tokens_to_remove}; a positive "
                "absolute length cannot be honoured once entries have been evicted."
            )
        n = -tokens_to_remove
        if n == 0 or not self.is_initialized:
            return
        if n > self.stored - self.committed:
            raise ValueError(
                f"Cannot roll back {n} tokens: only {self.stored - self.committed} were written since the last commit "
                "and older entries may have been evicted. Call `activate_past_recording()` before generating so "
                "that compression waits for verification."
            )
        self.working.length -= n
        if self.store is not None:
            self.store.length -= n
        self.seen -= n
        self.recent_queries.drop(n)
        self.mass_log = [entry for entry in self.mass_log if entry[0] < self.seen]

    def offload(self) -> None:
        raise NotImplementedError("RiftCache layers cannot be offloaded; use RiftConfig(store_device='cpu').")

    def prefetch(self) -> None:
        return None

    def reset(self) -> None:
        self.__init__(self.cache, self.layer_idx)

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("RiftCache supports batch size 1 only.")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("RiftCache supports batch size 1 only.")

    def observe(self, query: torch.Tensor, key: torch.Tensor, scale: float, sinks: torch.Tensor | None) -> None:
        """
        Receive the queries of the forward that just updated this layer.

        Args:
            query: `[B, H_q, q, D]`, the new positions `[seen - q, seen)`.
            key: `[B, H_kv, N, D]`, what `update` returned (working set plus the new keys).
        """
        config = self.cache.config
        self.scale, self.sinks = scale, sinks
        q = query.shape[2]
        # Prefill scores: only while nothing was evicted (the keys are then every position) and the chunk holds the
        # whole observation window, so a 2-token re-feed never replaces the prompt's scores.
        if (
            config.is_scored
            and self.SCORES_PROMPT
            and self.selected is None
            and self.stored == self.seen
            and q >= min(config.window, self.seen)
        ):
            window = min(config.window, q)
            scoring = self.cache.scoring_query(self.layer_idx, query[:, :, -window:])
            self.prefill_scores = self.cache.policy.score(scoring, key, scale, sinks)[0]
        if self.cache.records_queries:
            # Kept until commit trims them to the window: a rollback must leave the last w verified queries.
            self.recent_queries.append(query.detach())
        if config.track_attention_mass and self.store is not None and self.seen > q:  # decode steps
            self._log_attention_mass(query)

    def _log_attention_mass(self, query: torch.Tensor) -> None:
        """Share of the full-cache attention mass that falls on the retained positions, per new query position (one
        batched product over the chunk's queries, causal within it)."""
        batch, _, q, dim = query.shape
        length, first = self.seen, self.seen - q
        keys = self.store_keys[:, :, :length].to(query.device).float()
        h_kv = keys.shape[1]
        queries = query.float().view(batch, h_kv, -1, q, dim)  # query head h * group + g reads KV head h
        logits = torch.einsum("bhgqd,bhtd->bhgqt", queries, keys) * self.scale
        steps = torch.arange(length, device=query.device)
        causal = steps[None] <= (first + torch.arange(q, device=query.device))[:, None]  # [q, T]
        probs = torch.softmax(logits.masked_fill(~causal, float("-inf")), dim=-1)
        # What each query attends: its own retrieved rows, or the working set (later positions fall under the mask).
        visible = (self.retrieved[0] if self.retrieving else self.positions[:, None]).to(query.device)
        kept = torch.zeros(h_kv, visible.shape[1], length, device=query.device)
        kept.scatter_reduce_(2, visible.clamp(max=length - 1), (visible < length).float(), reduce="amax")
        shares = (probs * kept[None, :, None]).sum(-1).mean(dim=(0, 1, 2))  # [q]
        self.mass_log.extend(zip(range(first, length), shares.tolist(), strict=True))

    def commit(self, rescore: bool, selected: torch.Tensor | None = None) -> None:
        """Everything stored is verified: evict what the policy does not keep; rescore if the schedule says so (with
        `selected` as the new selection when the cache chose it for every layer at once)."""
        cache = self.cache
        self.recent_queries.trim(cache.config.window)
        if self.is_initialized and self.seen > cache.budget:
            self._commit_compressed(rescore, selected)
        elif self.is_initialized:
            self.working.commit()
        if isinstance(self.store, QuantizedRows):
            self.store.commit(self.seen)
        self.committed = self.stored

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        """A commit past the budget: the first one selects from the prompt's scores; later ones keep the selection
        (these policies never rescore)."""
        if rescore:
            raise ValueError(
                f"Policy {self.cache.config.policy!r} refreshes its selection but keeps no store to re-select from; "
                "give the policy class `keeps_store = True` (or a schedule that never refreshes)."
            )
        if not self.compressed:
            self._compress_prompt()
        self.working.commit()

    def _summarise_pages(self, rows, committed: int) -> None:
        """Append the policy's summary of every whole page among the first `committed` rows of `rows` (row =
        position: the working set of a retrieval policy, the store of page-round) not yet summarised (`self.pages`,
        kept on the compute device). Only the new pages' keys are read (dequantised, from a quantised store)."""
        config = self.cache.config
        page, n_sink = config.block_size, config.n_sink
        whole = max(0, (committed - n_sink) // page)
        done = 0 if self.pages is None else self.pages.length
        if whole <= done and self.pages is not None:
            return
        keys = rows.key_rows(n_sink + done * page, n_sink + whole * page).to(self.device)
        summaries = self.cache.policy.summarise(keys.unflatten(2, (whole - done, page)))
        if self.pages is None:
            self.pages = Rows(summaries, whole + self.HEADROOM, with_values=False)
        self.pages.append(summaries, None)

    def _recent(self) -> int:
        cache = self.cache
        if cache.config.snapkv_grow:
            return max(cache.recent, self.seen - cache.prompt_length + cache.recent)
        if self.selected is not None and self.selected.shape[-1] < cache.n_select:
            # A prompt with fewer candidates than selection slots (a short prompt): the window takes the unused slots,
            # so the layer still holds `budget` entries. The selection lies below the window, so they never overlap.
            return cache.budget - cache.config.n_sink - self.selected.shape[-1]
        return cache.recent

    def _compress_prompt(self) -> None:
        """The first compression of a policy without a store: select from the prompt's scores, drop the rest."""
        cache = self.cache
        if cache.n_select > 0:
            if self.prefill_scores is None:
                raise RuntimeError(
                    f"Policy {cache.config.policy!r} scores the prompt with its queries, but layer {self.layer_idx} "
                    "never saw them: load the model with attn_implementation='rift' (or call "
                    "model.set_attn_implementation('rift')) after `import rift_hf`."
                )
            hi = min(self.seen - self._recent(), self.prefill_scores.shape[-1])
            self.selected = cache.policy.select(self.prefill_scores[None], cache.config.n_sink, hi, cache.n_select)
        # Until now every token is stored at its own row, so positions index the rows.
        self._build(self.working.keys, self.working.values)

    def _build(self, keys: torch.Tensor | None, values: torch.Tensor | None, gather=None) -> None:
        """Lay out sinks, the selection and the recent window from rows `keys`/`values` (row = position), or from
        the rows `gather(index)` returns (a quantised store dequantising only them)."""
        n_sink = self.cache.config.n_sink
        heads, device = self.working.shape[1], self.device
        selected = self.selected if self.selected is not None else torch.empty(heads, 0, dtype=torch.long)
        selected = selected.to(device)
        recent = self._recent()
        if recent == self.cache.recent:
            # Sinks, selection and recent window are disjoint: the selection lies in [n_sink, seen - recent).
            sinks = torch.arange(n_sink, device=device).expand(heads, -1)
            tail = torch.arange(self.seen - recent, self.seen, device=device).expand(heads, -1)
            index = torch.cat([sinks, selected, tail], dim=-1)
        else:
            # A window widened by unused selection slots (short prompt) or growing (original SnapKV) may reach into
            # the selection: take the union (a host sync, but only on these rare rebuilds).
            every = torch.arange(self.seen, device=device).expand(heads, -1)
            keep = keep_mask(every, self.seen, n_sink, recent, selected)
            counts = keep.sum(-1)
            if bool((counts != counts[0]).any()):
                raise RuntimeError(f"Internal error: heads keep different counts {counts.tolist()}.")
            index = keep.nonzero()[:, 1].view(heads, -1)
            recent = min(recent, index.shape[-1] - n_sink)
            selected = index[:, n_sink : index.shape[-1] - recent]
        ring = None if self.cache.config.snapkv_grow else recent
        positions = None
        if gather is not None:  # rows already in the order of `index`
            keys, values = gather(index)
            index, positions = torch.arange(index.shape[-1], device=device).expand(heads, -1), index
        self.working.build(keys, values, index, n_sink + selected.shape[-1], ring, self.HEADROOM, positions)
        self.compressed = True


class RiftStoreLayer(RiftLayer):
    """
    A layer of a store policy (`rift-dyn`, `rift-ada`, `page-ahead`, `page-round`): `store` keeps every token (full
    precision or quantised, `store_dtype`; on another device with `store_device`; attended in place with
    `attend_in_place`), and the working set is re-selected from it when the policy's schedule says so. The first
    selection is made like a rescoring (the last `window` queries over the store), which right after the prefill is
    exactly SnapKV on the prompt.
    """

    SCORES_PROMPT = False

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        if rescore or not self.compressed:
            self._rescore(selected)
        else:
            self.working.commit()

    def drift_summary(self) -> torch.Tensor | None:
        """Mean recent query over heads and positions, L2-normalised: `[D]`."""
        if self.queries is None or self.queries.shape[2] == 0:
            return None
        mean = self.queries[:, :, -self.cache.config.window :].float().mean(dim=(0, 1, 2))
        return mean / mean.norm().clamp_min(1e-12)

    def _rescore(self, selected: torch.Tensor | None = None) -> None:
        """Re-select from the whole store with the last `w` queries (or take `selected`, chosen by the cache for every
        layer at once: `RiftCache._select_pages_stacked`), and rebuild the working set from it."""
        config = self.cache.config
        if self.queries is None or self.queries.shape[2] == 0:
            raise RuntimeError(
                f"{config.policy} rescoring needs the recent queries of layer {self.layer_idx}: load the drafter with "
                "attn_implementation='rift' after `import rift_hf`."
            )
        policy, hi = self.cache.policy, self.seen - self._recent()
        if selected is not None:
            self.selected = selected
        elif policy.summarises_pages:  # pages scored from their summaries, kept up to date at every refresh
            self._summarise_pages(self.store, self.seen)
            pages, count = self.pages.used_keys, self.cache.n_select
            query = self.cache.scoring_query(self.layer_idx, self.queries)
            self.selected = policy.select_pages(query, pages, self.scale, config.n_sink, hi, count)
        else:
            query = self.cache.scoring_query(self.layer_idx, self.queries)
            keys = self.store.used_keys  # every stored key (dequantised, from a quantised store)
            scores = policy.score(query, keys.to(query.device), self.scale, self.sinks)
            self.selected = policy.select(scores, config.n_sink, hi, self.cache.n_select)
        if self.indexed:
            self._build(None, None)
        elif isinstance(self.store, QuantizedRows):
            self._build(None, None, gather=self.store.gather)  # only the kept rows are dequantised
        else:
            self._build(self.store.used_keys, self.store.used_values)
        if self.cache.schedule.logs_drift:
            self.drift_reference = self.drift_summary()


class RiftRetrievalLayer(RiftLayer):
    """
    A layer of a retrieval policy (`page-retrieval`): nothing is evicted, the working set keeps every token and each
    committed page gets the policy's summary (`pages`); once past the budget, each new query attends only its own
    `budget` rows (`retrieve`, called by the attention backend).
    """

    SCORES_PROMPT = False

    @property
    def retrieving(self) -> bool:
        return self.compressed

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        self.working.commit()
        self._summarise_pages(self.working, self.working.committed)
        self.compressed = True

    def retrieve(self, query: torch.Tensor, scale: float) -> torch.Tensor:
        """The rows each new query attends, `[B, H_kv, L, budget]` (a retrieval policy's `retrieve`)."""
        cache = self.cache
        first = self.seen - query.shape[2]
        index = cache.policy.retrieve(query, self.pages.used_keys, first, scale, cache.recent, cache.n_select)
        self.retrieved = index
        return index


class RiftStateLayer(LinearAttentionLayer):
    """
    A linear-attention / SSM / short-conv layer whose states can be rolled back.

    In assisted generation the first forward of each drafting round feeds only verified tokens; the states right
    after it are snapshotted. A rollback restores that snapshot, and the cache reports the snapshot's length so
    that the drafter re-feeds the accepted tokens: the state then equals a fresh recompute over them.
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.snapshot: dict[str, dict[int, torch.Tensor]] | None = None
        self._take_snapshot = dict.fromkeys(range(self.number_of_states), False)
        self._take_recurrent = dict.fromkeys(range(self.number_of_states), False)

    def arm_snapshot(self) -> None:
        self.snapshot = {"conv": {}, "recurrent": {}}
        for i in range(self.number_of_states):
            self._take_snapshot[i] = True
            self._take_recurrent[i] = True

    def update_conv_state(self, conv_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        full = super().update_conv_state(conv_states, state_idx, **kwargs)
        if self._take_snapshot[state_idx] and self.snapshot is not None:
            width = self.conv_kernel_size[state_idx]
            kept = full[..., -width:]
            if kept.shape[-1] < width:
                kept = torch.nn.functional.pad(kept, (width - kept.shape[-1], 0))
            self.snapshot["conv"][state_idx] = kept.clone()
            self._take_snapshot[state_idx] = False
        return full

    def update_recurrent_state(self, recurrent_states: torch.Tensor, state_idx: int = 0, **kwargs) -> torch.Tensor:
        out = super().update_recurrent_state(recurrent_states, state_idx, **kwargs)
        if self._take_recurrent[state_idx] and self.snapshot is not None:
            self.snapshot["recurrent"][state_idx] = out.detach().clone()
            self._take_recurrent[state_idx] = False
        return out

    def activate_past_recording(self, **_) -> None:
        super().activate_past_recording()
        # transformers 5.25 can keep a layer's per-token states for rollback; the snapshot makes them unneeded.
        self.recurrent_states_to_keep = 0

    def restore(self, length: int) -> None:
        """Put the states back as they were right after the last round's verified tokens (`length` of them)."""
        for i, conv in self.snapshot["conv"].items():
            self.conv_states[i] = conv.clone()
        for i, state in self.snapshot["recurrent"].items():
            self.recurrent_states[i].copy_(state)
        if hasattr(self, "cumulative_length_linear"):  # the layer's own token count (transformers 5.25)
            self.cumulative_length_linear.fill_(length)

    @property
    def is_croppable(self) -> bool:
        return True

    def crop(self, tokens_to_remove: int) -> None:
        # Rollback is driven by `RiftCache.crop` through `restore`; here only trim recorded conv history (and the
        # per-forward recurrent states transformers 5.25 records while `record_past` is on).
        for i in range(self.number_of_states):
            if self.is_conv_states_initialized[i]:
                self.conv_states[i] = self.conv_states[i][..., -self.conv_kernel_size[i] :]
        if hasattr(self, "recurrent_states_history"):
            self.recurrent_states_history = {i: [] for i in range(self.number_of_states)}


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
        decoder_config = config.get_text_config(decoder=True)
        head_dim = getattr(decoder_config, "head_dim", None) or (
            decoder_config.hidden_size // decoder_config.num_attention_heads
        )
        check_group_sizes(rift_config, head_dim)
        layer_types, per_layer_kwargs = get_layer_types_and_kwargs(decoder_config)
        policy = rift_config.policy_object
        layer_class = RiftRetrievalLayer if policy.retrieves else RiftStoreLayer if policy.keeps_store else RiftLayer
        layers = []
        for idx, (layer_type, kwargs) in enumerate(zip(layer_types, per_layer_kwargs, strict=True)):
            if layer_type == "full_attention":
                layers.append(layer_class(self, idx))
            elif layer_type in _STATE_TYPES:
                layers.append(RiftStateLayer(**kwargs))
            elif layer_type in _PASSTHROUGH_TYPES:
                layers.append(DYNAMIC_LAYER_TYPE_MAPPING[layer_type](**kwargs))
            else:
                raise ValueError(
                    f"RiftCache does not support layer type {layer_type!r} (layer {idx} of {config.model_type}); "
                    f"supported: full_attention, {', '.join(_PASSTHROUGH_TYPES + _STATE_TYPES)}."
                )
        super().__init__(layers=layers)
        self.rift_layers = [layer for layer in self.layers if isinstance(layer, RiftLayer)]
        self.state_layers = [layer for layer in self.layers if isinstance(layer, RiftStateLayer)]
        self.sliding_layers = [layer for layer in self.layers if isinstance(layer, DynamicSlidingWindowLayer)]
        self._first_attention = next(
            (i for i, layer in enumerate(self.layers) if isinstance(layer, CacheLayerMixin)), None
        )
        self.policy = rift_config.policy_object
        self.selection_head = None
        if rift_config.selection_head is not None:
            self.selection_head = SelectionHead.load(rift_config.selection_head).requires_grad_(False)
        self.schedule = self.policy.schedule()
        self.signals = Signals(alpha=rift_config.al_alpha, entropy_window=rift_config.check_interval)
        self.records_queries = rift_config.keeps_store or self.schedule.needs_drift
        self.budget: float = float("inf")
        self.recent = 0
        self.n_select = 0
        self.prompt_length: int | None = None
        self.record_past = False
        self.events: list[dict] = []  # one per rescoring: position, seconds, reason, signals
        self._last_select = 0
        self._last_check = 0
        self._snapshot_length: int | None = None
        self._awaiting_verified = False
        self._verified_forward_done = False

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

    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        layer = self.layers[layer_idx]
        if key_states.shape[0] != 1:
            raise ValueError(
                f"RiftCache supports batch size 1, got {key_states.shape[0]}: call generate once per prompt."
            )
        if isinstance(layer, RiftLayer) and self.prompt_length is None:
            self._resolve_budget(layer.seen + key_states.shape[-2], key_states)
        out = super().update(key_states, value_states, layer_idx, *args, **kwargs)
        if self._awaiting_verified and layer_idx == self._first_attention:
            # The first forward after a rollback (or the prefill) feeds only verified tokens.
            self._snapshot_length = layer.get_seq_length()
            self._awaiting_verified = False
            self._verified_forward_done = True
        return out

    def _resolve_budget(self, prompt_length: int, like: torch.Tensor) -> None:
        self.prompt_length = prompt_length
        self.config = self.config.fitted(prompt_length)  # window / block size shrunk to a short prompt's budget
        self.policy = self.config.policy_object
        budget = self.config.resolve_budget(prompt_length)
        self.budget = budget
        if budget != float("inf"):
            self.recent = self.config.recent_tokens(budget)
            self.n_select = budget - self.recent - self.config.n_sink
            if self.config.kv_equal_bytes:
                # The budget is bytes: the selection's share of them, in kv_dtype rows (sinks and window stay).
                if self.config.kv_equal_bytes is not True:  # bytes counted as if the model ran in this dtype
                    like = like.new_zeros(1, 1, 1, like.shape[-1], dtype=getattr(torch, self.config.kv_equal_bytes))
                keys, values = (
                    Quantizer(like, self.config.kv_dtype, self.config.kv_group_size, per_channel)
                    for per_channel in (True, False)  # keys per channel, values per token
                )
                ratio = 2 * like.shape[-1] * like.element_size() / (keys.row_bytes(like) + values.row_bytes(like))
                self.n_select = self.policy.round_selection(keys.unpadded(int(self.n_select * ratio)))
                self.budget = self.config.n_sink + self.recent + self.n_select
        self._last_select = self._last_check = prompt_length

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
        if self._snapshot_length is not None:
            seen = self.get_seq_length()
            target = seen + tokens_to_remove
            if target < self._snapshot_length - 1:
                raise ValueError(
                    f"Cannot roll back to {target} tokens: the last verified forward ended at {self._snapshot_length} "
                    "and earlier entries may be compressed or folded into recurrent states."
                )
            if self.state_layers:
                target = self._snapshot_length
                for layer in self.state_layers:
                    layer.restore(target)
            tokens_to_remove = -(seen - max(target, self._snapshot_length))
        super().crop(tokens_to_remove)
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
        for layer in self.sliding_layers:
            # Past recording keeps every row until transformers' first crop (after round one); rows before a commit
            # point are never rolled back, so they go now: a sliding layer holds its window from the first draft on.
            if layer.record_past and layer.is_initialized and layer.get_seq_length() >= layer.sliding_window:
                layer.crop(0)
        if not self.rift_layers or self.prompt_length is None or self.budget == float("inf"):
            return
        seen = self.rift_layers[0].seen
        rescore, reason, signals = False, "", None
        started = self.rift_layers[0].selected is not None
        may_refresh = not rollback or self.policy.refresh_at_rollback
        if (
            started
            and may_refresh
            and seen > self.budget
            and self.schedule.due(seen - self._last_select, seen - self._last_check)
        ):
            self._last_check = seen
            if self.records_queries and self.schedule.logs_drift:
                self.signals.drift = self._drift()
            signals = self.signals.snapshot()
            rescore, reason = self.schedule.decide(seen - self._last_select, signals)
        tick = time.perf_counter()
        chosen = self._select_pages_stacked() if rescore and self.policy.stacks_layers else None
        for i, layer in enumerate(self.rift_layers):
            layer.commit(rescore, None if chosen is None else chosen[i])
        if rescore:
            device = self.rift_layers[0].device
            if device is not None and torch.device(device).type == "cuda":
                torch.cuda.synchronize(device)
            self.events.append(
                {"position": seen, "seconds": time.perf_counter() - tick, "reason": reason, "signals": signals}
            )
        if rescore or (not started and self.rift_layers[0].selected is not None):
            self._last_select = self._last_check = seen

    def _select_pages_stacked(self) -> tuple[torch.Tensor, ...] | None:
        """
        A page policy's refresh of every compressed layer in one `select_pages` call: the layers' KV heads stacked
        as heads of one layer (`Policy.stacks_layers`: each head is chosen on its own), so scoring and ranking run
        once per refresh instead of once per layer. None (each layer then selects for itself) unless the layers are
        alike: compressed, the same heads, head size, length, window, scale and device, a store in full precision.
        """
        layers, config = self.rift_layers, self.config
        first = layers[0]
        if not all(
            layer.compressed
            and isinstance(layer.store, (Rows, QuantizedRows))
            and layer.queries is not None
            and layer.queries.shape[2] > 0
            and layer.queries.shape[1] == first.queries.shape[1]  # heads of a group kept together when stacked
            and layer.store.shape == first.store.shape
            and layer.seen == first.seen
            and layer.scale == first.scale
            and layer.device == first.device
            and layer._recent() == first._recent()
            for layer in layers
        ):
            return None
        for layer in layers:
            layer._summarise_pages(layer.store, layer.seen)
        query = torch.cat([self.scoring_query(layer.layer_idx, layer.queries)[:, :, -1:] for layer in layers], dim=1)
        pages = torch.cat([layer.pages.used_keys for layer in layers], dim=1)
        hi = first.seen - first._recent()
        selected = self.policy.select_pages(query, pages, first.scale, config.n_sink, hi, self.n_select)
        return selected.split([layer.pages.shape[1] for layer in layers])

    def _drift(self) -> float | None:
        values = []
        for layer in self.rift_layers:
            now = layer.drift_summary()
            if now is not None and layer.drift_reference is not None:
                values.append(1.0 - float(now @ layer.drift_reference))
        return sum(values) / len(values) if values else None

    def kv_bytes(self) -> dict[str, int]:
        """Bytes held now: `working` (what attention reads: compressed working sets and other attention layers)
        and `store` (the full stores kept by rift-dyn/ada or the attention-mass measurement)."""
        working = store = 0
        for layer in self.layers:
            if isinstance(layer, RiftLayer):
                if layer.store is not None:
                    store += layer.store.nbytes()
                    if layer.pages is not None and not layer.retrieving:  # page-round's summaries, beside the store
                        store += layer.pages.nbytes()
                if layer.retrieving:  # every token is kept; a query reads `budget` rows and the page summaries
                    store += layer.working.nbytes()
                    working += layer.working.nbytes(min(layer.stored, self.budget)) + layer.pages.nbytes()
                elif layer.working is not None:  # in place, the rows attended are the store's
                    working += layer.store.nbytes(layer.stored) if layer.indexed else layer.working.nbytes()
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
