"""Precision on the tensor cores: bf16 and fp16 autocast matmuls (error against fp64, TFLOP/s), and FP8
(e4m3) ``torch._scaled_mm`` where the GPU has FP8 (compute capability >= 8.9) against the same FP8 codes
multiplied in fp32: the tensor-core result must equal the emulation up to fp32 accumulation order."""

import pytest
import torch

from mlsys_nb.runtime.gpu_record import cuda_seconds
from test_gpu_calibration import table_gpu

pytestmark = pytest.mark.gpu
N = 8192


def rand(*shape, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", generator=g)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_autocast_matmul(cuda, record, dtype):
    a, b = rand(N, N, seed=1), rand(N, N, seed=2)
    with torch.autocast("cuda", dtype=dtype):
        c = a @ b
    assert c.dtype == dtype
    ref = a[:32].double() @ b.double()
    err = ((c[:32].double() - ref).norm() / ref.norm()).item()
    unit = 2.0 ** -(8 if dtype == torch.bfloat16 else 11)  # input rounding, one ulp/2 per operand
    record(f"autocast {str(dtype)[6:]} matmul rel. error vs fp64", err, "", f"unit roundoff {unit:.1e}")
    assert unit / 10 < err < 4 * unit
    a16, b16 = a.to(dtype), b.to(dtype)
    t = min(cuda_seconds(lambda: a16 @ b16, reps=10, warmup=3))
    record(f"{str(dtype)[6:]} matmul {N}^3", 2 * N**3 / t / 1e12, "TFLOP/s", "best of 10")
    t32 = min(cuda_seconds(lambda: a @ b, reps=3, warmup=1))
    record(f"fp32 matmul {N}^3 (TF32 off by default)", 2 * N**3 / t32 / 1e12, "TFLOP/s", "best of 3")


def test_fp8_scaled_mm(cuda, record):
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no FP8 tensor cores (compute capability < 8.9)")
    fp8 = torch.float8_e4m3fn
    a, b = rand(N, N, seed=3), rand(N, N, seed=4)
    sa = (448.0 / a.abs().max()).float()
    sb = (448.0 / b.abs().max()).float()
    a8 = (a * sa).to(fp8)
    b8 = (b * sb).to(fp8).t().contiguous().t()  # column-major second operand, as cuBLASLt wants
    inv_a, inv_b = (1 / sa).reshape(()), (1 / sb).reshape(())
    c = torch._scaled_mm(a8, b8, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)
    emu = (a8[:32].float() / sa) @ (b8.float() / sb)
    torch.testing.assert_close(c[:32].float(), emu, rtol=1e-2, atol=1e-2 * emu.abs().max().item())
    exact = a[:32].double() @ b.double()
    record("FP8 e4m3 matmul rel. error vs fp64", ((c[:32].double() - exact).norm() / exact.norm()).item(), "")
    t = min(cuda_seconds(lambda: torch._scaled_mm(a8, b8, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.bfloat16)))
    flops = 2 * N**3 / t
    record(f"FP8 _scaled_mm {N}^3", flops / 1e12, "TFLOP/s", "best of 10, bf16 out")
    gpu = table_gpu()
    if gpu is not None and "fp8" in gpu.peak_flops:
        record("FP8 matmul / table fp8 peak", flops / gpu.peak("fp8"), "ratio", f"table: {gpu.name}")
        assert flops <= 1.05 * gpu.peak("fp8")
