"""The Triton FlashAttention (``kernels/triton_flash.py``) under Triton's interpreter on CPU (compiled on a GPU):
outputs, log-sum-exp and the three gradients equal SDPA's and the kit's ``flash_attention`` on odd shapes, causal
and not, GQA, fp32 and bf16; the causal loop visits about half the key tiles (counted by the kernel itself); and
the broken ideas fail: a causal loop that is not bounded at the diagonal, a backward without D = rowsum(dO ∘ O).
Sizes are tiny: the interpreter runs every program one after another in numpy."""

import math

import pytest
import torch
import torch.nn.functional as F

tf = pytest.importorskip("mlsys_nb.kernels.triton_flash")
from mlsys_nb.kernels import flash_attention  # noqa: E402
from mlsys_nb.kernels.triton_kernels import tl, triton  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # interpreted on CPU tensors, compiled on a GPU
# (batch, heads, kv_heads, s_q, s_k, head_dim, causal): ragged tiles everywhere, GQA, one query, s_q > s_k
CASES = [(1, 4, 2, 19, 37, 24, True), (2, 3, 3, 33, 20, 8, False), (1, 2, 1, 1, 29, 16, True)]


def _inputs(b, h, kvh, sq, sk, d, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    shapes = ((b, h, sq, d), (b, kvh, sk, d), (b, kvh, sk, d), (b, h, sq, d))
    q, k, v, dout = (torch.randn(*s, generator=g).to(dtype) for s in shapes)
    return q, k, v, dout


def _run(fn, q, k, v, dout):
    """``fn``'s output and its gradients for q, k, v (on DEV), returned on the CPU in fp32."""
    q, k, v = (t.to(DEV).requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), dout.to(DEV))
    return [t.detach().float().cpu() for t in (out, *grads)]


def _sdpa(causal):
    def fn(q, k, v):
        sq, sk = q.shape[2], k.shape[2]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(sk - sq) if causal else None
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # bottom-right aligned

    return fn


@pytest.mark.parametrize("case", CASES, ids=str)
def test_fp32_forward_and_gradients_equal_sdpa_and_the_kits_flash_attention(case):
    *shape, causal = case
    q, k, v, dout = _inputs(*shape)
    got = _run(lambda *t: tf.flash_attention_triton(*t, causal=causal), q, k, v, dout)
    want = _run(_sdpa(causal), q, k, v, dout)
    kit = _run(lambda *t: flash_attention(*t, causal=causal, block_q=8, block_k=8), q, k, v, dout)
    for name, a, b, c in zip(("out", "dq", "dk", "dv"), got, want, kit):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=2e-5, msg=f"{name} vs SDPA")
        torch.testing.assert_close(a, c, rtol=1e-4, atol=2e-5, msg=f"{name} vs flash_attention")


