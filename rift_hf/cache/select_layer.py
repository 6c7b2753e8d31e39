"""`RiftSelectLayer`: a compressed layer that selects once, from the prompt's own scores, and keeps that selection."""

from __future__ import annotations

import torch

from .layer import RiftLayer


class RiftSelectLayer(RiftLayer):
    """
    A layer of the policies that select once (`snapkv`, `rift-stat`, `rift-stat-block`; `swa` selects nothing): the
    prompt's scores are taken from the prefill's last `window` queries (`observe`), and the first commit past the
    budget keeps the sinks, the top-scored positions and the recent window; later commits only move the window.
    """

    def __init__(self, cache, layer_idx: int):
        super().__init__(cache, layer_idx)
        self.prefill_scores: torch.Tensor | None = None  # [H_kv, T] scores of the prompt
        # While a prompt is read in chunks, past the first compression: the scores of the rows held now, `[H_kv, N]`
        # in row order, from the last chunk's queries (`_reselect_held`).
        self.held_scores: torch.Tensor | None = None

    def observe(self, query: torch.Tensor, key: torch.Tensor, scale: float, sinks: torch.Tensor | None) -> None:
        super().observe(query, key, scale, sinks)
        config, q = self.cache.config, query.shape[2]
        # Prefill scores: only while nothing was evicted (the keys are then every position) and the chunk holds the
        # whole observation window, so a 2-token re-feed never replaces the prompt's scores.
        if (
            config.is_scored
            and self.selected is None
            and self.stored == self.seen
            and q >= min(config.window, self.seen)
        ):
            scoring = self.cache.scoring_query(self.layer_idx, query[:, :, -min(config.window, q) :])
            self.prefill_scores = self.cache.policy.score(scoring, key, scale, sinks)[0]
        elif config.is_scored and self.cache.reading and self.compressed and q >= config.window:
            # Rows in position order (the ring is not), scored, the scores put back in row order.
            order = self.positions.argsort(dim=-1)
            sorted_keys = key.gather(2, order[None, :, :, None].expand(key.shape[0], -1, -1, key.shape[-1]))
            scoring = self.cache.scoring_query(self.layer_idx, query[:, :, -config.window :])
            scores = self.cache.policy.score(scoring, sorted_keys, scale, sinks)[0]
            self.held_scores = torch.empty_like(scores).scatter_(1, order, scores)

    def _commit_compressed(self, rescore: bool, selected: torch.Tensor | None) -> None:
        """The first commit past the budget selects from the prompt's scores; later ones keep the selection (these
        policies never rescore)."""
        if rescore:
            raise ValueError(
                f"Policy {self.cache.config.policy!r} refreshes its selection but keeps no store to re-select from; "
                "give the policy class `keeps_store = True` (or a schedule that never refreshes)."
            )
        if not self.compressed:
            self._compress_prompt()
        elif self.cache.reading and self.held_scores is not None:
            self._reselect_held()
        self.working.commit()

    def _compress_prompt(self) -> None:
        """Select from the prompt's scores, drop the rest."""
        cache = self.cache
        if cache.n_select > 0:
            if self.prefill_scores is None:
                raise RuntimeError(
                    f"Policy {cache.config.policy!r} scores the prompt with its queries, but layer {self.layer_idx} "
                    "never saw them: load the model with attn_implementation='rift' (or call "
                    "model.set_attn_implementation('rift')) after `import rift_hf`."
                )
            hi = min(self.seen - self.recent_window(), self.prefill_scores.shape[-1])
            self.selected = cache.policy.select(self.prefill_scores[None], cache.config.n_sink, hi, cache.n_select)
        # Until now every token is stored at its own row, so positions index the rows.
        self._build(self.working.keys, self.working.values)

    def _reselect_held(self) -> None:
        """While reading a prompt in chunks: select again among the rows held (the last selection, the window and the
        chunk just read), by their scores under the chunk's last queries, and rebuild the working set from them."""
        cache, scores, self.held_scores = self.cache, self.held_scores, None
        positions = self.positions  # [H_kv, N], the rows held, in row order
        heads, rows = positions.shape
        by_position = scores.new_full((heads, self.seen), float("-inf")).scatter_(1, positions, scores)
        hi = self.seen - cache.recent
        self.selected = cache.policy.select(by_position[None], cache.config.n_sink, hi, cache.n_select)
        row_of = torch.full((heads, self.seen), -1, dtype=torch.long, device=positions.device)
        row_of.scatter_(1, positions, torch.arange(rows, device=positions.device).expand(heads, -1))
        keys, values = self.working.used_keys, self.working.used_values

        def gather(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            picked = row_of.gather(1, index.to(row_of.device))
            if bool((picked < 0).any()):
                raise RuntimeError("Internal error: a selection made while reading names a row no longer held.")
            expand = picked[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[-1])
            return keys.gather(2, expand), values.gather(2, expand)

        self._build(None, None, gather=gather)
