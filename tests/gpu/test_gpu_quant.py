"""Weight-only quantization on a GPU: the formats of ``mlsys_nb.quant`` quantized on the device equal the CPU's
(int8 per channel, int4 g128, NF4 with double quantization), and an int8-weight decode matmul
(``torch._weight_int8pack_mm``, bf16 activations) equals the bf16 matmul with the dequantized weights and is
timed against the bf16 matmul at batch 1 and 8. The speed-up is recorded, not asserted: it is what notebook 23's
roofline bound (weight bytes halved) predicts for memory-bound decode, and a GPU's kernels decide how much of it
is reached."""

import pytest
import torch
import torch.nn.functional as F

from mlsys_nb.runtime.gpu_record import cuda_seconds

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("scheme,group", [("int8", -1), ("int4", 128), ("nf4", 64)])
def test_quantize_on_the_gpu_equals_the_cpu(cuda, record, scheme, group):
    from mlsys_nb.quant import quantize

    w = torch.randn(512, 1024, generator=torch.Generator().manual_seed(0)) * 0.02
    cpu = quantize(w, scheme, group_size=group).dequantize()
    gpu = quantize(w.cuda(), scheme, group_size=group).dequantize().cpu()
    diff = (gpu - cpu).abs().max().item()
    record(f"{scheme} g{group}: max |GPU - CPU| after dequantize", diff, "", "512x1024 random weights")
    assert diff <= 1e-6 * w.abs().max().item()


@pytest.mark.parametrize("batch", [1, 8])
def test_int8_weight_only_decode_matmul(cuda, record, batch):
    from mlsys_nb.quant.speed import int8_weights

    n = 8192
    g = torch.Generator().manual_seed(1)
    w = torch.randn(n, n, generator=g) * 0.02
    q, s = int8_weights(w)
    q, s = q.cuda(), s.cuda()
    x = torch.randn(batch, n, generator=g).cuda().bfloat16()
    wb = w.cuda().bfloat16()
    try:
        out = torch._weight_int8pack_mm(x, q, s)
    except (NotImplementedError, RuntimeError) as e:  # a torch build without the CUDA kernel
        record(f"int8pack_mm batch {batch}", "unavailable", "", str(e).splitlines()[0][:120])
        pytest.skip(f"torch._weight_int8pack_mm has no CUDA kernel in this build: {e}")
    ref = F.linear(x, (q.float() * s.float()[:, None]).bfloat16())
    err = ((out.float() - ref.float()).norm() / ref.float().norm()).item()
    record(f"int8 vs dequantized bf16 matmul, batch {batch}: rel. error", err, "", "asserted < 1e-2")
    assert err < 1e-2
    t_int8 = min(cuda_seconds(lambda: torch._weight_int8pack_mm(x, q, s), reps=20, warmup=3))
    t_bf16 = min(cuda_seconds(lambda: F.linear(x, wb), reps=20, warmup=3))
    record(f"int8 weight-only {n}x{n}, batch {batch}", t_int8 * 1e6, "us", "best of 20")
    record(f"bf16 {n}x{n}, batch {batch}", t_bf16 * 1e6, "us", "best of 20")
    record(f"int8 speed-up over bf16, batch {batch}", t_bf16 / t_int8, "x", "model bound: 2x (weight bytes)")
