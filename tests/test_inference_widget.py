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
