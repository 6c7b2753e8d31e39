"""Triton kernels against their PyTorch references: compiled on a GPU when there is one, else under the Triton
interpreter on CPU (see conftest), where bf16 arithmetic is wrong and so only fp32/fp16 are checked.

Tolerance (as flash-attention's tests): the kernel's error against an fp32 reference is at most twice the error
of the PyTorch reference computed in the same dtype, plus a small floor for exact-zero cases.
"""

import pytest
import torch

pytest.importorskip("triton")

from rift_hf.config import policy_settings
from rift_hf.kernels import (
    reference,  # noqa: E402
    triton_ops,  # noqa: E402  (interpreted on CPU: see conftest)
)

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if DEVICE.type == "cuda" else [])


def _check(kernel_out, torch_out, exact, floor=1e-6):
    kernel_err = (kernel_out.double() - exact.double()).abs().max().item()
    torch_err = (torch_out.double() - exact.double()).abs().max().item()
    assert kernel_err <= 2 * torch_err + floor, (kernel_err, torch_err)


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("sinks", [False, True], ids=["nosink", "sink"])
@pytest.mark.parametrize(
    "h_kv, group, window, length, dim",
    [(2, 1, 5, 37, 16), (1, 2, 8, 70, 32), (2, 7, 3, 129, 24), (1, 1, 1, 9, 16)],
    ids=lambda v: str(v),
)
def test_window_attention_scores(h_kv, group, window, length, dim, sinks, dtype):
    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, h_kv * group, window, dim, generator=g).to(DEVICE, dtype)
    key = torch.randn(1, h_kv, length, dim, generator=g).to(DEVICE, dtype)
    sink = torch.randn(h_kv * group, generator=g).to(DEVICE) if sinks else None
    scale = dim**-0.5
    exact = reference.window_attention_scores(query.float(), key.float(), scale, sink)
    torch_out = reference.window_attention_scores(query, key, scale, sink)
    got = triton_ops.window_attention_scores(query, key, scale, sink)
    assert got.shape == (1, h_kv, length) and got.dtype == torch.float32
    _check(got, torch_out, exact)


