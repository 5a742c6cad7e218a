"""Calibration figures other notebooks reuse: device-to-device copy bandwidth, a bf16 8192^3 matmul
(TFLOP/s and its fraction of the table peak), kernel launch latency, host<->device copies.

Each check compares with an independent bound: a copy is bit-exact and no faster than the table's
HBM bandwidth (data/hardware.yaml); the matmul equals an fp64 reference on sampled rows and stays below
the table's bf16 peak."""

import time

import pytest
import torch

from mlsys_nb.runtime.gpu_record import cuda_seconds

pytestmark = pytest.mark.gpu

GiB = 2**30


def table_gpu():
    """The data/hardware.yaml entry for this device, or None (a GPU the table lacks)."""
    from mlsys_nb import hardware

    name = torch.cuda.get_device_name(0).upper()
    for key in ("H200", "H100", "A100", "H800", "L40S", "B200"):
        if key in name:
            cands = [g for n, g in hardware.gpus().items() if n.startswith(key)]
            if "NVL" in name:
                cands = [g for g in cands if "NVL" in g.name] or cands
            if "SXM" in name or "HBM3" in name:
                cands = [g for g in cands if "SXM" in g.name] or cands
            if key == "A100":
                cands = [g for g in cands if ("80GB" in g.name) == ("80GB" in name)] or cands
            return cands[0] if cands else None
    return None


def test_device_to_device_copy_bandwidth(cuda, record):
    n = GiB // 4
    src = torch.randint(0, 2**31 - 1, (n,), device=cuda, dtype=torch.int32)
    dst = torch.empty_like(src)
    t = min(cuda_seconds(lambda: dst.copy_(src), reps=10, warmup=2))
    assert torch.equal(dst, src)
    bw = 2 * src.numel() * 4 / t  # read + write
    record("device-to-device copy (1 GiB, read + write)", bw / 1e12, "TB/s", "best of 10")
    gpu = table_gpu()
    if gpu is not None:
        record("copy / table HBM bandwidth", bw / gpu.hbm_bandwidth_bytes_per_s, "ratio", f"table: {gpu.name}")
        assert bw <= 1.05 * gpu.hbm_bandwidth_bytes_per_s, "faster than the datasheet: the timing is wrong"


def test_bf16_matmul_8192(cuda, record):
    n = 8192
    g = torch.Generator(device=cuda).manual_seed(1)
    a = torch.randn(n, n, device=cuda, generator=g, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=cuda, generator=g, dtype=torch.bfloat16)
    c = a @ b
    rows = torch.randint(0, n, (32,), device=cuda, generator=g)
    want = a[rows].double() @ b.double()
    assert ((c[rows].double() - want).norm() / want.norm()).item() < 1e-2
    times = cuda_seconds(lambda: a @ b, reps=10, warmup=3)
    flops = 2 * n**3 / min(times)
    record("bf16 matmul 8192^3", flops / 1e12, "TFLOP/s", "best of 10")
    record("bf16 matmul 8192^3 (median)", 2 * n**3 / sorted(times)[5] / 1e12, "TFLOP/s")
    gpu = table_gpu()
    if gpu is not None:
        record("matmul MFU vs table bf16 peak", flops / gpu.peak("bf16"), "ratio", f"table: {gpu.name}")
        assert flops <= 1.05 * gpu.peak("bf16"), "faster than the datasheet peak: the timing is wrong"


def test_kernel_launch_latency(cuda, record):
    x = torch.zeros(1, device=cuda)
    n = 2000
    for _ in range(100):
        x.add_(1)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        x.add_(1)
    t_launch = (time.perf_counter() - t0) / n  # CPU side: issuing one launch
    torch.cuda.synchronize()
    t_all = (time.perf_counter() - t0) / n  # until the device has run them all
    assert x.item() == 100 + n
    record("launch cost per tiny kernel (CPU side)", t_launch * 1e6, "us", f"{n} x add_ on 1 element")
    record("time per tiny kernel incl. device", t_all * 1e6, "us", "wall / launches after synchronize")

    # one launch + synchronize: the round trip a step pays when it waits for the GPU
    def one():
        x.add_(1)
        torch.cuda.synchronize()

    ts = []
    for _ in range(200):
        t0 = time.perf_counter()
        one()
        ts.append(time.perf_counter() - t0)
    record("launch + synchronize round trip (median)", sorted(ts)[100] * 1e6, "us")


@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "pageable"])
def test_host_device_copies(cuda, record, pinned):
    n = 256 * 2**20  # 256 MiB
    host = torch.randint(0, 255, (n,), dtype=torch.uint8)
    if pinned:
        host = host.pin_memory()
    dev = torch.empty(n, dtype=torch.uint8, device=cuda)
    back = torch.empty(n, dtype=torch.uint8, pin_memory=pinned)  # empty_like(host) would NOT be pinned
    assert back.is_pinned() == pinned and host.is_pinned() == pinned
    h2d = min(cuda_seconds(lambda: dev.copy_(host, non_blocking=pinned), reps=5, warmup=1))
    d2h = min(cuda_seconds(lambda: back.copy_(dev, non_blocking=pinned), reps=5, warmup=1))
    torch.cuda.synchronize()
    assert torch.equal(back, host)
    kind = "pinned" if pinned else "pageable"
    record(f"host -> device ({kind}, 256 MiB)", n / h2d / 1e9, "GB/s", "best of 5")
    record(f"device -> host ({kind}, 256 MiB)", n / d2h / 1e9, "GB/s", f"best of 5, {kind} destination")
