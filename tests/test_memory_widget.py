"""The memory widget, driven headless by setting control values."""

import pytest

from mlsys_nb import memory
from mlsys_nb.config import TrainConfig
from mlsys_nb.widgets.memory import MemoryWidget


def _heights(fig):
    return [round(p.get_height(), 6) for p in fig.axes[0].patches]


def test_widget_follows_the_calculator_and_redraws():
    w = MemoryWidget()
    assert w.error is None
    t0, h0 = w.table(), _heights(w.figure)
    want = memory.estimate(memory.preset("llama-3.1-8b"), TrainConfig(dp=8, zero=1, n_microbatches=8))
    assert t0.loc["total", "bytes per rank"] == want.total
    w.set_state({"zero": 3, "seq_len": 8192})
    t1 = w.table()
    want = memory.estimate(memory.preset("llama-3.1-8b"), TrainConfig(dp=8, zero=3, seq_len=8192, n_microbatches=8))
    assert t1.loc["total", "bytes per rank"] == want.total != t0.loc["total", "bytes per rank"]
    assert _heights(w.figure) != h0
    w.controls["unit"].value = "GB"  # a single control change redraws too
    assert w.table()["GB"].loc["total"] == pytest.approx(want.total / 1e9)
    assert "memory (GB)" in w.figure.axes[0].get_ylabel()
    assert w.state()["unit"] == "GB"


def test_invalid_combination_is_shown_in_place():
    w = MemoryWidget()
    w.set_state({"tp": 64})
    assert w.error and "TP 64" in w.error and "Invalid" in w.message.value
    assert "tp=" not in w.error and "n_heads" not in w.error  # said in words (issue 53)
    assert w.table().empty
    w.set_state({"tp": 8})
    assert w.error is None and not w.table().empty
    w.set_state({"model": "llama-3.2-1b", "pp": 32})  # 16 layers: a stage would get none
    assert "PP" in w.error and "virtual stages" in w.error and "virtual_stages" not in w.error


def test_playbook_toggle_and_fit_verdict():
    w = MemoryWidget(model="llama-3.1-405b", dp=1, zero=0)
    assert not w.breakdown.fits and "does NOT fit" in w.stats.value
    w.set_state({"playbook": True})
    assert w.breakdown.mode == "playbook" and "Playbook widget prints" in w.stats.value
    w2 = MemoryWidget(**w.state())
    assert w2.state() == w.state()
    assert w2.table().equals(w.table())


def _extremes(control):
    """The first and last value a control offers (options, or min/max of a slider)."""
    if hasattr(control, "options") and control.options:
        opts = [o[1] if isinstance(o, tuple) else o for o in control.options]
        return [opts[0], opts[-1]]
    if hasattr(control, "min") and hasattr(control, "max"):
        return [control.min, control.max]
    if isinstance(control.value, bool):
        return [False, True]
    return []


