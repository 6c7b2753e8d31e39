"""`RiftLayer`: what every compressed full-attention layer shares, whatever its policy's mode.

It speaks transformers' cache-layer protocol over the storage (`rift_hf.storage`), records what the policies score
with, and commits verified tokens; what a commit past the budget does is the mode's (`select_layer.py`,
`store_layer.py`, `retrieval_layer.py`), and what to keep is the policy's (`cache.policy`).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Protocol

import torch
from transformers.cache_utils import CacheLayerMixin

from ..config import RiftConfig
from ..policies import Policy, Schedule
from ..storage import QuantizedRows, RecentRows, Rows, WorkingSet, new_store, new_working_set
from .attention_mass import attention_mass_shares
from .layout import lay_out, window_size

# The compressed layer that was updated last: the attention backend, which runs right after `update` in the same
# attention module, hands it the queries that `update` never sees (it checks that it received the very key tensor
# this layer returned, so another model's attention can never feed this cache).
ACTIVE_LAYER: ContextVar[RiftLayer | None] = ContextVar("rift_active_layer", default=None)


class LayerCache(Protocol):
    """What a layer reads of the cache it belongs to (`RiftCache` is one): the config and policy in force (`auto`'s
    choice once the prompt is seen), the sizes resolved then (`rift_hf.budget.layout`; the reading sizes while a
    prompt is read in chunks), the refresh clock, and the scorer's view of a query."""

    config: RiftConfig
    policy: Policy | None  # None only before `auto` has chosen (no layer reads it then)
    schedule: Schedule | None
    prompt_length: int | None
    budget: int | float
    recent: int
    n_select: int
    reading: object | None  # a `PromptReading` while the prompt is read in chunks
    records_queries: bool

    def scoring_query(self, layer_idx: int, query: torch.Tensor) -> torch.Tensor: ...


