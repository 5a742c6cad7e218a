"""The inference widget, driven headless: its numbers are the calculators', it redraws, and invalid
input is shown in place."""

from mlsys_nb.inference import kv_cache_bytes, max_concurrent_sequences
from mlsys_nb.inference.roofline import decode_cost, prefill_cost
from mlsys_nb.widgets.inference import InferenceWidget


def test_widget_follows_the_calculators_and_redraws():
    w = InferenceWidget()
    assert w.error is None
    t0 = w.table()["value"]
    assert t0["KV cache per sequence"] == kv_cache_bytes("llama-3-8b", 8192) == 8192 * 131072
    assert t0["sequences that fit (per GPU, after weights)"] == max_concurrent_sequences("llama-3-8b", "H100-SXM", 8192)
    assert t0["decode step time (batch, at `context`)"] == decode_cost("llama-3-8b", "H100-SXM", 8192, batch=16).time_s
    lines0 = [list(map(float, ln.get_ydata())) for ln in w.figure.axes[0].lines]
    w.set_state({"model": "llama-2-7b", "batch": 4, "dtype": "fp8", "tp": 2, "context": 4096})
    t2 = w.table()["value"]
    assert t2["KV cache for the batch"] == kv_cache_bytes("llama-2-7b", 4 * 4096, "fp8")
    assert (
        t2["prefill time (one prompt of `context` tokens)"]
        == prefill_cost("llama-2-7b", "H100-SXM", 4096, kv_dtype="fp8").time_s
    )
    assert t2["sequences that fit (per GPU, after weights)"] == max_concurrent_sequences(
        "llama-2-7b", "H100-SXM", 4096, dtype="fp8", tp=2
    )
    assert [list(map(float, ln.get_ydata())) for ln in w.figure.axes[0].lines] != lines0
    assert "llama-2-7b" in w.stats.value and w.state()["tp"] == 2


def test_invalid_input_is_shown_in_place():
    w = InferenceWidget()
    w.set_state({"batch": 0})
    assert w.error and "batch" in w.error and "Invalid" in w.message.value and w.table().empty
    w.set_state({"batch": 8, "context": 10**7})
    assert "context" in w.error and "8192" in w.error
    w.set_state({"context": 1024})
    assert w.error is None and not w.table().empty


def _assert_does_not_fit_without_throughput(w, weights_gb: float, usable_gb: float, tp_needed: int):
    """The check of a layout that cannot run: the verdict with its numbers, no tokens/s anywhere."""
    assert w.error is None
    verdict = f"does not fit: weights {weights_gb:.3g} GB &gt; {usable_gb:.3g} GB usable; needs TP ≥ {tp_needed}"
    assert verdict.replace("&gt;", ">") in w.stats.value.replace("&gt;", ">"), w.stats.value
    assert "tokens/s" not in w.stats.value
    assert not any("decode" in q or "prefill" in q for q in w.table().index), list(w.table().index)
    roofline = w.figure.axes[0]
    points = [ln for ln in roofline.lines if ln.get_marker() in ("s", "o")]
    assert points and all(len(ln.get_xdata()) == 0 for ln in points), "an operating point for a layout that cannot run"


def _llama3_70b_params() -> int:
    """Llama-3-70B's parameter count from its published shape (Meta 2024: 80 layers, d 8192, FFN 28672,
    64 heads of 128, 8 KV heads, vocabulary 128256, untied embedding and head), by hand."""
    d, ff, layers, kv, hd, vocab = 8192, 28672, 80, 8, 128, 128256
    per_layer = d * d + 2 * d * kv * hd + d * d + 3 * d * ff + 2 * d  # q, k+v, o, SwiGLU, two RMSNorms
    return layers * per_layer + 2 * vocab * d + d


def test_70b_on_one_80gb_gpu_does_not_fit_and_shows_no_throughput():
    from mlsys_nb import hardware

    w = InferenceWidget(model="llama-3-70b", gpu="H100-SXM")  # 80 GB class (data/hardware.yaml: 85.5e9 bytes)
    params = _llama3_70b_params()
    assert 70.5e9 < params < 70.6e9  # Meta's model card: 70.6 B
    usable = 0.9 * hardware.gpu("H100-SXM").memory_bytes
    weights = 2 * params  # bf16
    assert weights > usable
    # TP 2 halves the weights (70.6 GB < 77.3 GB) and leaves room for one 8192-token KV cache, sharded
    # over 2 of the 8 KV heads' groups: 80 layers x 8 heads x 128 x (K, V) x 2 bytes x 8192 / 2
    kv_per_seq_tp2 = 80 * 8 * 128 * 2 * 2 * 8192 / 2
    assert weights / 2 + kv_per_seq_tp2 < usable
    _assert_does_not_fit_without_throughput(w, weights / 1e9, usable / 1e9, 2)
    w.set_state({"tp": 2, "batch": 1})
    assert "does not fit" not in w.stats.value and "tokens/s" in w.stats.value
    assert w.table()["value"]["sequences that fit (per GPU, after weights)"] >= 1