@pytest.mark.parametrize("playbook", [False, True])
def test_every_control_at_its_extremes_draws_or_explains(playbook):
    """Each control at its min and max, alone, from the default state: a figure or a message, no crash.

    One widget serves every case: ``set_state`` gets the whole default state with one value changed, so
    nothing of the case before is left (a construction costs about two redraws); a few cases are checked
    against a freshly built widget. The cases alternate between the two Playbook settings (each extreme
    once, half of them with Playbook-compatible numbers): the two runs took ~58 s together on a loaded
    2-core machine when each walked every case."""
    w = MemoryWidget(playbook=playbook)
    defaults = w.state()
    cases = [(name, value) for name, control in w.controls.items() for value in _extremes(control)][int(playbook) :: 2]
    for name, value in cases:
        w.set_state(defaults | {name: value})
        assert w.state() == defaults | {name: value}, (name, value)
        assert w.error or not w.table().empty, (name, value)
        if w.error:
            assert "Invalid" in w.message.value, (name, value)
    for name, value in (cases[0], cases[len(cases) // 2], cases[-1]):
        fresh = MemoryWidget(playbook=playbook)
        fresh.set_state({name: value})
        w.set_state(defaults | {name: value})
        assert (w.error, w.message.value) == (fresh.error, fresh.message.value), (name, value)
        assert w.table().equals(fresh.table()), (name, value)


def test_playbook_byte_labels_past_a_petabyte():
    assert memory.format_playbook_bytes(1024**5) == "1.00 PB"
    assert memory.format_playbook_bytes(3.5 * 1024**6) == "3.50 EB"
    assert memory.format_playbook_bytes(1024**9 * 5) == "5120.00 YB"
    assert memory.format_playbook_bytes(512) == "512.00 Bytes"


def _check_sweep_bars(w, want: dict):
    """The bars: one per swept value, each labelled with its total (``want``: value -> Breakdown by
    hand) and each tall segment with its value, the legend in stack order with the Numbers table's names,
    the GPU line with its capacity, "OOM" over every value that does not fit and nowhere else."""
    from mlsys_nb.widgets.memory import COMPONENTS, SEGMENT_LABEL_MIN

    ax = w.figure.axes[0]
    ticks = [t.get_text() for t in ax.get_xticklabels()]
    assert ticks == [str(v) for v in want], ticks
    texts = [t.get_text() for t in ax.texts if t.get_gid() == "total"]
    totals = [f"{b.total / memory.GiB:,.1f}" for b in want.values()]
    assert texts == totals, (texts, totals)
    oom = [i for i, b in enumerate(want.values()) if not b.fits]
    marks = [t.get_position()[0] for t in ax.texts if t.get_text() == "OOM"]
    assert marks == oom, (marks, oom)  # over every bar that does not fit (issue 53), and no other
    top = ax.get_ylim()[1]
    for i, b in enumerate(want.values()):  # the segments' values, bottom to top
        seg = [t.get_text() for t in ax.texts if t.get_gid() == "segment" and t.get_position()[0] == i]
        parts = [getattr(b, f) / memory.GiB for f, *_ in COMPONENTS]
        assert seg == [f"{v:,.1f}" for v in parts if v > 0 and v >= SEGMENT_LABEL_MIN * top], (i, seg)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    table = [n for n in w.table().index if n != "total" and w.table().loc[n, "bytes per rank"] > 0]
    assert legend[:-1] == table[::-1], (legend, table)  # top of the stack first, as the bars read
    gpu = list(want.values())[0].gpu_memory / memory.GiB
    assert legend[-1] == f"{w.state()['gpu']} memory ({gpu:,.1f} GiB)"


def test_bars_over_a_sweep_carry_totals_and_mark_the_oom_point():
    w = MemoryWidget()  # llama-3.1-8b, sequence 4096, DP 8, ZeRO-1 on H100-SXM
    model = memory.preset("llama-3.1-8b")
    want = {
        s: memory.estimate(model, TrainConfig(dp=8, zero=1, n_microbatches=8, seq_len=s))
        for s in (512, 1024, 2048, 4096, 8192, 16384)
    }
    assert any(not b.fits for b in want.values()) and any(b.fits for b in want.values())
    _check_sweep_bars(w, want)
    w.set_state({"sweep": "zero", "seq_len": 2048})
    want = {z: memory.estimate(model, TrainConfig(dp=8, zero=z, n_microbatches=8, seq_len=2048)) for z in (0, 1, 2, 3)}
    _check_sweep_bars(w, want)
    bold = [t.get_text() for t in w.figure.axes[0].get_xticklabels() if t.get_fontweight() == "bold"]
    assert bold == ["1"]  # the current ZeRO stage


def test_the_bar_check_fails_without_the_oom_mark_or_the_totals():
    w = MemoryWidget()
    model = memory.preset("llama-3.1-8b")
    want = {
        s: memory.estimate(model, TrainConfig(dp=8, zero=1, n_microbatches=8, seq_len=s))
        for s in (512, 1024, 2048, 4096, 8192, 16384)
    }
    for t in [t for t in w.figure.axes[0].texts if t.get_text() == "OOM"]:
        t.remove()
    with pytest.raises(AssertionError):
        _check_sweep_bars(w, want)
    w = MemoryWidget()
    w.figure.axes[0].texts[0].set_text("")
    with pytest.raises(AssertionError):
        _check_sweep_bars(w, want)


def test_a_swept_value_that_is_invalid_has_no_bar():
    w = MemoryWidget(sweep="tp")  # llama-3.1-8b has 32 heads: TP 64 is invalid
    assert w.error is None
    ticks = [t.get_text() for t in w.figure.axes[0].get_xticklabels()]
    assert ticks == ["1", "2", "4", "8", "16", "32", "64"]
    assert "invalid" in [t.get_text() for t in w.figure.axes[0].texts]


def test_every_bar_over_the_limit_is_marked_oom_and_segments_show_values():
    """A 70B model on DP 1 without ZeRO runs out of memory at every sequence length: every bar gets its OOM
    mark (the first one only, before issue 53), and the parameters' segment shows its value."""
    w = MemoryWidget(model="llama-3-70b", dp=1, zero=0)
    ax = w.figure.axes[0]
    n_bars = len(ax.get_xticklabels())
    assert not w.breakdown.fits and n_bars > 1
    assert [t.get_position()[0] for t in ax.texts if t.get_text() == "OOM"] == list(range(n_bars))
    params = w.breakdown.params / memory.GiB
    assert f"{params:,.1f}" in [t.get_text() for t in ax.texts if t.get_gid() == "segment"]


def test_the_verdict_and_the_change_that_fixes_an_oom_are_inside_the_figure():
    """llama-3.1-8b at 8192 tokens, ZeRO-1 on 8 H100s runs 5.4 GiB over; ZeRO-2 is the first single change
    that fits (checked by hand with memory.estimate): the figure and the headline say so (issue 53)."""
    w = MemoryWidget(seq_len=8192)
    model = memory.preset("llama-3.1-8b")
    assert not memory.estimate(model, TrainConfig(dp=8, zero=1, n_microbatches=8, seq_len=8192)).fits
    fixed = memory.estimate(model, TrainConfig(dp=8, zero=2, n_microbatches=8, seq_len=8192))
    assert fixed.fits
    verdict = [t.get_text() for t in w.figure.axes[0].texts if t.get_gid() == "verdict"]
    assert verdict == [
        f"does not fit on H100-SXM: {(w.breakdown.total - w.breakdown.gpu_memory) / memory.GiB:,.1f} GiB too much"
        f"\nfix: ZeRO-2 ({fixed.total / memory.GiB:,.1f} GiB)"
    ]
    assert "fix: ZeRO-2" in w.stats.value
    w.set_state({"seq_len": 4096})
    verdict = [t.get_text() for t in w.figure.axes[0].texts if t.get_gid() == "verdict"]
    assert verdict[0].startswith("fits on H100-SXM:") and "free" in verdict[0] and "fix" not in w.stats.value
    w.set_state({"model": "llama-3-70b", "dp": 1, "zero": 0})  # nothing single fixes 1.1 TiB on one GPU
    assert "no single change" in [t.get_text() for t in w.figure.axes[0].texts if t.get_gid() == "verdict"][0]
