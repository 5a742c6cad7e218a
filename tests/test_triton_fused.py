"""Fused RMSNorm (+ residual) and SwiGLU in Triton (``mlsys_nb.kernels.triton_fused``), interpreted on CPU tensors
(compiled on a GPU): outputs and every gradient equal the kit's eager modules (``nn.RMSNorm``, which
``models.transformer.build_norm`` builds; the MLP's ``F.silu(gate) * up``) and ``torch.compile`` of them, on odd
sizes, fp32 and bf16; the same checks fail with eps outside the root, with the residual's gradient dropped from
the backward, and with SwiGLU's arguments swapped."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mlsys_nb.config import ArgumentError, ModelConfig
from mlsys_nb.models.transformer import build_norm
import mlsys_nb.kernels  # noqa: F401  (at collection: sets TRITON_INTERPRET before any test imports triton)

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # interpreted on CPU tensors, compiled on a GPU
EPS = 1e-5


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("mlsys_nb.kernels.triton_fused")


def rand(*shape, seed, dtype=torch.float32, scale=1.0):
    return (torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale).to(dtype)


def norm_inputs(dtype, shape=(3, 5, 37)):
    """x (one row of tiny activations, where eps decides rstd), residual, weight, and upstream gradients."""
    x = rand(*shape, seed=1)
    x[0, 0] *= 1e-3  # mean(h²) ~ 1e-6 < eps in that row
    r = rand(*shape, seed=2)
    r[0, 0] *= 1e-3
    w = 1 + 0.3 * rand(shape[-1], seed=3)
    dy, dh = rand(*shape, seed=4), rand(*shape, seed=5)
    return [t.to(dtype) for t in (x, r, w, dy, dh)]


def eager_norm(x, r, w, eps=EPS):
    """The kit's model norm (``nn.RMSNorm``) after the residual add."""
    norm = nn.RMSNorm(x.shape[-1], eps=eps).to(device=x.device, dtype=x.dtype)
    with torch.no_grad():
        norm.weight.copy_(w)
    h = x + r
    return norm(h), h, norm.weight


def run_norm(fn, x, r, w, dy, dh):
    """Outputs (y, h) and gradients (x, residual, weight) of ``fn(x, r, w) -> (y, h, weight_leaf)`` with upstream
    gradients dy on y and dh on h (the residual stream feeds the next block)."""
    x, r = (t.detach().clone().to(DEV).requires_grad_() for t in (x, r))
    w = w.detach().clone().to(DEV).requires_grad_()
    y, h, wl = fn(x, r, w)
    torch.autograd.backward([y, h], [dy.to(DEV), dh.to(DEV)])
    wl = w if wl is None else wl
    return [t.detach().cpu() for t in (y, h, x.grad, r.grad, wl.grad)]


def test_kit_norm_is_nn_rmsnorm():
    cfg = ModelConfig(n_layers=1, hidden=37, n_heads=1, vocab_size=8, norm="rmsnorm", norm_eps=EPS)
    norm = build_norm(cfg)
    assert isinstance(norm, nn.RMSNorm) and norm.eps == EPS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 37), (2, 300)])
def test_rms_norm_with_residual_equals_eager(tf, dtype, shape):
    ins = norm_inputs(dtype, shape)
    got = run_norm(lambda x, r, w: (*tf.fused_rms_norm(x, w, EPS, residual=r), None), *ins)
    want = run_norm(eager_norm, *ins)
    assert_as_close_as_eager(got, want, ins, eager_norm, run_norm)


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def assert_as_close_as_eager(got, want, ins, eager, run):
    """fp32: equal to eager within 1e-5. bf16 (rounded once in the fused kernel, after every step in eager): no
    further from eager's fp32 result on the same inputs than eager's own bf16 result, or within 2^-7 (two bf16
    rounding steps; Triton's interpreter rounds fp32 -> bf16 toward zero, a GPU to nearest)."""
    if got[0].dtype == torch.float32:
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        return
    exact = run(eager, *(t.float() for t in ins))
    for i, (a, b, e) in enumerate(zip(got, want, exact)):
        assert a.dtype == b.dtype == torch.bfloat16
        assert rel(a, e) <= max(1.25 * rel(b, e), 2**-7), (i, rel(a, e), rel(b, e))


