"""The RLHF sizing widget (dashboard "RLHF systems" tab), driven headless by setting control values."""

import pytest

from mlsys_nb import hardware
from mlsys_nb.rl import sizing
from mlsys_nb.widgets.rlhf import RLHFSizingWidget


def test_widget_shows_both_layouts_from_the_calculator():
    w = RLHFSizingWidget(model="llama-2-7b", n_gpus=16)
    assert w.error is None
    for placement in ("colocated", "split"):
        c = sizing.layout_cost("llama-2-7b", placement=placement, n_gpus=16)
        row = w.table().loc[placement]
        assert row["GB per GPU (heaviest)"] == pytest.approx(c.per_gpu_bytes / 1e9)
        assert row["step (sync) s"] == pytest.approx(c.step_sync_s)
        assert row["step (async) s"] == pytest.approx(c.step_async_s)
        assert bool(row["fits"]) == c.fits
    # the memory bars are the table's numbers; the stacked time bars add up to each step
    mem = [p.get_height() for p in w.figure.axes[0].patches]
    assert mem == pytest.approx(list(w.table()["GB per GPU (heaviest)"]))
    t = w.table()
    tops = {}
    for p in w.figure.axes[1].patches:
        x = round(p.get_x() + p.get_width() / 2)
        tops[x] = max(tops.get(x, 0.0), p.get_y() + p.get_height())
    want = [t.loc["colocated", "step (sync) s"], t.loc["split", "step (sync) s"], t.loc["split", "step (async) s"]]
    assert [tops[i] for i in range(3)] == pytest.approx(want)
    w2 = RLHFSizingWidget(**w.state())
    assert w2.state() == w.state() and w2.table().equals(w.table())


def test_out_of_memory_names_the_role():
    w = RLHFSizingWidget(model="llama-3.1-405b", n_gpus=64, rollout_tp=8)
    assert not w.table()["fits"].any()
    assert "out of memory" in w.stats.value
    cap = hardware.gpu("H100-SXM").memory_bytes / 1e9
    assert (w.table()["GB per GPU (heaviest)"] > cap).all()


@pytest.mark.parametrize(
    "bad, word",
    [
        ({"n_gpus": 0}, "GPUs"),
        ({"rollout_tp": 3}, "rollout TP 3"),
        ({"mfu": 1.5}, "training MFU"),
        ({"rollout_batch": 0}, "rollout batch"),
    ],
)
def test_invalid_input_is_shown_in_place(bad, word):
    """The message names the setting in the words of its label, not its variable (``mfu``, ``n_gpus``)."""
    w = RLHFSizingWidget()
    w.set_state(bad)
    assert w.error and word in w.error and w.table().empty and "Invalid" in w.message.value
    assert next(iter(bad)) not in w.error and "must be an int" not in w.error
    w.set_state({"n_gpus": 16, "rollout_tp": 1, "mfu": 0.4, "rollout_batch": 256})
    assert w.error is None


def test_every_control_at_its_extremes_draws_or_explains():
    """Each control at its extremes (and a few values past them), alone, from the default state: a figure or a
    message, no crash. One widget serves every case: ``set_state`` gets the whole default state with one value
    changed, so nothing of the case before is left (a construction costs ~4 redraws: the cases took ~22 s
    when each built its own widget); the first, middle and last cases are checked against a fresh widget."""
    from test_memory_widget import _extremes

    extra = {"n_gpus": [1, 100_000], "rollout_batch": [1, 10**6], "prompt_len": [0, 10**6], "response_len": [0, 10**6]}
    extra |= {"rollout_tp": [1, 1024], "mfu": [1e-6, 1.0]}
    w = RLHFSizingWidget()
    defaults = w.state()
    cases = [
        (name, value) for name, control in w.controls.items() for value in _extremes(control) + extra.get(name, [])
    ]
    for name, value in cases:
        w.set_state(defaults | {name: value})
        assert w.state() == defaults | {name: value}, (name, value)
        assert w.error or not w.table().empty, (name, value)
    for name, value in (cases[0], cases[len(cases) // 2], cases[-1]):
        fresh = RLHFSizingWidget()
        fresh.set_state({name: value})
        w.set_state(defaults | {name: value})
        assert (w.error, w.message.value, w.stats.value) == (fresh.error, fresh.message.value, fresh.stats.value)
        assert w.table().equals(fresh.table()), (name, value)


def test_an_out_of_memory_layout_shows_no_step_time():
    """A layout that does not fit does not run: no step time in the table, the headline or the figure (issue
    53), and the co-located layout's verdict reads in words ("every GPU holds all the models", not "the all
    GPUs")."""
    w = RLHFSizingWidget(model="llama-3.1-405b", n_gpus=64, rollout_tp=8)
    t = w.table()
    assert not t["fits"].any()
    assert t[["gen s", "sync s", "train s", "step (sync) s", "step (async) s"]].isna().all().all()
    assert w.stats.value.count("no step time") == 2 and "synchronous" not in w.stats.value
    assert "the all" not in w.stats.value and "every GPU holds all the models" in w.stats.value
    time_ax = w.figure.axes[1]
    assert not time_ax.patches and [t.get_text() for t in time_ax.texts] == ["out of\nmemory"] * 3
    fits = RLHFSizingWidget(model="llama-2-7b", n_gpus=16)
    assert fits.table()["fits"].all() and not fits.table().isna().any().any()
    assert "no step time" not in fits.stats.value and len(fits.figure.axes[1].patches) > 0