def _dense_window_scores(query, key, scale, sink):
    """The definition of the window scores, written out densely: softmax over every key (with the sink logit in the
    denominator), causal inside the window, summed over the window and averaged over each KV head's query heads."""
    batch, h_q, window, _ = query.shape
    h_kv, length = key.shape[1], key.shape[2]
    logits = query.double() @ key.double().repeat_interleave(h_q // h_kv, 1).transpose(-1, -2) * scale
    position = torch.arange(length)
    logits = logits.masked_fill(position[None, :] > position[length - window :, None], float("-inf"))
    if sink is not None:
        logits = torch.cat([logits, sink.double().view(1, h_q, 1, 1).expand(batch, h_q, window, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :length]
    return probs.sum(dim=2).view(batch, h_kv, h_q // h_kv, length).mean(dim=2).float()


@pytest.mark.parametrize("sinks", [False, True], ids=["nosink", "sink"])
def test_window_scores_equal_their_dense_definition(sinks):
    """The reference (a query head at a time, softmax in place) against the scores written out densely, batch of two."""
    g = torch.Generator().manual_seed(3)
    query = torch.randn(2, 6, 5, 16, generator=g)
    key = torch.randn(2, 2, 37, 16, generator=g)
    sink = torch.randn(6, generator=g) if sinks else None
    got = reference.window_attention_scores(query, key, 0.25, sink)
    assert torch.allclose(got, _dense_window_scores(query, key, 0.25, sink), rtol=1e-5, atol=1e-7)


def _reference_in_dtype(query, key, value, index, scale, sink):
    """The PyTorch path in the input dtype: SDPA-like math without upcasting, on a gathered copy."""
    b, h_q, length, dim = query.shape
    h_kv = key.shape[1]
    gather = index.unsqueeze(-1).expand(-1, -1, -1, dim)
    k = torch.gather(key, 2, gather).repeat_interleave(h_q // h_kv, 1)
    v = torch.gather(value, 2, gather).repeat_interleave(h_q // h_kv, 1)
    logits = (query @ k.transpose(-1, -2)) * scale
    k_sel = index.shape[-1]
    positions = torch.arange(k_sel, device=query.device)
    causal = positions[None, :] > positions[k_sel - length :, None]
    logits = logits.masked_fill(causal, float("-inf"))
    if sink is not None:
        logits = torch.cat([logits, sink.to(query.dtype).view(1, -1, 1, 1).expand(b, -1, length, 1)], -1)
        return torch.softmax(logits.float(), -1).to(query.dtype)[..., :-1] @ v
    return torch.softmax(logits.float(), -1).to(query.dtype) @ v


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("sinks", [False, True], ids=["nosink", "sink"])
@pytest.mark.parametrize("group", [1, 2, 7])
@pytest.mark.parametrize("length", [1, 12, 100])  # 100: a prefill, tiled over blocks of queries
def test_indexed_attention(length, group, sinks, dtype):
    g = torch.Generator().manual_seed(1)
    h_kv, store, k_sel, dim = 2, 150, max(45, length + 10), 24
    query = torch.randn(1, h_kv * group, length, dim, generator=g).to(DEVICE, dtype)
    key = torch.randn(1, h_kv, store, dim, generator=g).to(DEVICE, dtype)
    value = torch.randn(1, h_kv, store, dim, generator=g).to(DEVICE, dtype)
    # Per head: a scattered selection of older rows, then the queries' own rows at the end of the store.
    older = torch.stack(
        [torch.randperm(store - length, generator=g)[: k_sel - length].sort().values for _ in range(h_kv)]
    )
    own = torch.arange(store - length, store).expand(h_kv, -1)
    index = torch.cat([older, own], -1)[None].to(DEVICE)
    sink = torch.randn(h_kv * group, generator=g).to(DEVICE) if sinks else None
    scale = dim**-0.5
    exact = reference.indexed_attention(query.float(), key.float(), value.float(), index, scale, sink)
    torch_out = _reference_in_dtype(query, key, value, index, scale, sink)
    got = triton_ops.indexed_attention(query, key, value, index, scale, sink)
    assert got.shape == query.shape and got.dtype == dtype
    _check(got, torch_out, exact, floor=1e-5)


def test_assisted_output_identical_with_triton_scoring(monkeypatch):
    import rift_hf
    from tiny import draft_target_pair, make_prompt

    target, draft = draft_target_pair("llama")
    target, draft = target.to(DEVICE), draft.to(DEVICE)
    ids = make_prompt(40, seed=3).to(DEVICE)
    config = policy_settings("rift-dyn", {"budget": 16, "window": 4, "delta": 4, "attend_in_place": True})
    config["draft_length"] = "fixed"  # every round drafts and rescores
    runs = {}
    calls = []
    import rift_hf.attention as backend

    original = backend.indexed_attention
    monkeypatch.setattr(backend, "indexed_attention", lambda *a, **k: calls.append(1) or original(*a, **k))
    for mode in ("torch", "triton"):
        monkeypatch.setenv("RIFT_HF_KERNELS", mode)
        out = target.generate(
            ids,
            assistant_model=draft,
            max_new_tokens=24,
            do_sample=False,
            cache_implementation="rift",
            cache_config=config,
        )
        stats = rift_hf.last_stats(target)
        runs[mode] = (out, [r["accepted"] for r in stats.rounds], len(stats.rescorings))
    assert torch.equal(runs["torch"][0], runs["triton"][0])
    assert runs["torch"][1:] == runs["triton"][1:]
    assert runs["triton"][2] > 0
    assert calls, "the Triton path never attended the store in place"


@pytest.mark.parametrize("layout", ["buffer", "slice", "transposed"])
@pytest.mark.parametrize("sinks", [False, True])
def test_retrieved_attention_equals_masked_attention(sinks, layout):
    """Per-query rows of the store attended by gathering equal softmax attention over the store with a per-query
    mask, whether the store is a whole buffer, the used part of a longer one (rows gathered in one call over the
    buffer), or a transposed view (rows gathered per head)."""
    from rift_hf.kernels import retrieved_attention

    g = torch.Generator().manual_seed(3)
    query = torch.randn(1, 4, 3, 8, generator=g)
    key, value = torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g)
    if layout == "slice":  # the used rows of a cache buffer with spare capacity
        key, value = (torch.cat([t, torch.randn(1, 2, 7, 8, generator=g)], dim=2)[:, :, :20] for t in (key, value))
    elif layout == "transposed":
        key, value = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (key, value))
    # Query i (position 17 + i) attends 6 of the rows it can see.
    rows = [torch.randperm(18 + i, generator=g)[:6] for _ in range(2) for i in range(3)]
    index = torch.stack(rows).view(1, 2, 3, 6)
    sink = torch.randn(4, generator=g) if sinks else None
    got = retrieved_attention(query, key, value, index, 0.3, sink)
    mask = torch.zeros(1, 2, 3, 20, dtype=torch.bool).scatter_(-1, index, True).repeat_interleave(2, dim=1)
    logits = (query @ key.repeat_interleave(2, dim=1).transpose(-1, -2) * 0.3).masked_fill(~mask, float("-inf"))
    if sinks:
        logits = torch.cat([logits, sink.view(1, 4, 1, 1).expand(1, 4, 3, 1)], dim=-1)
    probs = torch.softmax(logits, dim=-1)[..., :20]
    torch.testing.assert_close(got, probs @ value.repeat_interleave(2, dim=1))
