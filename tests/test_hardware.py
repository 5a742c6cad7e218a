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