class StorageViews:
    """Read-only views of a compressed layer's storage, what transformers, the backend and the policies read: the
    working set's used rows (the cache-layer mixin's `keys`/`values` are views here, not tensors of their own), the
    store's, the recent queries, and the positions each query attended."""

    working: WorkingSet | None
    store: Rows | QuantizedRows | None
    recent_queries: RecentRows

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_keys

    @property
    def values(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_values

    @property
    def positions(self) -> torch.Tensor | None:
        return None if self.working is None else self.working.used_positions

    @property
    def queries(self) -> torch.Tensor | None:
        """The recent queries, `[B, H_q, n, D]` (None before any was recorded)."""
        return self.recent_queries.used

    @property
    def retrieving(self) -> bool:
        """Whether each new query attends rows of its own (`RiftRetrievalLayer`, once compressed)."""
        return False

    @property
    def visible_positions(self) -> torch.Tensor | None:
        """`[H_kv, L, N]` (L = 1: every query alike): the positions the queries of the last forward attended."""
        return None if self.positions is None else self.positions[:, None]

    @property
    def attended_positions(self) -> torch.Tensor | None:
        """`[H_kv, N]`: the positions the newest query attended."""
        visible = self.visible_positions
        return None if visible is None else visible[:, -1]

    @property
    def store_keys(self) -> torch.Tensor | None:
        return None if self.store is None else self.store.used_keys

    @property
    def store_values(self) -> torch.Tensor | None:
        return None if self.store is None else self.store.used_values


class RiftLayer(StorageViews, CacheLayerMixin):
    """
    A full-attention cache layer compressed to `budget` past entries per KV head; the subclass is the policy's mode:
    `RiftSelectLayer` (selects once, from the prompt), `RiftStoreLayer` (a full store, re-selected from),
    `RiftRetrievalLayer` (every token kept, each query attends its own pages). `working` is the `WorkingSet` the
    attention reads (`keys`/`values` `[B, H_kv, N, D]` and `positions` `[H_kv, N]` are views of its used rows): sinks
    and selection, a ring for the recent window (unbounded until the first compression), then the rows written since
    the last commit. `store` keeps every token where the policy or the attention-mass measurement needs it.
    """

    is_croppable = True
    # Rows reserved past the budget for the tokens of one drafting round (a longer round grows the buffer).
    HEADROOM = 32

    def __init__(self, cache: LayerCache, layer_idx: int):
        self.is_initialized = False  # all the mixin's __init__ sets besides keys/values, which are views here
        self.cache = cache
        self.layer_idx = layer_idx
        self.seen = 0
        self.committed = 0  # stored entries at the last commit; rollback may not go below
        self.working: WorkingSet | None = None
        self.store: Rows | QuantizedRows | None = None
        self.compressed = False
        self.selected: torch.Tensor | None = None  # [H_kv, S] positions picked by the scorer
        # The last w verified queries and those since the last commit (for rescoring, drift); grown as queries come.
        self.recent_queries = RecentRows(min(cache.config.window, 256) + 2 * self.HEADROOM)
        self.scale: float | None = None
        self.sinks: torch.Tensor | None = None
        self.record_past = False
        self.mass_log: list[tuple[int, float]] = []  # (position, share of attention mass kept), measurement mode
        self.indexed = False  # the backend attends the store in place (`RiftStoreLayer` with `attend_in_place`)
        self.returned_keys: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        config = self.cache.config
        capacity = key_states.shape[-2] + self.HEADROOM
        if config.keeps_store:
            self.store = new_store(config, key_states, capacity, config.store_device or self.device)
        self.working = new_working_set(config, key_states, capacity, with_kv=not self.indexed)
        self.is_initialized = True

    def activate_past_recording(self, **_) -> None:
        self.record_past = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Write the new states after the working set; return the working set plus them (`[B, H_kv, N + q, D]`)."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        self.working.append(key_states, value_states, self.seen)
        if self.store is not None:
            self.store.append(key_states, value_states)
        self.seen += key_states.shape[-2]
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
        """Receive the queries `[B, H_q, q, D]` (positions `[seen - q, seen)`) of the forward that just updated this
        layer, and `key`, what `update` returned to it (`[B, H_kv, N, D]`)."""
        self.scale, self.sinks = scale, sinks
        if self.cache.records_queries:
            # Kept until commit trims them to the window: a rollback must leave the last w verified queries.
            self.recent_queries.append(query.detach())
        if self.cache.config.track_attention_mass and self.seen > query.shape[2] and not self.cache.reading:  # decoding
            self._log_attention_mass(query)

    def _log_attention_mass(self, query: torch.Tensor) -> None:
        """The measurement mode: the share of the full store's attention mass on what each new query attended."""
        shares = attention_mass_shares(query, self.store_keys, self.seen, self.scale, self.visible_positions)
        self.mass_log.extend(shares)

    def commit(self, rescore: bool, selected: torch.Tensor | None = None) -> None:
        """Everything stored is verified: evict what the policy does not keep; rescore if the schedule says so (with
        `selected` as the new selection when the policy chose it for every layer at once)."""
        self.recent_queries.trim(self.cache.config.window)
        if self.is_initialized and self.seen > self.cache.budget:
            self._commit_compressed(rescore, selected)
        elif self.is_initialized:
            self.working.commit()
        if isinstance(self.store, QuantizedRows):
            self.store.commit(self.seen)
        self.committed = self.stored

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        """A commit past the budget: evict, select or refresh as the mode does."""
        raise NotImplementedError

    def recent_window(self) -> int:
        """Tokens of the recent window now (the cache's, unless widened: `layout.window_size`)."""
        return window_size(self.cache, self.seen, self.selected)

    def _build(self, keys: torch.Tensor | None, values: torch.Tensor | None, gather=None) -> None:
        """Lay out sinks, the selection and the recent window from rows `keys`/`values` (row = position), or from
        the rows `gather(index)` returns (`layout.lay_out`)."""
        lay_out(self.working, self.cache, self.seen, self.selected, keys, values, gather, self.HEADROOM)
        self.compressed = True

    def kv_bytes(self) -> tuple[int, int]:
        """Bytes held now, `(working, store)`: what attention reads, and the full store kept beside it."""
        working = 0 if self.working is None else self.working.nbytes()
        return working, 0 if self.store is None else self.store.nbytes()