def test_rms_norm_without_residual_equals_eager(tf):
    x, _, w, dy, _ = norm_inputs(torch.float32)
    xs, ws = (t.clone().requires_grad_() for t in (x, w))
    y = tf.fused_rms_norm(xs.to(DEV), ws.to(DEV), EPS)
    y.backward(dy.to(DEV))
    xe, we = (t.clone().requires_grad_() for t in (x, w))
    ye = F.rms_norm(xe, (x.shape[-1],), we, EPS)
    ye.backward(dy)
    for a, b in ((y.cpu(), ye), (xs.grad, xe.grad), (ws.grad, we.grad)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_rms_norm_equals_torch_compile(tf):
    ins = norm_inputs(torch.float32)
    compiled = torch.compile(lambda x, r, w: (F.rms_norm(x + r, (x.shape[-1],), w, EPS), x + r, None), dynamic=False)
    want = run_norm(compiled, *ins)
    got = run_norm(lambda x, r, w: (*tf.fused_rms_norm(x, w, EPS, residual=r), None), *ins)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_the_checks_catch_eps_outside_the_root_and_a_dropped_residual_gradient(tf):
    ins = norm_inputs(torch.float32)
    want = run_norm(eager_norm, *ins)
    y, h, dx, dr, dw = run_norm(
        lambda x, r, w: (*tf.fused_rms_norm(x, w, EPS, residual=r, mistake="eps_outside_sqrt"), None), *ins
    )
    assert not torch.allclose(y, want[0], rtol=1e-5, atol=1e-5)  # the tiny row: 1/(1e-3 + 1e-5) vs 1/sqrt(1.1e-5)
    assert torch.allclose(y[1:], want[0][1:], rtol=1e-3, atol=1e-3)  # ordinary rows barely move: the test's row
    y, h, dx, dr, dw = run_norm(
        lambda x, r, w: (*tf.fused_rms_norm(x, w, EPS, residual=r, mistake="no_residual_grad"), None), *ins
    )
    torch.testing.assert_close(y, want[0], rtol=1e-5, atol=1e-5)  # the forward is right
    torch.testing.assert_close(dw, want[4], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(dx, want[2], rtol=1e-5, atol=1e-5)  # dx lacks dh: the residual stream's own path
    assert not torch.allclose(dr, want[3], rtol=1e-5, atol=1e-5)


def run_swiglu(fn, g, u, dy):
    g, u = (t.detach().clone().to(DEV).requires_grad_() for t in (g, u))
    y = fn(g, u)
    y.backward(dy.to(DEV))
    return [t.detach().cpu() for t in (y, g.grad, u.grad)]


def eager_swiglu(gate, up):
    return F.silu(gate) * up  # the kit's MLP (models.transformer.MLP, activation "swiglu")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_equals_eager_and_compiled(tf, dtype):
    shape = (3, 7, 113)  # 2373 elements: three programs, the last one ragged
    g, u, dy = (rand(*shape, seed=s, dtype=dtype, scale=3.0) for s in (6, 7, 8))
    got = run_swiglu(tf.swiglu, g, u, dy)
    refs = [run_swiglu(eager_swiglu, g, u, dy)]
    if dtype == torch.float32:
        refs.append(run_swiglu(torch.compile(eager_swiglu, dynamic=False), g, u, dy))
    for want in refs:
        assert_as_close_as_eager(got, want, (g, u, dy), eager_swiglu, run_swiglu)
    swapped = run_swiglu(lambda a, b: tf.swiglu(b, a), g, u, dy)  # the mutation: silu(up) * gate
    assert not any(torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-2) for a, b in zip(swapped, refs[0]))


def test_bad_input_names_the_parameter(tf):
    x, w = torch.randn(4, 8), torch.ones(8)
    with pytest.raises(ArgumentError, match="eps"):
        tf.fused_rms_norm(x, w, 0.0)
    with pytest.raises(ArgumentError, match="weight"):
        tf.fused_rms_norm(x, torch.ones(7))
    with pytest.raises(ArgumentError, match="residual"):
        tf.fused_rms_norm(x, w, residual=torch.randn(4, 9))
    with pytest.raises(ArgumentError, match="mistake"):
        tf.fused_rms_norm(x, w, mistake="eps_inside")
    with pytest.raises(ArgumentError, match="up"):
        tf.swiglu(x, torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(ArgumentError, match="gate"):
        tf.swiglu(torch.zeros(4, 8, dtype=torch.int64), x)