def test_the_log_sum_exp_is_logsumexp_of_the_visible_scores():
    q, k, v, _ = _inputs(1, 2, 1, 21, 40, 16, seed=3)
    out, lse = tf.flash_forward(q.to(DEV), k.to(DEV), v.to(DEV), causal=True)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(16)
    s = s.masked_fill(~torch.ones(21, 40, dtype=torch.bool).tril(40 - 21), float("-inf"))
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, 21)
    torch.testing.assert_close(lse.cpu(), torch.logsumexp(s, -1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_bf16_is_within_a_few_roundings_of_the_fp32_truth(causal):
    """bf16 tiles into the matrix units, fp32 accumulation: against fp32 attention of the same bf16 values each of
    the output and the three gradients is within 4 bf16 unit roundoffs (2⁻⁸) of its largest entry. Measured over
    seeds 0-3: at most 2.3 units (SDPA's bf16 on this CPU: 1.4; the kernel also rounds P and dS to bf16 before
    their matmuls, as FlashAttention does on a GPU). A wrong mask, scale or D is off by tenths or more."""
    q, k, v, dout = _inputs(1, 4, 2, 23, 37, 32, seed=1, dtype=torch.bfloat16)
    got = _run(lambda *t: tf.flash_attention_triton(*t, causal=causal), q, k, v, dout)
    truth = _run(_sdpa(causal), q.float(), k.float(), v.float(), dout.float())
    for name, a, t in zip(("out", "dq", "dk", "dv"), got, truth):
        units = (a - t).abs().max().item() / (2**-8 * t.abs().max().item())
        assert units <= 4, (name, units)
    out = tf.flash_attention_triton(q.to(DEV), k.to(DEV), v.to(DEV), causal=causal)
    assert out.dtype == torch.bfloat16


def _tile_counts(sq, sk, causal, seed=0):
    q, k, v, _ = _inputs(1, 2, 1, sq, sk, 16, seed=seed)
    return tf.flash_forward(q.to(DEV), k.to(DEV), v.to(DEV), causal=causal, block=16, count_tiles=True)[2].cpu()


def _check_causal_visits_about_half(counts, sq, sk):
    """The tile-count test: every query tile visits what ``key_tiles_visited`` says, and, square, about half."""
    want = tf.key_tiles_visited(sq, sk, 16, 16, True)
    assert counts.tolist() == [want] * counts.shape[0], (counts.tolist(), want)
    n = -(-sk // 16)
    if sq == sk:  # n(n+1)/2 of n² tiles
        assert counts[0].sum().item() == n * (n + 1) // 2 and counts[0].sum().item() / n**2 < 0.6


def test_the_causal_loop_stops_at_the_diagonal():
    for sq, sk in ((128, 128), (40, 100)):  # square: 36 of 64 tiles; queries the last 40 of 100 positions
        _check_causal_visits_about_half(_tile_counts(sq, sk, causal=True), sq, sk)
    full = _tile_counts(40, 100, causal=False)
    assert full.tolist() == [[7, 7, 7]] * 2 == [tf.key_tiles_visited(40, 100, 16, 16, False)] * 2
    assert tf.key_tiles_visited(128, 128, 16, 16, True) == [1, 2, 3, 4, 5, 6, 7, 8]


@triton.jit
def _unbounded_key_range(m0, sq, sk, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    return 0 * m0, sk + 0 * m0  # every key tile, all masked: correct output, twice the work


@pytest.mark.skipif(not tf.INTERPRETED, reason="swaps a jit function at run time: the interpreter only")
def test_mutation_an_unbounded_causal_loop_fails_the_tile_count(monkeypatch):
    q, k, v, _ = _inputs(1, 2, 1, 128, 128, 16)
    good = tf.flash_forward(q, k, v, causal=True, block=16)[0]
    monkeypatch.setattr(tf, "key_range", _unbounded_key_range)
    counts = _tile_counts(128, 128, causal=True)
    assert counts.tolist() == [[8] * 8] * 2  # every tile visited
    with pytest.raises(AssertionError):
        _check_causal_visits_about_half(counts, 128, 128)
    torch.testing.assert_close(tf.flash_forward(q, k, v, causal=True, block=16)[0], good)  # the mask still holds


def test_mutation_a_backward_without_d_gets_wrong_gradients(monkeypatch):
    """D = rowsum(dO ∘ O) is the softmax Jacobian's row term: with D = 0 dQ and dK are wrong (dV needs no D)."""
    q, k, v, dout = _inputs(1, 2, 1, 19, 37, 16, seed=2)
    want = _run(_sdpa(True), q, k, v, dout)
    monkeypatch.setattr(tf, "flash_row_term", lambda dout, out: torch.zeros(out.shape[:-1], device=out.device))
    got = _run(lambda *t: tf.flash_attention_triton(*t, causal=True), q, k, v, dout)
    torch.testing.assert_close(got[3], want[3], rtol=1e-4, atol=2e-5)
    for a, b in zip(got[1:3], want[1:3]):
        assert (a - b).abs().max().item() > 1e-2


def test_the_row_term_kernel_equals_pytorchs():
    from mlsys_nb.kernels.attention import row_term

    for shape, dtype in (((2, 3, 21, 24), torch.float32), ((1, 2, 5, 64), torch.bfloat16)):
        dout, out = (torch.randn(*shape, generator=torch.Generator().manual_seed(i)).to(dtype) for i in range(2))
        got = tf.flash_row_term(dout.to(DEV), out.to(DEV)).cpu()
        assert got.dtype == torch.float32 and got.shape == shape[:-1]
        torch.testing.assert_close(got, row_term(dout.float(), out.float()), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="dout and out"):
        tf.flash_row_term(dout, out[..., :3])


def test_bad_inputs_name_the_parameter():
    q, k, v, _ = _inputs(1, 2, 1, 5, 7, 16)
    with pytest.raises(ValueError, match="dtype"):
        tf.flash_forward(q, k.double(), v)
    with pytest.raises(ValueError, match="s_q <= s_k"):
        tf.flash_forward(torch.zeros(1, 1, 9, 16), k, v, causal=True)
    with pytest.raises(ValueError, match="head_dim"):
        tf.flash_forward(*(torch.zeros(1, 1, 3, 300) for _ in range(3)))
    with pytest.raises(ValueError, match="s_k"):
        tf.flash_forward(q, k[:, :, :0], v[:, :, :0])
    with pytest.raises(ValueError, match="block"):
        tf.flash_forward(q, k, v, block=8)
    with pytest.raises(TypeError, match="causal"):
        tf.flash_attention_triton(q, k, v, causal=1)


def test_the_autotune_lists_hold_tensor_core_tiles_and_half_inputs_take_the_default_dot(monkeypatch):
    for cfg in tf.FWD_CONFIGS + tf.DKDV_CONFIGS + tf.DQ_CONFIGS:
        bm, bn = cfg.kwargs["BM"], cfg.kwargs["BN"]
        assert bm >= 16 and bn >= 16 and bm & (bm - 1) == 0 and bn & (bn - 1) == 0 and cfg.num_warps in (4, 8)
    monkeypatch.setattr(tf, "INTERPRETED", False)
    assert tf.dot_precision(torch.bfloat16) == tf.dot_precision(torch.float16) == "tf32"  # the MMA for half tiles
    assert tf.dot_precision(torch.float32) == "ieee"
