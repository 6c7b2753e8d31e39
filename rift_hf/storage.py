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

from .config_checks import STORE_DTYPES


class Rows:
    """
    Key/value rows `[B, H, capacity, D]` with a used `length`; `positions` (`[H, capacity]`, int64) when asked for.

    `with_kv=False` keeps only the positions (a layer that attends the store in place needs no copy of the rows);
    `with_values=False` only keys (rows of per-page key summaries).
    """

    def __init__(
        self,
        like: torch.Tensor,
        capacity: int,
        device=None,
        with_kv: bool = True,
        with_positions=False,
        with_values: bool = True,
    ):
        batch, heads, _, dim = like.shape
        self.shape = (batch, heads, dim)
        self.dtype, self.device = like.dtype, torch.device(device if device is not None else like.device)
        self.length = 0
        self.keys = self.values = self.positions = None
        self.with_values = with_values
        self._allocate(capacity, with_kv, with_positions)

    def _allocate(self, capacity: int, with_kv: bool, with_positions: bool) -> None:
        """Fresh, empty buffers of `capacity` rows (the old ones are released)."""
        batch, heads, dim = self.shape
        self.capacity = max(1, capacity)
        self.length = 0
        if with_kv:  # zeros: a compiled drafting step reads (masked) rows past the used ones, which must be finite
            self.keys = torch.zeros(batch, heads, self.capacity, dim, dtype=self.dtype, device=self.device)
            self.values = torch.zeros_like(self.keys) if self.with_values else None
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
            axis = 2 if old.dim() == 4 else 1  # rows: dim 2 of keys/values, dim 1 of positions
            shape = list(old.shape)
            shape[axis] = capacity
            new = old.new_zeros(shape)
            new.narrow(axis, 0, self.length).copy_(old.narrow(axis, 0, self.length))
            setattr(self, name, new)
        self.capacity = capacity

    def append(self, keys: torch.Tensor, values: torch.Tensor | None, positions: torch.Tensor | int | None = None):
        """
        Write `q` rows after the used ones (`keys`/`values`: `[B, H, q, D]`; `positions`: `[H, q]`, or an int, the
        first of `q` consecutive positions).
        """
        q = keys.shape[-2]
        self.reserve(self.length + q)
        end = self.length + q
        if self.keys is not None:
            self.keys[:, :, self.length : end].copy_(keys)
            if self.values is not None:
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
        if self.values is not None:
            self.values[:, :, target : target + count].copy_(self.values[:, :, source : source + count])
        if self.positions is not None:
            self.positions[:, target : target + count].copy_(self.positions[:, source : source + count])

    @property
    def used_keys(self) -> torch.Tensor | None:
        return None if self.keys is None else self.keys[:, :, : self.length]

    def key_rows(self, start: int, stop: int) -> torch.Tensor:
        """Keys of rows `[start, stop)` (a view)."""
        return self.keys[:, :, start:stop]

    def gather(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[B, H, n, D]` of row numbers `index` (`[H, n]`, < `length`), as `QuantizedRows.gather`."""
        batch, _, dim = self.shape
        index = index.to(self.device)[None, :, :, None].expand(batch, -1, -1, dim)
        return torch.gather(self.used_keys, 2, index), torch.gather(self.used_values, 2, index)

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
        tensors = 2 if self.values is not None else 1
        return tensors * batch * heads * dim * (self.length if length is None else length) * self.keys.element_size()


class RecentRows:
    """
    The newest rows of a stream (`[B, H, n, D]`, e.g. a layer's recent queries) in a preallocated buffer: appending
    writes after the used rows, `trim` forgets all but the newest `keep`, `drop` removes the newest. The buffer is
    compacted (the used rows moved to its front) only when an append does not fit, so a step costs O(rows appended)
    instead of a copy of the whole window.
    """

    def __init__(self, capacity: int):
        self.default_capacity = capacity
        self.buffer: torch.Tensor | None = None
        self.start = self.end = 0

    def __len__(self) -> int:
        return self.end - self.start

    @property
    def used(self) -> torch.Tensor | None:
        return None if self.buffer is None else self.buffer[:, :, self.start : self.end]

    def append(self, rows: torch.Tensor) -> None:
        n = rows.shape[2]
        if self.buffer is None or self.end + n > self.buffer.shape[2]:
            self._compact(len(self) + n, rows)
        self.buffer[:, :, self.end : self.end + n].copy_(rows)
        self.end += n

    def trim(self, keep: int) -> None:
        """Keep only the newest `keep` rows (a buffer grown for a long chunk shrinks back to its default size)."""
        self.start = max(self.start, self.end - keep)
        if self.buffer is not None and self.buffer.shape[2] > self.default_capacity >= len(self):
            self._compact(len(self), self.buffer)

    def drop(self, n: int) -> None:
        """Forget the newest `n` rows."""
        self.end = max(self.start, self.end - n)

    def _compact(self, needed: int, like: torch.Tensor) -> None:
        capacity = max(self.default_capacity, needed)
        old = self.used
        if self.buffer is None or capacity != self.buffer.shape[2] or self.start < len(self):
            shape = (*like.shape[:2], capacity, like.shape[-1])
            self.buffer = like.new_empty(shape)
        if old is not None and old.shape[2]:
            self.buffer[:, :, : old.shape[2]].copy_(old)  # a new buffer, or a move onto rows that do not overlap
        self.start, self.end = 0, 0 if old is None else old.shape[2]


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

    @property
    def attended(self) -> int:
        """Rows the attention reads (`used_keys`): the used rows here; a quantised selection adds its own."""
        return self.length

    def build(
        self,
        keys,
        values,
        index: torch.Tensor,
        fixed: int,
        ring_size: int | None,
        headroom: int,
        positions: torch.Tensor | None = None,
    ) -> None:
        """
        Lay out rows `index` (`[H, n]`, rows of `keys`/`values` `[B, H, T, D]`, which are also their absolute
        positions unless `positions` gives them) as the working set: the first `fixed` are sinks and selection, the
        rest (ascending, the newest last) fill the ring.
        """
        n = index.shape[-1]
        index = index.to(self.device)
        rows = None
        # Rows are read straight into place, one head at a time (a few times faster than a gather with an index
        # expanded over the head dim), unless they come from another device or dtype, a batch, or this very buffer.
        direct = (
            self.keys is not None
            and keys.shape[0] == 1
            and keys.device == self.device
            and keys.dtype == self.keys.dtype
            and keys.untyped_storage().data_ptr() != self.keys.untyped_storage().data_ptr()
        )
        if self.keys is not None and not direct:
            gather = index.to(keys.device)[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[-1])
            rows = torch.gather(keys, 2, gather), torch.gather(values, 2, gather)
        if self.capacity > 2 * (n + headroom):
            # The first compression of a long prompt: release the prompt-sized buffer.
            self._allocate(n + headroom, self.keys is not None, True)
        else:
            self.reserve(n + headroom)
        if direct:
            for head in range(index.shape[0]):
                torch.index_select(keys[0, head], 0, index[head], out=self.keys[0, head, :n])
                torch.index_select(values[0, head], 0, index[head], out=self.values[0, head, :n])
        elif rows is not None:
            self.keys[:, :, :n].copy_(rows[0])
            self.values[:, :, :n].copy_(rows[1])
        self.positions[:, :n].copy_(index if positions is None else positions)
        self.length = n
        self.fixed = fixed
        self.ring_fill = n - fixed
        self.ring_size = ring_size
        self.ring_head = 0

    def replace_selection(self, keys, values, positions: torch.Tensor) -> None:
        """Overwrite the selection, the last `positions.shape[-1]` of the `fixed` rows, with rows `keys`/`values`
        (`[B, H, S, D]`; None with positions only) at `positions` (`[H, S]`); every other row stays where it is."""
        start = self.fixed - positions.shape[-1]
        if self.keys is not None:
            self.keys[:, :, start : self.fixed].copy_(keys)
            self.values[:, :, start : self.fixed].copy_(values)
        self.positions[:, start : self.fixed].copy_(positions)

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


def _quanto():
    try:
        from optimum import quanto
    except ImportError as err:
        raise ImportError(
            "A quantised store or working set (RiftConfig(store_dtype=...) or kv_dtype=...) uses optimum-quanto, "
            "which is not installed: pip install 'rift-hf[quanto]' (or pip install optimum-quanto)."
        ) from err
    return quanto


def _nbytes(tensor) -> int:
    """Bytes held by a tensor or a quanto tensor subclass (its packed data, scales and shifts)."""
    flatten = getattr(tensor, "__tensor_flatten__", None)
    if flatten is None:
        return tensor.numel() * tensor.element_size()
    names, _ = flatten()
    return sum(_nbytes(getattr(tensor, name)) for name in names)


class Quantizer:
    """
    Quantises `[B, H, n, D]` key or value rows with optimum-quanto. Per token (values): each row of one token and head
    gets int8 symmetric scales, or int4/int2 affine scales and shifts per group of `group_size` values. Per channel
    (keys, `per_channel=True`, as KIVI does: a few key channels carry outliers that swamp a per-token range): each
    channel of one head gets its scales over groups of `group_size` tokens (the rows are padded to whole groups by
    repeating the last one, which leaves every range unchanged).
    """

    def __init__(self, like: torch.Tensor, dtype: str, group_size: int, per_channel: bool = False):
        if dtype not in STORE_DTYPES:
            raise ValueError(f"A quantised dtype must be one of {', '.join(STORE_DTYPES)}, got {dtype!r}.")
        quanto = _quanto()
        self.qtype = {"int8": quanto.qint8, "int4": quanto.qint4, "int2": quanto.qint2}[dtype]
        dim = like.shape[-1]
        if dtype != "int8" and not per_channel and dim % min(group_size, dim):
            raise ValueError(f"The quantisation group size ({group_size}) must divide the head dim ({dim}).")
        self.group_size = group_size
        self.per_channel = per_channel
        self.dtype = like.dtype

    def _flat(self, rows: torch.Tensor) -> tuple[torch.Tensor, int]:
        """The 2-D tensor quanto quantises row by row, and the group size along its last axis."""
        if not self.per_channel:
            return rows.reshape(-1, rows.shape[-1]), min(self.group_size, rows.shape[-1])
        n = rows.shape[-2]
        group = n if self.qtype.bits == 8 else min(self.group_size, n)  # int8: one symmetric scale per channel
        padded = -(-n // group) * group
        if padded > n:
            rows = torch.cat([rows, rows[:, :, -1:].expand(-1, -1, padded - n, -1)], dim=2)
        return rows.transpose(-1, -2).reshape(-1, padded), group  # [B * H * D, tokens]

    def quantize(self, rows: torch.Tensor):
        quanto = _quanto()
        flat, group = self._flat(rows)
        if self.qtype.bits == 8:
            scale = quanto.AbsmaxOptimizer()(flat, self.qtype, 0)
            return quanto.quantize_weight(flat, self.qtype, 0, scale)
        scale, shift = quanto.MaxOptimizer()(flat, self.qtype, 0, group)
        return quanto.quantize_weight(flat, self.qtype, 0, scale, shift, group)

    def dequantize(self, packed, shape: tuple[int, int, int, int]) -> torch.Tensor:
        dense = packed.dequantize().to(self.dtype)
        if not self.per_channel:
            return dense.view(shape)
        batch, heads, n, dim = shape
        return dense.view(batch, heads, dim, -1)[..., :n].transpose(-1, -2)

    def unpadded(self, n: int) -> int:
        """The largest row count `<= n` that quantises without padding (whole groups of tokens, per channel)."""
        if not self.per_channel or self.qtype.bits == 8 or n < self.group_size:
            return n
        return n // self.group_size * self.group_size

    def row_bytes(self, like: torch.Tensor) -> float:
        """Bytes one quantised row of one head takes (data, scales, shifts), measured on a block of rows."""
        rows = max(64, self.group_size)
        sample = torch.zeros(1, 1, rows, like.shape[-1], dtype=like.dtype, device=like.device)
        return _nbytes(self.quantize(sample)) / rows


_BITS = {"int8": 8, "int4": 4, "int2": 2}


def check_group_sizes(config, head_dim: int) -> None:
    """Refuse, before any forward, quantisation groups that do not tile a layer's rows (`RiftConfig` store and
    working-set fields against the model's head dim)."""
    if config.store_dtype is not None and config.keeps_store and config.store_dtype != "int8":
        group, residual = config.store_group_size, config.store_residual
        if residual % min(group, residual) or head_dim % min(group, head_dim):
            raise ValueError(
                f"store_group_size={group} must divide store_residual ({residual}) and the model's head dim "
                f"({head_dim}) (or exceed them); use a power of two such as 64."
            )
    if config.kv_dtype is not None and config.kv_dtype != "int8" and head_dim % min(config.kv_group_size, head_dim):
        raise ValueError(
            f"kv_group_size={config.kv_group_size} must divide the model's head dim ({head_dim}) (or exceed it); use "
            "a power of two such as 64."
        )


def _pack(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned codes `[..., D]` (< 2**bits) -> bytes `[..., D * bits / 8]`, the lowest bits holding the first."""
    if bits == 8:
        return q.to(torch.uint8)
    q = q.to(torch.uint8).unflatten(-1, (-1, 8 // bits))
    packed = q[..., 0].clone()
    for i in range(1, 8 // bits):  # an OR per code in a byte (a uint8 sum over the last dim is slower on a CPU)
        packed |= q[..., i] << (i * bits)
    return packed


def _unpack(data: torch.Tensor, bits: int) -> torch.Tensor:
    """`_pack`'s inverse: bytes `[..., D * bits / 8]` -> codes `[..., D]` (uint8)."""
    if bits == 8:
        return data
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=data.device)
    return ((data[..., None] >> shifts) & (2**bits - 1)).flatten(-2)


class QuantizedRows:
    """
    A full store whose committed rows, past the newest `residual`, are kept in `dtype` (int8, int4 or int2) in
    contiguous packed buffers; the newest rows stay in full precision (`recent`), so a rollback never touches a
    quantised row. Rows are quantised in chunks of `residual` once `residual` newer committed rows follow them.

    Keys per channel (as KIVI: a few key channels carry outliers that would swamp a per-token range), over groups of
    `min(group_size, residual)` tokens; values per token, over groups of `min(group_size, D)` channels. int8 is
    symmetric (absmax / 127, one scale per group; for keys the group is the whole chunk), int4 and int2 affine
    (min and step per group). `gather` dequantises only the rows asked for (what a page refresh reads); `used_keys` /
    `used_values` dequantise everything (what a rescoring over the whole store reads).
    """

    def __init__(self, like: torch.Tensor, dtype: str, group_size: int, residual: int, device=None):
        if dtype not in _BITS:
            raise ValueError(f"A quantised dtype must be one of {', '.join(_BITS)}, got {dtype!r}.")
        batch, heads, _, dim = like.shape
        self.bits = _BITS[dtype]
        self.key_group = residual if self.bits == 8 else min(group_size, residual)
        self.value_group = dim if self.bits == 8 else min(group_size, dim)
        if residual % self.key_group or dim % self.value_group or (dim * self.bits) % 8:
            raise ValueError(
                f"The store's quantisation group ({group_size}) must divide its residual ({residual}) and the head "
                f"dim ({dim}); pick a power of two such as 64 (RiftConfig(store_group_size=...))."
            )
        self.residual_rows = residual
        self.recent = Rows(like, 2 * residual, device)
        self.shape, self.dtype, self.device = self.recent.shape, self.recent.dtype, self.recent.device
        self.quantized = 0
        self.capacity = 0
        self.key_data = self.key_scale = self.key_shift = None
        self.value_data = self.value_scale = self.value_shift = None

    @property
    def length(self) -> int:
        return self.quantized + self.recent.length

    @length.setter
    def length(self, value: int) -> None:
        if value < self.quantized:
            raise ValueError(f"Cannot shorten the store to {value} rows: {self.quantized} are quantised.")
        self.recent.length = value - self.quantized

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        self.recent.append(keys, values)

    def _reserve(self, rows: int) -> None:
        """Room for `rows` quantised rows (doubling)."""
        if rows <= self.capacity:
            return
        batch, heads, dim = self.shape
        capacity = max(rows, 2 * self.capacity)
        kinds = {
            "key_data": ((batch, heads, capacity, dim * self.bits // 8), torch.uint8),
            "key_scale": ((batch, heads, capacity // self.key_group, dim), self.dtype),
            "value_data": ((batch, heads, capacity, dim * self.bits // 8), torch.uint8),
            "value_scale": ((batch, heads, capacity, dim // self.value_group), self.dtype),
        }
        if self.bits < 8:
            kinds["key_shift"] = kinds["key_scale"]
            kinds["value_shift"] = kinds["value_scale"]
        for name, (shape, dtype) in kinds.items():
            new = torch.empty(shape, dtype=dtype, device=self.device)
            old = getattr(self, name)
            if old is not None:
                new[:, :, : old.shape[2]].copy_(old)
            setattr(self, name, new)
        self.capacity = capacity

    def _quantize(self, rows: torch.Tensor, groups: int, axis: int):
        """Codes, scales and shifts of `rows` `[B, H, n, D]` with `groups` groups along `axis` (2: tokens, per
        channel; 3: channels, per token)."""
        grouped = rows.float().unflatten(axis, (groups, -1))  # the group's members on axis + 1
        if self.bits == 8:
            scale = grouped.abs().amax(axis + 1, keepdim=True).clamp_min(1e-12) / 127
            codes = (grouped / scale).round().clamp(-127, 127) + 128  # stored unsigned
            return codes.flatten(axis, axis + 1), scale.squeeze(axis + 1), None
        low, high = grouped.amin(axis + 1, keepdim=True), grouped.amax(axis + 1, keepdim=True)
        scale = ((high - low) / (2**self.bits - 1)).clamp_min(1e-12)
        codes = ((grouped - low) / scale).round().clamp(0, 2**self.bits - 1)
        return codes.flatten(axis, axis + 1), scale.squeeze(axis + 1), low.squeeze(axis + 1)

    def commit(self, committed: int) -> None:
        """The first `committed` rows are verified: quantise the whole chunks of them that left the residual window."""
        residual = self.residual_rows
        chunks = (committed - self.quantized - residual) // residual  # keep >= `residual` committed rows exact
        if chunks <= 0:
            return
        done = chunks * residual
        start, end = self.quantized, self.quantized + done
        self._reserve(end)
        keys, values = self.recent.keys[:, :, :done], self.recent.values[:, :, :done]
        codes, scale, shift = self._quantize(keys, done // self.key_group, axis=2)
        self.key_data[:, :, start:end] = _pack(codes, self.bits)
        groups = slice(start // self.key_group, end // self.key_group)
        self.key_scale[:, :, groups] = scale
        if shift is not None:
            self.key_shift[:, :, groups] = shift
        codes, scale, shift = self._quantize(values, self.shape[2] // self.value_group, axis=3)
        self.value_data[:, :, start:end] = _pack(codes, self.bits)
        self.value_scale[:, :, start:end] = scale
        if shift is not None:
            self.value_shift[:, :, start:end] = shift
        left = self.recent.length - done
        self.recent.keys[:, :, :left] = self.recent.keys[:, :, done : done + left].clone()
        self.recent.values[:, :, :left] = self.recent.values[:, :, done : done + left].clone()
        self.recent.length = left
        self.quantized = end

    def _dequantize(self, codes, scale, shift, expand: int, axis: int) -> torch.Tensor:
        codes = _unpack(codes, self.bits).float()
        scale = scale.float().repeat_interleave(expand, dim=axis)
        if self.bits == 8:
            return ((codes - 128) * scale).to(self.dtype)
        return (codes * scale + shift.float().repeat_interleave(expand, dim=axis)).to(self.dtype)

    def _keys(self, rows: torch.Tensor) -> torch.Tensor:
        """Dequantised keys of quantised row numbers `rows` (`[H, n]`): `[B, H, n, D]`."""
        heads = torch.arange(rows.shape[0], device=self.device)[:, None]
        groups = rows // self.key_group
        scale = self.key_scale[:, heads, groups]
        shift = None if self.key_shift is None else self.key_shift[:, heads, groups]
        return self._dequantize(self.key_data[:, heads, rows], scale, shift, 1, -1)

    def _values(self, rows: torch.Tensor) -> torch.Tensor:
        heads = torch.arange(rows.shape[0], device=self.device)[:, None]
        scale = self.value_scale[:, heads, rows]
        shift = None if self.value_shift is None else self.value_shift[:, heads, rows]
        return self._dequantize(self.value_data[:, heads, rows], scale, shift, self.value_group, -1)

    def gather(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values `[B, H, n, D]` of row numbers `index` (`[H, n]`, < `length`), dequantising only those."""
        index = index.to(self.device)
        old = index < self.quantized
        packed = index.clamp(max=max(self.quantized - 1, 0))
        fresh = (index - self.quantized).clamp(min=0)
        heads = torch.arange(index.shape[0], device=self.device)[:, None]
        recent_keys = self.recent.keys[:, heads, fresh]
        recent_values = self.recent.values[:, heads, fresh]
        if not self.quantized:
            return recent_keys, recent_values
        where = old[None, :, :, None]
        return (
            torch.where(where, self._keys(packed), recent_keys),
            torch.where(where, self._values(packed), recent_values),
        )

    def key_rows(self, start: int, stop: int) -> torch.Tensor:
        """Dequantised keys of rows `[start, stop)`: `[B, H, stop - start, D]`."""
        return self._range(start, stop, self._keys, self.recent.keys)

    def _range(self, start: int, stop: int, dequantise, exact: torch.Tensor) -> torch.Tensor:
        """Rows `[start, stop)` of one tensor: the quantised ones dequantised by `dequantise`, the newest read from
        `exact` (`gather` for a range, without dequantising what is exact or the other tensor)."""
        parts = []
        if start < min(stop, self.quantized):
            rows = torch.arange(start, min(stop, self.quantized), device=self.device).expand(self.shape[1], -1)
            parts.append(dequantise(rows))
        if stop > self.quantized or not parts:
            parts.append(exact[:, :, max(start, self.quantized) - self.quantized : max(0, stop - self.quantized)])
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=2)

    @property
    def used_keys(self) -> torch.Tensor:
        return self.key_rows(0, self.length)

    @property
    def used_values(self) -> torch.Tensor:
        return self._range(0, self.length, self._values, self.recent.values)

    def nbytes(self, length: int | None = None) -> int:
        """Bytes held by the used rows: packed codes, scales and shifts, plus the full-precision rows."""
        batch, heads, dim = self.shape
        element = torch.empty(0, dtype=self.dtype).element_size()
        per_row = 2 * dim * self.bits // 8  # key and value codes
        per_row += element * (dim // self.value_group) * (1 if self.bits == 8 else 2)  # value scales (and shifts)
        key_groups = self.quantized // self.key_group
        scales = batch * heads * key_groups * dim * element * (1 if self.bits == 8 else 2)
        return batch * heads * self.quantized * per_row + scales + self.recent.nbytes()


class QuantizedWorkingSet(WorkingSet):
    """
    A working set whose selection (the rows between the sinks and the recent ring) is kept by optimum-quanto in a
    lower precision (`RiftConfig(kv_dtype=...)`; keys per channel, values per token, see `Quantizer`); sinks, the ring
    and the in-flight rows stay in the model's dtype.
    The rows here are laid out as `[sinks | ring | in-flight]`, so commits and rollbacks never touch a quantised
    row; the attention reads `[sinks | selection, dequantised | ring | in-flight]` (`used_keys`/`used_values`, one
    dequantised copy per forward).
    """

    def __init__(self, like: torch.Tensor, capacity: int, dtype: str, group_size: int, n_sink: int, device=None):
        super().__init__(like, capacity, device)
        self.quantizers = Quantizer(like, dtype, group_size, per_channel=True), Quantizer(like, dtype, group_size)
        self.n_sink = n_sink
        self.selection: tuple | None = None  # (quantised keys, quantised values, positions [H, S])

    @property
    def selected(self) -> int:
        return 0 if self.selection is None else self.selection[2].shape[-1]

    @property
    def attended(self) -> int:
        return self.length + self.selected

    def build(self, keys, values, index, fixed, ring_size, headroom, positions=None) -> None:
        positions = index if positions is None else positions
        sinks = min(self.n_sink, fixed)
        chosen = index[:, sinks:fixed].to(self.device)
        self.selection = None
        if chosen.shape[-1]:
            gather = chosen.to(keys.device)[None, :, :, None].expand(keys.shape[0], -1, -1, keys.shape[-1])
            rows = [torch.gather(tensor, 2, gather).to(self.device) for tensor in (keys, values)]
            quantized = self.quantizers[0].quantize(rows[0]), self.quantizers[1].quantize(rows[1])
            self.selection = (*quantized, positions[:, sinks:fixed].to(self.device))
        rest = torch.cat([index[:, :sinks], index[:, fixed:]], dim=-1)
        kept = torch.cat([positions[:, :sinks], positions[:, fixed:]], dim=-1)
        super().build(keys, values, rest, sinks, ring_size, headroom, kept)

    def replace_selection(self, keys, values, positions: torch.Tensor) -> None:
        quantized = [self.quantizers[i].quantize(rows.to(self.device)) for i, rows in enumerate((keys, values))]
        self.selection = (*quantized, positions.to(self.device))

    def _with_selection(self, rows: torch.Tensor, which: int) -> torch.Tensor:
        if self.selection is None:
            return rows
        batch, heads, dim = self.shape
        dense = self.quantizers[which].dequantize(self.selection[which], (batch, heads, self.selected, dim))
        return torch.cat([rows[:, :, : self.fixed], dense, rows[:, :, self.fixed :]], dim=2)

    @property
    def used_keys(self) -> torch.Tensor:
        return self._with_selection(super().used_keys, 0)

    @property
    def used_values(self) -> torch.Tensor:
        return self._with_selection(super().used_values, 1)

    @property
    def used_positions(self) -> torch.Tensor:
        positions = super().used_positions
        if self.selection is None:
            return positions
        return torch.cat([positions[:, : self.fixed], self.selection[2], positions[:, self.fixed :]], dim=1)

    def nbytes(self, length: int | None = None) -> int:
        """Bytes held: the full-precision rows plus the quantised selection (data, scales, shifts)."""
        quantised = 0 if self.selection is None else _nbytes(self.selection[0]) + _nbytes(self.selection[1])
        return super().nbytes(length) + quantised


def new_store(config, like: torch.Tensor, capacity: int, device) -> Rows | QuantizedRows:
    """The full store a `RiftConfig` asks for: every row in the model's dtype, or quantised (`store_dtype`), on
    `device` (the compute device, or `store_device`)."""
    if config.store_dtype is None:
        return Rows(like, capacity, device=device)
    return QuantizedRows(like, config.store_dtype, config.store_group_size, config.store_residual, device=device)


def new_working_set(config, like: torch.Tensor, capacity: int, with_kv: bool = True) -> WorkingSet:
    """The working set a `RiftConfig` asks for: in the model's dtype, or its selection in `kv_dtype` (sinks and the
    recent window stay in the model's dtype). `with_kv=False` keeps positions only (the store is attended in place)."""
    if config.kv_dtype is None:
        return WorkingSet(like, capacity, with_kv=with_kv)
    return QuantizedWorkingSet(like, capacity, config.kv_dtype, config.kv_group_size, config.n_sink)