def test_the_does_not_fit_check_fails_on_the_old_behaviour():
    """The widget that showed '0 sequences fit' with 690 tokens/s fails the check above."""
    import pytest

    class ThroughputAnyway(InferenceWidget):
        def compute(self, state):
            return super().compute(state) | {"weights_fit": True, "batch_fits": True, "max_seqs": 1}

    with pytest.raises(AssertionError):
        _assert_does_not_fit_without_throughput(
            ThroughputAnyway(model="llama-3-70b"), 2 * _llama3_70b_params() / 1e9, 0.9 * 85.52e9 / 1e9, 2
        )


def test_a_batch_that_does_not_fit_has_no_decode_numbers():
    w = InferenceWidget()  # llama-3-8b, 8192 tokens, H100-SXM
    fit = max_concurrent_sequences("llama-3-8b", "H100-SXM", 8192)
    w.set_state({"batch": fit})
    assert "tokens/s" in w.stats.value and "decode throughput" in w.table().index
    w.set_state({"batch": fit + 1})
    assert f"batch {fit + 1} does not fit: only {fit} sequences fit" in w.stats.value
    assert "tokens/s" not in w.stats.value and "decode throughput" not in w.table().index


def test_min_tp_that_fits_against_the_memory_inequality():
    """On random models, GPUs, contexts and batches: the smallest TP in TP_CHOICES at which
    weights / tp + batch x KV bytes / (KV shards) <= 0.9 x GPU memory, written out directly."""
    import random

    from mlsys_nb import hardware
    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference import weight_bytes
    from mlsys_nb.inference.kv_cache import TP_CHOICES, min_tp_that_fits

    rng = random.Random(0)
    models = ["llama-3-8b", "llama-3-70b", "llama-2-7b"]
    for _ in range(12):
        name, gpu = rng.choice(models), hardware.gpu(rng.choice(["H100-SXM", "A100-40GB-SXM", "L4"]))
        cfg = load_model_preset(name)
        ctx, batch = rng.choice([1024, 8192, 32768]), rng.choice([1, 8, 64, 512])
        want = None
        for tp in TP_CHOICES:
            kv = batch * kv_cache_bytes(name, ctx) / min(tp, cfg.n_kv_heads)
            if weight_bytes(name) / tp + kv <= 0.9 * gpu.memory_bytes:
                want = tp
                break
        assert min_tp_that_fits(name, gpu, ctx, batch=batch) == want, (name, gpu.name, ctx, batch)


def test_the_paged_pool_row_is_the_engines_pool_for_every_kv_dtype():
    """One formula (``kv_cache.kv_block_bytes``) sizes the engine's paged pool and fills the widget's row: an
    engine given the blocks of one ``context``-token sequence allocates exactly the bytes the widget shows, for
    every KV dtype the widget offers (fp8 with its per-block scales). Fails if either side counts on its own
    (fp8 without scales, or no rounding up to whole blocks: the context is not a multiple of the block)."""
    import math

    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference import LLM
    from mlsys_nb.models import Transformer
    from mlsys_nb.widgets.inference import KV_DTYPES, PAGED_BLOCK_SIZE

    ctx = 100
    model = Transformer(load_model_preset("tiny")).eval()
    w = InferenceWidget(model="tiny", context=ctx, batch=1)
    for dt in KV_DTYPES:
        w.set_state({"dtype": dt})
        assert w.error is None, w.error
        table = w.table()["value"]
        (row,) = [q for q in table.index if q.startswith("paged KV pool per sequence")]
        kv = LLM(model, kv_cache_dtype=dt, num_blocks=math.ceil(ctx / PAGED_BLOCK_SIZE), max_num_seqs=1).engine.kv
        assert sum(t.nbytes for t in kv.tensors()) == table[row], dt


def test_a_tp_degree_that_does_not_divide_the_heads_is_refused():
    """llama-3-70b has 64 attention heads and 8 KV heads: TP 3 splits neither, refused as the memory model
    refuses it (issue 53); TP 8 splits both, TP 16 splits the query heads and replicates the KV heads."""
    w = InferenceWidget(model="llama-3-70b", tp=3)
    assert w.error and "TP degree 3" in w.error and "attention heads" in w.error and w.table().empty
    for tp in (8, 16):
        w.set_state({"tp": tp})
        assert w.error is None, (tp, w.error)
