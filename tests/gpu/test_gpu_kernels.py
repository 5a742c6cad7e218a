"""The kit's kernels on a GPU: the Triton kernels compiled (not interpreted) against independent
references, the PyTorch FlashAttention equal to SDPA (output and the three gradients), and time and
peak memory of naive attention, the kit's FlashAttention, Triton's forward and SDPA.

The kit's Triton matmul and attention call ``tl.dot(..., input_precision="ieee")``: full fp32 products, not
TF32 (Triton's default for fp32 inputs on tensor cores: a 10-bit mantissa, ~5e-4 relative per product). The
matmul is held to 1e-5 relative error against fp64 (the H100 recorded 2.5e-7 at 300x200x170; TF32, which
rounds each input to 11 significant bits, would be ~1e-4 by estimate and fail); the attention kernels to 5e-3
against SDPA (as first run); a wrong kernel is off by O(1)."""

import pytest
import torch
import torch.nn.functional as F

from mlsys_nb.runtime.gpu_record import cuda_seconds

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def tk():
    import mlsys_nb.kernels  # noqa: F401  (sets TRITON_INTERPRET only without CUDA)
    from mlsys_nb.kernels import triton_kernels

    assert not triton_kernels.INTERPRETED, "TRITON_INTERPRET=1 is set: the pack measures compiled kernels"
    return triton_kernels


def rand(*shape, seed=0, dtype=torch.float32):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g, dtype=dtype)


def test_triton_elementwise_softmax_matmul_compiled(tk, cuda, record):
    x, y = rand(100_003, seed=1), rand(100_003, seed=2)
    assert torch.equal(tk.vector_add(x, y), x + y)
    s = rand(64, 1000, seed=3) * 30
    want = torch.softmax(s.double(), dim=-1)
    torch.testing.assert_close(tk.softmax(s).double(), want, rtol=1e-5, atol=1e-6)
    a, b = rand(300, 200, seed=4), rand(200, 170, seed=5)
    ref = a.double() @ b.double()
    err = ((tk.matmul(a, b).double() - ref).norm() / ref.norm()).item()
    record("Triton matmul rel. error vs fp64 (300x200x170)", err, "", "fp32 tl.dot (input_precision='ieee')")
    assert err < 1e-5, "tl.dot must run in IEEE fp32 (input_precision='ieee'), not TF32"


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_triton_attention_equals_sdpa(tk, cuda, record, causal):
    b, h, hk, s, d = 2, 8, 2, 1000, 64  # GQA, a ragged last block
    q, k, v = rand(b, h, s, d, seed=6), rand(b, hk, s, d, seed=7), rand(b, hk, s, d, seed=8)
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    got = tk.triton_attention(q, k, v, causal=causal, block=64)
    torch.testing.assert_close(got, want, rtol=5e-3, atol=5e-3)
    t_tri = min(cuda_seconds(lambda: tk.triton_attention(q, k, v, causal=causal, block=64), reps=5))
    t_sdpa = min(cuda_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)))
    kind = "causal" if causal else "full"
    record(f"Triton attention fwd ({kind}, 2x8x1000x64 fp32)", t_tri * 1e3, "ms", "best of 5, interleaved order")
    record(f"SDPA fwd ({kind}, same shape)", t_sdpa * 1e3, "ms", "best of 10")


def test_flash_attention_equals_sdpa_with_gradients(cuda, record):
    from mlsys_nb.kernels import flash_attention

    b, h, hk, s, d = 2, 4, 2, 777, 64
    qkv = [rand(b, n, s, d, seed=i).requires_grad_(True) for i, n in enumerate((h, hk, hk))]
    ref = [t.detach().clone().requires_grad_(True) for t in qkv]
    dout = rand(b, h, s, d, seed=9)
    out = flash_attention(*qkv, causal=True)
    want = F.scaled_dot_product_attention(*ref, is_causal=True, enable_gqa=True)
    out.backward(dout)
    want.backward(dout)
    torch.testing.assert_close(out, want, rtol=2e-4, atol=2e-4)
    for got, exp in zip(qkv, ref):
        torch.testing.assert_close(got.grad, exp.grad, rtol=2e-3, atol=2e-3)
    record("flash_attention == SDPA (out, dq, dk, dv; causal GQA)", "equal within 2e-3", "")


@pytest.mark.parametrize("s", [2048, 8192])
def test_attention_time_and_peak_memory(tk, cuda, record, s):
    from mlsys_nb.kernels import flash_attention, naive_attention

    b, h, d = 1, 8, 64
    q, k, v = rand(b, h, s, d, seed=10), rand(b, h, s, d, seed=11), rand(b, h, s, d, seed=12)
    variants = {
        "naive": lambda: naive_attention(q, k, v, causal=True),
        "kit flash_attention (PyTorch)": lambda: flash_attention(q, k, v, causal=True, block_q=256, block_k=256),
        "Triton forward": lambda: tk.triton_attention(q, k, v, causal=True, block=64),
        "SDPA": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
    }
    want = variants["SDPA"]()
    for name, fn in variants.items():
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
        torch.testing.assert_close(out, want, rtol=5e-3, atol=5e-3)
        del out
        t = min(cuda_seconds(fn, reps=3, warmup=1))
        record(f"{name}, s={s}: forward time", t * 1e3, "ms", "best of 3, fp32, causal")
        record(f"{name}, s={s}: peak memory above inputs", peak, "B", "max_memory_allocated")
        if name == "naive":
            scores = b * h * s * s * 4
            assert peak >= scores, "the naive path materialises the s x s scores"
        else:
            assert peak < b * h * s * s * 4, f"{name} must not hold the s x s scores"
