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
    assert w.error and "tp" in w.error and "Invalid" in w.message.value
    assert w.table().empty
    w.set_state({"tp": 8})
    assert w.error is None and not w.table().empty
    w.set_state({"model": "llama-3.2-1b", "pp": 32})  # 16 layers: a stage would get none
    assert "pp" in w.error


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
    against a freshly built widget."""
    w = MemoryWidget(playbook=playbook)
    defaults = w.state()
    cases = [(name, value) for name, control in w.controls.items() for value in _extremes(control)]
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
