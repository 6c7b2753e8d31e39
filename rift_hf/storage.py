"""Storage of a compressed cache layer, apart from any policy: preallocated rows, a ring for the recent window.

Nothing here decides what to keep. `Rows` is a `[B, H, capacity, D]` key/value buffer (optionally with a `[H,
capacity]` position per row) that grows by doubling; `WorkingSet` lays a `Rows` out as

    [ fixed: sinks and selected | ring: the recent window | in-flight: written since the last commit ]

so that committing k verified tokens writes k rows into the ring (overwriting its oldest), and a rollback only
shortens the used length. Only `WorkingSet.build` (a new selection) rewrites the fixed part. The bookkeeping is Python
integers: no host synchronisation on the decode path.
"""

from __future__ import annotations

import torch


class Rows:
    """
    Key/value rows `[B, H, capacity, D]` with a used `length`; `positions` (`[H, capacity]`, int64) when asked for.

    `with_kv=False` keeps only the positions (a layer that attends the store in place needs no copy of the rows).
    """

    def __init__(self, like: torch.Tensor, capacity: int, device=None, with_kv: bool = True, with_positions=False):
        batch, heads, _, dim = like.shape
        self.shape = (batch, heads, dim)
        self.dtype, self.device = like.dtype, torch.device(device if device is not None else like.device)
        self.capacity = max(1, capacity)
        self.length = 0
        self.keys = self.values = self.positions = None
        if with_kv:
            self.keys = torch.empty(batch, heads, self.capacity, dim, dtype=self.dtype, device=self.device)
            self.values = torch.empty_like(self.keys)
        if with_positions:
            self.positions = torch.empty(heads, self.capacity, dtype=torch.long, device=self.device)

    def reserve(self, length: int) -> None:
        """Make room for `length` rows (amortised doubling: an append costs O(rows appended))."""
        if length <= self.capacity:
            return
        capacity = max(length, 2 * self.capacity)
        for name in ("keys", "values", "positions"):
            old = getattr(self, name)
            if old is None:
                continue
            axis = old.dim() - 2 if old.dim() == 4 else 1  # rows: dim 2 of keys/values, dim 1 of positions
            shape = list(old.shape)
            shape[axis] = capacity
            new = old.new_empty(shape)
            new.narrow(axis, 0, self.length).copy_(old.narrow(axis, 0, self.length))
            setattr(self, name, new)
        self.capacity = capacity

    def append(self, keys: torch.Tensor, values: torch.Tensor, positions: torch.Tensor | int | None = None):
        """
        Write `q` rows after the used ones (`keys`/`values`: `[B, H, q, D]`; `positions`: `[H, q]`, or an int, the
        first of `q` consecutive positions).
        """
        q = keys.shape[-2]
        self.reserve(self.length + q)
        end = self.length + q
        if self.keys is not None:
            self.keys[:, :, self.length : end].copy_(keys)
            self.values[:, :, self.length : end].copy_(values)
        if self.positions is not None:
            if not isinstance(positions, int):
                self.positions[:, self.length : end].copy_(positions)
            elif q == 1:
                self.positions[:, self.length].fill_(positions)
            else:
                self.positions[:, self.length : end].copy_(torch.arange(positions, positions + q, device=self.device))
        self.length = end

    def move(self, source: int, target: int, count: int) -> None:
        """Copy rows `[source, source + count)` onto `[target, target + count)` (the ranges must not overlap)."""
        if count <= 0:
            return
        if self.keys is not None:
            self.keys[:, :, target : target + count].copy_(self.keys[:, :, source : source + count])
            self.values[:, :, target : target + count].copy_(self.values[:, :, source : source + count])
        if self.positions is not None:
            self.positions[:, target : target + count].copy_(self.positions[:, source : source + count])

    @property
    def used_keys(self) -> torch.Tensor | None:
        return None if self.keys is None else self.keys[:, :, : self.length]

    @property
    def used_values(self) -> torch.Tensor | None:
        return None if self.values is None else self.values[:, :, : self.length]

    @property
    def used_positions(self) -> torch.Tensor | None:
        return None if self.positions is None else self.positions[:, : self.length]

    def nbytes(self, length: int | None = None) -> int:
        """Bytes of `length` rows (default: the used ones) of keys plus values."""
        if self.keys is None:
            return 0
        batch, heads, dim = self.shape
        return 2 * batch * heads * dim * (self.length if length is None else length) * self.keys.element_size()


class WorkingSet(Rows):
    """
    The rows a compressed layer attends: `fixed` rows (sinks and selection), a ring of `ring_size` recent rows, then
    the rows written since the last commit. `ring_size=None` is an unbounded window (original SnapKV appends every
    token). Build one with `build`; `commit` folds the in-flight rows into the ring.
    """

    def __init__(self, like: torch.Tensor, capacity: int, device=None, with_kv: bool = True):
        super().__init__(like, capacity, device, with_kv=with_kv, with_positions=True)
        self.fixed = 0
        self.ring_size: int | None = None
        self.ring_fill = 0
        self.ring_head = 0  # ring slot holding the oldest entry (the next one overwritten)

    @property
    def committed(self) -> int:
        return self.fixed + self.ring_fill

    def build(self, keys, values, index: torch.Tensor, fixed: int, ring_size: int | None, headroom: int) -> None:
        """
        Lay out rows `index` (`[H, n]`, absolute positions = rows of `keys`/`values` `[B, H, T, D]`) as the working
        set: the first `fixed` are sinks and selection, the rest (ascending, the newest last) fill the ring.
        """
        n = index.shape[-1]
        self.reserve(n + headroom)
        index = index.to(self.device)
        if self.keys is not None:
            gather = index.to(keys.device)[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[-1])
            self.keys[:, :, :n].copy_(torch.gather(keys, 2, gather))
            self.values[:, :, :n].copy_(torch.gather(values, 2, gather))
        self.positions[:, :n].copy_(index)
        self.length = n
        self.fixed = fixed
        self.ring_fill = n - fixed
        self.ring_size = ring_size
        self.ring_head = 0

    def commit(self) -> None:
        """The in-flight rows are verified: move them into the ring, overwriting its oldest rows (k row writes)."""
        start = self.committed
        count = self.length - start
        if self.ring_size is None:
            self.ring_fill += count
            return
        room = self.ring_size - self.ring_fill
        in_place = min(count, room)  # a ring that is not full yet takes the first ones where they already are
        self.ring_fill += in_place
        source, left = start + in_place, count - in_place
        if left > self.ring_size:  # only the newest ring_size can stay
            source += left - self.ring_size
            left = self.ring_size
        while left:
            chunk = min(left, self.ring_size - self.ring_head)
            self.move(source, self.fixed + self.ring_head, chunk)
            self.ring_head = (self.ring_head + chunk) % self.ring_size
            source += chunk
            left -= chunk
        self.length = self.committed
