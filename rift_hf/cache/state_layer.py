"""`RiftStateLayer`: a linear-attention / SSM / short-conv layer whose states can be rolled back."""

from __future__ import annotations

import torch
from transformers.cache_utils import LinearAttentionLayer


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
