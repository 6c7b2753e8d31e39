"""`RiftStoreLayer`: a compressed layer that keeps every token in a store and re-selects its working set from it."""

from __future__ import annotations

import torch

from ..kernels import uses_triton
from ..storage import QuantizedRows, Rows
from .layer import RiftLayer
from .page_summaries import extend_page_summaries


class RiftStoreLayer(RiftLayer):
    """
    A layer of a store policy (`rift-dyn`, `rift-ada`, `page-ahead`, `page-round`): `store` keeps every token and the
    working set is re-selected from it when the policy's schedule says so. The first selection is made like a
    rescoring (the last `window` queries over the store), which right after the prefill is exactly SnapKV on the
    prompt.

    Options of the store (`RiftConfig`): `store_dtype` (quantised; a refresh dequantises only the rows it keeps),
    `store_device` (kept off the compute device) and `attend_in_place` (a store on the compute device, with Triton
    kernels: no working-set copy, the backend attends the store's rows at `positions`). Page policies keep the page
    summaries (`pages`) beside the store, brought up to date at each refresh.
    """

    def __init__(self, cache, layer_idx: int):
        super().__init__(cache, layer_idx)
        self.drift_reference: torch.Tensor | None = None
        self.pages: Rows | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        config, device = self.cache.config, key_states.device
        on_device = torch.device(config.store_device or device) == torch.device(device)
        # Decided before the working set is made: attended in place, it keeps positions only.
        self.indexed = on_device and config.attend_in_place and uses_triton(key_states)
        super().lazy_initialization(key_states, value_states)

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

    def summarise_pages(self) -> None:
        """Bring the page summaries up to the store's length (page policies)."""
        self.pages = extend_page_summaries(
            self.pages, self.store, self.seen, self.cache.policy, self.device, self.HEADROOM
        )

    def _rescore(self, selected: torch.Tensor | None = None) -> None:
        """Re-select from the whole store with the last `w` queries (or take `selected`, chosen by the policy for
        every layer at once: `Policy.select_layers`), and rebuild the working set from it."""
        cache, config = self.cache, self.cache.config
        if self.queries is None or self.queries.shape[2] == 0:
            raise RuntimeError(
                f"{config.policy} rescoring needs the recent queries of layer {self.layer_idx}: load the drafter with "
                "attn_implementation='rift' after `import rift_hf`."
            )
        policy, hi = cache.policy, self.seen - self.recent_window()
        if selected is not None:
            self.selected = selected
        elif policy.summarises_pages:  # pages scored from their summaries, kept up to date at every refresh
            self.summarise_pages()
            query = cache.scoring_query(self.layer_idx, self.queries)
            self.selected = policy.select_pages(
                query, self.pages.used_keys, self.scale, config.n_sink, hi, cache.n_select
            )
        else:
            query = cache.scoring_query(self.layer_idx, self.queries)
            keys = self.store.used_keys  # every stored key (dequantised, from a quantised store)
            scores = policy.score(query, keys.to(query.device), self.scale, self.sinks)
            self.selected = policy.select(scores, config.n_sink, hi, cache.n_select)
        if self.indexed:
            self._build(None, None)
        elif isinstance(self.store, QuantizedRows):
            self._build(None, None, gather=self.store.gather)  # only the kept rows are dequantised
        else:
            self._build(self.store.used_keys, self.store.used_values)
        if cache.schedule.logs_drift:
            self.drift_reference = self.drift_summary()

    def reselect(self, selected: torch.Tensor) -> bool:
        """
        Swap the working set's selection rows for those at `selected` (`[H_kv, S]` positions below the recent window,
        as many as now), read from the store; sinks, the ring and the rows in flight stay where they are, so a
        drafting round goes on (and can still be rolled back) with the new selection. False, changing nothing, when
        the working set has no selection part of that size (a short prompt's window widened over unused slots).
        """
        if (
            not self.compressed
            or self.selected is None
            or self.selected.shape != selected.shape
            or self.recent_window() != self.cache.recent  # else the window may reach into the selection (layout.py)
        ):
            return False
        # Attended in place, positions are the rows; a quantised store dequantises only the rows kept.
        keys, values = (None, None) if self.indexed else self.store.gather(selected)
        self.working.replace_selection(keys, values, selected.to(self.working.device))
        self.selected = selected
        return True

    def kv_bytes(self) -> tuple[int, int]:
        working, store = super().kv_bytes()
        if self.indexed and self.working is not None:  # in place, the rows attended are the store's
            working = self.store.nbytes(self.stored)
        return working, store + (0 if self.pages is None else self.pages.nbytes())
