"""Triton kernels for SnapKV window scores and attention over an indexed selection of a KV store.

Same signatures and semantics as `reference.py`. Arithmetic is done in fp32 whatever the input dtype (the Triton
interpreter computes bf16 wrongly, and fp32 accumulation is what the references do). Matrix products run on tensor
cores as tf32, which holds fp16/bf16 inputs exactly; fp32 inputs ask for full-precision ("ieee") products instead,
so an fp32 model gets fp32 attention (tf32 cost 2e-3 absolute error on the GPU tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


def _pow2(n: int, minimum: int = 16) -> int:
    return max(minimum, triton.next_power_of_2(n))


def _dot_precision(tensor: torch.Tensor) -> str:
    return "ieee" if tensor.dtype == torch.float32 else "tf32"


@triton.jit
def _window_lse_fwd_kernel(
    Q,
    K,
    SINKS,
    LSE,
    T,
    W,
    G,
    scale,
    sq_b,
    sq_h,
    sq_w,
    sk_b,
    sk_h,
    sk_t,
    H_Q: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program per (batch, query head): log-sum-exp of every window query over all its visible keys.
    pid = tl.program_id(0)
    b, hq = pid // H_Q, pid % H_Q
    hk = hq // G
    w = tl.arange(0, BLOCK_W)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(
        Q + b * sq_b + hq * sq_h + w[:, None] * sq_w + d[None, :], mask=(w[:, None] < W) & (d[None, :] < D), other=0.0
    ).to(tl.float32)
    q_pos = T - W + w
    m = tl.full([BLOCK_W], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_W], tl.float32)
    for start in range(0, T, BLOCK_T):
        t = start + tl.arange(0, BLOCK_T)
        k = tl.load(
            K + b * sk_b + hk * sk_h + t[:, None] * sk_t + d[None, :],
            mask=(t[:, None] < T) & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = (t[None, :] <= q_pos[:, None]) & (t[None, :] < T)
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, 1))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(logits - m_new[:, None]), 1)
        m = m_new
    if HAS_SINKS:
        sink = tl.load(SINKS + hq).to(tl.float32)
        m_new = tl.maximum(m, sink)
        s = s * tl.exp(m - m_new) + tl.exp(sink - m_new)
        m = m_new
    tl.store(LSE + pid * BLOCK_W + w, m + tl.log(s), mask=w < W)


@triton.jit
def _window_scores_fwd_kernel(
    Q,
    K,
    LSE,
    OUT,
    T,
    W,
    G,
    scale,
    sq_b,
    sq_h,
    sq_w,
    sk_b,
    sk_h,
    sk_t,
    H_KV: tl.constexpr,
    H_Q: tl.constexpr,
    BLOCK_W: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program per (batch, KV head, block of keys): softmax mass summed over the window, averaged over the group.
    pid, tb = tl.program_id(0), tl.program_id(1)
    b, hk = pid // H_KV, pid % H_KV
    w = tl.arange(0, BLOCK_W)
    d = tl.arange(0, BLOCK_D)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    k = tl.load(
        K + b * sk_b + hk * sk_h + t[:, None] * sk_t + d[None, :], mask=(t[:, None] < T) & (d[None, :] < D), other=0.0
    ).to(tl.float32)
    q_pos = T - W + w
    visible = (t[None, :] <= q_pos[:, None]) & (t[None, :] < T) & (w[:, None] < W)
    acc = tl.zeros([BLOCK_T], tl.float32)
    for g in range(0, G):
        hq = hk * G + g
        q = tl.load(
            Q + b * sq_b + hq * sq_h + w[:, None] * sq_w + d[None, :],
            mask=(w[:, None] < W) & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        lse = tl.load(LSE + (b * H_Q + hq) * BLOCK_W + w, mask=w < W, other=0.0)
        logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        probs = tl.where(visible, tl.exp(logits - lse[:, None]), 0.0)
        acc += tl.sum(probs, 0)
    tl.store(OUT + pid * T + t, acc / G, mask=t < T)


def window_attention_scores(
    query: torch.Tensor, key: torch.Tensor, scale: float, sinks: torch.Tensor | None = None
) -> torch.Tensor:
    """Triton version of `reference.window_attention_scores` (`[B, H_q, W, D]`, `[B, H_kv, T, D]` -> `[B, H_kv, T]`)."""
    batch, h_q, window, dim = query.shape
    h_kv, length = key.shape[1], key.shape[2]
    if h_q % h_kv:
        raise ValueError(f"query heads ({h_q}) must be a multiple of key heads ({h_kv}).")
    if window > length:
        raise ValueError(f"window ({window}) is longer than the keys ({length}).")
    query, key = query.contiguous(), key.contiguous()
    block_w, block_d, block_t = _pow2(window), _pow2(dim), 64
    lse = torch.empty(batch * h_q * block_w, dtype=torch.float32, device=query.device)
    out = torch.empty(batch, h_kv, length, dtype=torch.float32, device=query.device)
    group = h_q // h_kv
    sinks_arg = sinks.contiguous() if sinks is not None else lse
    strides = (*query.stride()[:3], *key.stride()[:3])
    _window_lse_fwd_kernel[(batch * h_q,)](
        query,
        key,
        sinks_arg,
        lse,
        length,
        window,
        group,
        scale,
        *strides,
        H_Q=h_q,
        HAS_SINKS=sinks is not None,
        BLOCK_W=block_w,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        D=dim,
        PRECISION=_dot_precision(query),
    )
    _window_scores_fwd_kernel[(batch * h_kv, triton.cdiv(length, block_t))](
        query,
        key,
        lse,
        out,
        length,
        window,
        group,
        scale,
        *strides,
        H_KV=h_kv,
        H_Q=h_q,
        BLOCK_W=block_w,
        BLOCK_T=block_t,
        BLOCK_D=block_d,
        D=dim,
        PRECISION=_dot_precision(query),
    )
    return out


@triton.jit
def _indexed_attention_fwd_kernel(
    Q,
    K,
    V,
    IDX,
    SINKS,
    OUT,
    L,
    KSEL,
    G,
    scale,
    sq_b,
    sq_h,
    sq_l,
    sk_b,
    sk_h,
    sk_s,
    sv_b,
    sv_h,
    sv_s,
    si_b,
    si_h,
    so_b,
    so_h,
    so_l,
    H_Q: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_D: tl.constexpr,
    D: tl.constexpr,
    PRECISION: tl.constexpr,
):
    # One program per (batch, query head, block of queries): online softmax over the selected store rows, gathered on
    # the fly; a block stops at the last row its queries can see.
    pid, lb = tl.program_id(0), tl.program_id(1)
    b, hq = pid // H_Q, pid % H_Q
    hk = hq // G
    li = lb * BLOCK_L + tl.arange(0, BLOCK_L)
    d = tl.arange(0, BLOCK_D)
    q = tl.load(
        Q + b * sq_b + hq * sq_h + li[:, None] * sq_l + d[None, :], mask=(li[:, None] < L) & (d[None, :] < D), other=0.0
    ).to(tl.float32)
    own = KSEL - L + li  # row of the selection that is query i's own position
    m = tl.full([BLOCK_L], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_L], tl.float32)
    acc = tl.zeros([BLOCK_L, BLOCK_D], tl.float32)
    for start in range(0, tl.minimum(KSEL, KSEL - L + (lb + 1) * BLOCK_L), BLOCK_K):
        j = start + tl.arange(0, BLOCK_K)
        rows = tl.load(IDX + b * si_b + hk * si_h + j, mask=j < KSEL, other=0)
        k = tl.load(
            K + b * sk_b + hk * sk_h + rows[:, None] * sk_s + d[None, :],
            mask=(j[:, None] < KSEL) & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        v = tl.load(
            V + b * sv_b + hk * sv_h + rows[:, None] * sv_s + d[None, :],
            mask=(j[:, None] < KSEL) & (d[None, :] < D),
            other=0.0,
        ).to(tl.float32)
        logits = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = (j[None, :] <= own[:, None]) & (j[None, :] < KSEL)
        logits = tl.where(visible, logits, float("-inf"))
        m_new = tl.maximum(m, tl.max(logits, 1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(logits - m_new[:, None])
        s = s * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision=PRECISION)
        m = m_new
    if HAS_SINKS:
        sink = tl.load(SINKS + hq).to(tl.float32)
        m_new = tl.maximum(m, sink)
        alpha = tl.exp(m - m_new)
        s = s * alpha + tl.exp(sink - m_new)
        acc = acc * alpha[:, None]
    out = acc / s[:, None]
    tl.store(
        OUT + b * so_b + hq * so_h + li[:, None] * so_l + d[None, :],
        out.to(OUT.dtype.element_ty),
        mask=(li[:, None] < L) & (d[None, :] < D),
    )


def indexed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    index: torch.Tensor,
    scale: float,
    sinks: torch.Tensor | None = None,
) -> torch.Tensor:
    """Triton version of `reference.indexed_attention`; the selection is read in place, never copied."""
    batch, h_q, length, dim = query.shape
    h_kv, k_sel = key.shape[1], index.shape[-1]
    # The store is read through its strides (a view of a preallocated buffer is not copied); rows must be dense.
    key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (key, value))
    query, index = query.contiguous(), index.contiguous()
    out = torch.empty_like(query)
    sinks_arg = sinks.contiguous() if sinks is not None else query
    block_l = min(_pow2(length), 64)  # decode (L <= gamma + 1) is one block; a prefill is tiled
    _indexed_attention_fwd_kernel[(batch * h_q, triton.cdiv(length, block_l))](
        query,
        key,
        value,
        index,
        sinks_arg,
        out,
        length,
        k_sel,
        h_q // h_kv,
        scale,
        *query.stride()[:3],
        *key.stride()[:3],
        *value.stride()[:3],
        *index.stride()[:2],
        *out.stride()[:3],
        H_Q=h_q,
        HAS_SINKS=sinks is not None,
        BLOCK_L=block_l,
        BLOCK_K=64,
        BLOCK_D=_pow2(dim),
        D=dim,
        PRECISION=_dot_precision(query),
    )
    return out
