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
    """An "80 GB" H100 reports 81,559 MiB (85.52e9 B): fits / OOM verdicts use the reported total."""
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
