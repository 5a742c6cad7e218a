"""mlsys_nb.kernels against PyTorch's scaled_dot_product_attention on random shapes, the IO counts against
their closed forms, the Triton kernels against torch, and each key idea broken once on purpose."""

import math

import pytest
import torch
import torch.nn.functional as F

from mlsys_nb import kernels
from mlsys_nb.kernels import attention as attn

# (batch, heads, kv_heads, s_q, s_k, head_dim, causal): s_q = 1 (decode), odd lengths, GQA, s_q != s_k
SHAPES = [
    (2, 4, 2, 37, 53, 16, True),
    (1, 2, 2, 1, 29, 8, True),
    (2, 6, 3, 33, 33, 8, False),
    (1, 2, 1, 70, 70, 16, True),
    (1, 4, 1, 5, 130, 16, False),
    (1, 2, 2, 1, 1, 4, True),
]


def _inputs(b, h, kvh, sq, sk, d, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, requires_grad=True) for s in ((b, h, sq, d), (b, kvh, sk, d), (b, kvh, sk, d))]


def _sdpa(q, k, v, causal):
    sq, sk = q.shape[2], k.shape[2]
    mask = torch.ones(sq, sk, dtype=torch.bool).tril(sk - sq) if causal else None  # bottom-right aligned
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


def _grads(fn, q, k, v, dy):
    out = fn(q, k, v)
    return (out, *torch.autograd.grad((out * dy).sum(), (q, k, v)))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_flash_attention_equals_sdpa_outputs_and_gradients(shape):
    *dims, causal = shape
    q, k, v = _inputs(*dims)
    dy = torch.randn(q.shape, generator=torch.Generator().manual_seed(1))
    ref = _grads(lambda *t: _sdpa(*t, causal), q, k, v, dy)
    got = _grads(lambda *t: kernels.flash_attention(*t, causal=causal, block_q=16, block_k=8), q, k, v, dy)
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, ref):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-4, msg=name)
    naive = kernels.naive_attention(q, k, v, causal=causal)
    torch.testing.assert_close(naive, ref[0], atol=2e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_flash_decode_equals_sdpa(shape):
    *dims, causal = shape
    q, k, v = (t.detach() for t in _inputs(*dims, seed=2))
    for splits in (1, 3, 8):
        torch.testing.assert_close(
            kernels.flash_decode(q, k, v, splits=splits, causal=causal), _sdpa(q, k, v, causal), atol=2e-5, rtol=1e-4
        )


def test_causal_is_bottom_right_not_sdpas_is_causal():
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 4, 9, 8))
    ours = kernels.flash_attention(q, k, v, causal=True)
    top_left = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    assert (ours - top_left).abs().max() > 1e-2  # a different mask when s_q != s_k
    torch.testing.assert_close(ours, _sdpa(q, k, v, True), atol=2e-5, rtol=1e-4)


def test_nothing_seq_by_seq_is_saved_for_backward():
    q, k, v = _inputs(1, 2, 2, 64, 64, 8)
    out = kernels.flash_attention(q, k, v, block_q=16, block_k=16)
    saved = out.grad_fn.saved_tensors
    assert all(t.numel() < 64 * 64 for t in saved), [tuple(t.shape) for t in saved]


def test_a_merge_without_the_rescale_is_caught(monkeypatch):
    q, k, v = (t.detach() for t in _inputs(1, 2, 2, 32, 48, 8))
    good = kernels.flash_attention(q, k, v, block_q=16, block_k=16)

    def no_rescale(out, lse, out_b, lse_b):  # sum the partials' outputs, never rescale the old one
        return torch.where(torch.isfinite(lse).unsqueeze(-1), out + out_b, out_b), torch.logaddexp(lse, lse_b)

    monkeypatch.setattr(attn, "merge_partials", no_rescale)
    bad = attn.flash_attention(q, k, v, block_q=16, block_k=16)
    assert (bad - good).abs().max() > 0.1


