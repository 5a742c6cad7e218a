from mlsys_nb import hardware


def test_every_number_is_a_number_with_a_source():
    for g in hardware.gpus().values():
        assert isinstance(g.memory_bytes, float) and g.memory_bytes > 1e9, g
        assert isinstance(g.hbm_bandwidth_bytes_per_s, float), g
        assert all(isinstance(v, float) for v in g.peak_flops.values()), g
        assert g.source and (g.nvlink is None or g.nvlink in hardware.links())
    for ln in hardware.links().values():
        assert isinstance(ln.per_direction_bytes_per_s, float) and ln.source, ln
        # bidirectional is both directions added (NVIDIA datasheets)
        assert ln.bidirectional_bytes_per_s == 2 * ln.per_direction_bytes_per_s, ln


def test_published_ridge_point():
    h100 = hardware.gpu("H100-SXM")
    assert round(h100.peak("bf16") / h100.hbm_bandwidth_bytes_per_s) == 295  # H100 SXM ridge point


def test_memory_is_what_the_device_reports_where_published():
    """An "80 GB" H100 reports 81,559 MiB (85.52e9 B) in nvidia-smi: memory_bytes is that reported total (not the
    decimal "80 GB"); what PyTorch can see is less (the next test)."""
    MiB = 1 << 20
    assert hardware.gpu("H100-SXM").memory_bytes == 81559 * MiB
    assert hardware.gpu("A100-80GB-SXM").memory_bytes == 81920 * MiB
    assert hardware.gpu("A100-40GB-SXM").memory_bytes == 40960 * MiB
    assert hardware.gpu("L4").memory_bytes == 23034 * MiB
    for g in hardware.gpus().values():
        kind = g.memory_source.split(":")[0]
        assert kind in ("reported", "datasheet"), f"{g.name}: memory_source must say reported or datasheet"
        if kind == "reported":
            assert g.memory_bytes % MiB == 0 or g.memory_bytes % 4096 == 0, g.name  # a device total, not a round GB


def test_every_link_latency_says_where_it_comes_from():
    """No datasheet gives a one-message latency: each is labelled an assumed default (or cites one)."""
    for ln in hardware.links().values():
        assert ln.latency_source.startswith("assumed default") or "arXiv" in ln.latency_source, ln
        assert 1e-7 < ln.latency_s < 1e-3, ln  # seconds: microseconds, not milliseconds or ns


def test_fit_verdicts_use_the_cuda_visible_total_where_it_was_measured():
    """An H100 80GB HBM3 shows PyTorch 85,017,493,504 B (the GPU pack's test_device_query) while nvidia-smi
    says 85,520,809,984 B: a state between the two fits by nvidia-smi's total and not on the device. The
    verdict uses the visible total and says so; judged against memory_bytes (the mutation) it would pass."""
    import re
    from pathlib import Path

    h100 = hardware.gpu("H100-SXM")
    record = (Path(__file__).resolve().parents[1] / "data/measured/gpu-h100-80gb-hbm3.md").read_text()
    recorded = int(re.search(r"\| test_device_query \| device total memory \| (\d+) \| B \|", record).group(1))
    assert h100.visible_memory_bytes == recorded == 85017493504
    assert "test_device_query" in h100.visible_memory_source and h100.visible_memory_source.startswith("measured")
    assert h100.memory_bytes - h100.visible_memory_bytes == 503316480  # 480 MiB, 0.59 % of nvidia-smi's total
    edge = 85.3e9  # between the two totals
    assert edge <= h100.memory_bytes  # the mutation: nvidia-smi's total says it fits
    assert h100.fit_memory_bytes == recorded and not h100.fits(edge)
    verdict = h100.fit_verdict(edge)
    assert verdict.startswith("does not fit") and "CUDA-visible total (measured)" in verdict, verdict
    assert h100.fits(84.9e9) and h100.fit_verdict(84.9e9).startswith("fits: 84.90 GB <= 85.02 GB")
    # where no device was measured, the verdict falls back to memory_bytes and names that total
    for g in hardware.gpus().values():
        if g.visible_memory_bytes is None:
            assert g.fit_memory_bytes == g.memory_bytes
            assert g.fit_memory_label in ("nvidia-smi total (reported)", "datasheet total"), g.name
        else:
            assert g.visible_memory_bytes < g.memory_bytes, g.name  # CUDA sees less than nvidia-smi reports