def test_a_backward_without_d_is_caught(monkeypatch):
    q, k, v = _inputs(1, 2, 2, 24, 24, 8)
    dy = torch.randn(q.shape)
    ref = _grads(lambda *t: _sdpa(*t, False), q, k, v, dy)
    monkeypatch.setattr(attn, "_row_term", lambda dout, out: torch.zeros(dout.shape[:-1]))
    got = _grads(lambda *t: attn.flash_attention(*t, block_q=8, block_k=8), q, k, v, dy)
    assert (got[1] - ref[1]).abs().max() > 1e-2  # dQ wrong
    assert (got[2] - ref[2]).abs().max() > 1e-2  # dK wrong
    torch.testing.assert_close(got[3], ref[3], atol=2e-5, rtol=1e-4)  # dV does not use D


def test_merge_partials_is_the_softmax_over_the_union():
    g = torch.Generator().manual_seed(3)
    s, v = torch.randn(5, 12, generator=g) * 4, torch.randn(12, 3, generator=g)
    parts = [(torch.softmax(s[:, a:b], -1) @ v[a:b], s[:, a:b].logsumexp(-1)) for a, b in ((0, 5), (5, 12))]
    out, lse = kernels.merge_partials(*parts[0], *parts[1])
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v)
    torch.testing.assert_close(lse, s.logsumexp(-1))
    empty = (torch.zeros(5, 3), torch.full((5,), float("-inf")))
    out2, lse2 = kernels.merge_partials(*empty, *empty)
    assert torch.equal(out2, torch.zeros(5, 3)) and torch.isinf(lse2).all()


def test_ring_attention_uses_the_one_merge():
    from mlsys_nb.parallel import context

    assert context.merge_partials is kernels.merge_partials


def test_bad_arguments_name_the_parameter():
    q = torch.randn(1, 3, 4, 8)
    k = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="multiple of k's heads"):
        kernels.flash_attention(q, k, k)
    with pytest.raises(ValueError, match="block_q must be an int >= 1"):
        kernels.flash_attention(q, q, q, block_q=0)
    with pytest.raises(ValueError, match="s_q <= s_k"):
        kernels.flash_attention(torch.randn(1, 1, 5, 8), torch.randn(1, 1, 3, 8), torch.randn(1, 1, 3, 8), causal=True)
    with pytest.raises(ValueError, match="splits must be an int >= 1"):
        kernels.flash_decode(q, q, q, splits=0)


# ---- IO: a count from the instrumented loads and stores, against closed forms ----------------------
def test_io_counts_equal_the_closed_forms_and_scale_as_the_paper_says():
    s, d = 128, 16
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, d, generator=g) for _ in range(3))
    ref = torch.softmax(q @ k.T / math.sqrt(d), -1) @ v
    io = kernels.IOCounter()
    torch.testing.assert_close(kernels.naive_forward_io(q, k, v, io), ref)
    assert io.read == 4 * (3 * s * d + 2 * s * s) and io.written == 4 * (3 * s * s // 1 - s * s + s * d)
    counts = {}
    for m in (512, 2048):
        io = kernels.IOCounter()
        torch.testing.assert_close(kernels.flash_forward_io(q, k, v, io, sram_elements=m), ref)
        br, bc = kernels.paper_block_sizes(m, d)
        assert (br, bc) == (min(math.ceil(m / (4 * d)), d), math.ceil(m / (4 * d)))
        assert io.total == kernels.flash_io_bytes(s, d, m)
        counts[m] = io.total
    assert 3.0 < counts[512] / counts[2048] < 4.0  # Θ(s²d²/M): 4× the SRAM, ~4× fewer bytes


def test_peak_memory_grows_4x_naive_and_about_2x_tiled():
    peaks = {}
    for s in (256, 512):
        q, k, v = (torch.randn(1, 2, s, 32) for _ in range(3))
        peaks[s] = (
            kernels.peak_forward_bytes(kernels.naive_attention, q, k, v),
            kernels.peak_forward_bytes(kernels.flash_attention, q, k, v, block_q=128, block_k=128),
        )
    naive, tiled = peaks[512][0] / peaks[256][0], peaks[512][1] / peaks[256][1]
    assert naive > 3.2 and tiled < 2.2, (naive, tiled)


# ---- Triton, interpreted on CPU -------------------------------------------------------------------
@pytest.fixture(scope="module")
def tk():
    return pytest.importorskip("mlsys_nb.kernels.triton_kernels")


DEV = "cuda" if torch.cuda.is_available() else "cpu"  # interpreted on CPU tensors, compiled on a GPU


def test_triton_kernels_equal_torch(tk):
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(1000, generator=g), torch.randn(1000, generator=g)
    torch.testing.assert_close(tk.vector_add(x.to(DEV), y.to(DEV)).cpu(), x + y)
    s = torch.randn(7, 37, generator=g) * 30
    torch.testing.assert_close(tk.softmax(s.to(DEV)).cpu(), torch.softmax(s, -1))
    a, b = torch.randn(40, 50, generator=g), torch.randn(50, 33, generator=g)
    torch.testing.assert_close(tk.matmul(a.to(DEV), b.to(DEV)).cpu(), a @ b, atol=1e-4, rtol=1e-4)
    for b_, h, kvh, sq, sk, d, causal in [(1, 4, 2, 19, 37, 8, True), (1, 2, 2, 1, 29, 16, True)]:
        q, k, v = (t.detach() for t in _inputs(b_, h, kvh, sq, sk, d))
        out = tk.triton_attention(q.to(DEV), k.to(DEV), v.to(DEV), causal=causal).cpu()
        torch.testing.assert_close(out, _sdpa(q, k, v, causal), atol=2e-5, rtol=1e-4)


def test_a_triton_softmax_without_the_max_overflows(tk):
    s = (torch.randn(4, 20, generator=torch.Generator().manual_seed(5)) * 10 + 100).to(DEV)  # exp(100) > fp32 max
    assert torch.isfinite(tk.softmax(s)).all()
    with pytest.warns(RuntimeWarning) if tk.INTERPRETED else _nothing():
        assert not torch.isfinite(tk.softmax(s, subtract_max=False)).all()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_without_triton_the_import_error_names_the_extra(monkeypatch):
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # what an install without the extra looks like
    monkeypatch.setitem(sys.modules, "triton.language", None)
    monkeypatch.delitem(sys.modules, "mlsys_nb.kernels.triton_kernels", raising=False)
    with pytest.raises(ImportError, match=r"pip install -e \.\[kernels\]"):
        importlib.import_module("mlsys_nb.kernels.triton_kernels")


def test_merge_segments_equals_folding_merge_partials():
    """``merge_segments`` (every partial of a segment at once, shifted by the segment's max) against folding the
    pairwise ``merge_partials`` over each segment's partials, on random partials with log-sum-exps up to 300 (where
    an unshifted e^lse overflows fp32: the broken idea, shown to give inf/nan)."""
    from mlsys_nb.kernels import merge_partials, merge_segments

    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        n_seg = int(torch.randint(1, 6, (1,), generator=g))
        seq = torch.cat(
            [torch.arange(n_seg), torch.randint(0, n_seg, (int(torch.randint(0, 12, (1,), generator=g)),), generator=g)]
        )
        seq = seq[torch.randperm(len(seq), generator=g)]
        out = torch.randn(len(seq), 3, 4, generator=g)
        lse = torch.randn(len(seq), 3, generator=g) * 50 + 250
        got, got_lse = merge_segments(out, lse, seq, n_seg)
        for s in range(n_seg):
            idx = (seq == s).nonzero().flatten().tolist()
            o, m = out[idx[0]], lse[idx[0]]
            for i in idx[1:]:
                o, m = merge_partials(o, m, out[i], lse[i])
            torch.testing.assert_close(got[s], o, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(got_lse[s], m, rtol=1e-6, atol=1e-4)
    unshifted = torch.exp(lse)  # what a merge without the segment max would weight by
    assert not torch.isfinite(unshifted).all()
