"""Pipeline schedule figures (``mlsys_nb.pipeline.plots``): the quantity colours of the dashboard (ops in compute
shades, idle time as explicit blocks in the bubble's grey), an interleaved schedule's later chunks hatched, and
boxes that stay apart at 32 and more micro-batches (issue 53)."""

import matplotlib.colors as mc
import numpy as np
import pytest

from mlsys_nb import plots
from mlsys_nb.pipeline import schedule, simulate
from mlsys_nb.pipeline.plots import KIND_COLORS, draw_idle_and_chunks, idle_blocks, plot_timeline


def _collection(ax, gid):
    found = [c for c in ax.collections if c.get_gid() == gid]
    assert len(found) <= 1, gid
    return found[0] if found else None


def _ops(ax):
    return ax.collections[0]  # the boxes come first, then idle, hatch and labels


def test_ops_are_compute_and_idle_time_is_the_bubble_grey():
    """1F1B on 4 ranks: F in the compute colour, B a shade of it, none of the memory colours; grey idle blocks whose
    widths add up, per rank, to the simulation's idle time; no hatch without chunks; legend names the idle time."""
    res = simulate(schedule("1f1b", 4, 8))
    fig = plot_timeline(res, title="1f1b (simulated)")
    ax = fig.axes[0]
    faces = {mc.to_hex(f) for f in _ops(ax).get_facecolor()}
    assert mc.to_hex(plots.QUANTITY_COLORS["compute"]) in faces
    assert faces == {mc.to_hex(KIND_COLORS["F"]), mc.to_hex(KIND_COLORS["B"])}
    assert not faces & {mc.to_hex(plots.QUANTITY_COLORS[q]) for q in ("params", "grads", "optimizer")}
    idle = _collection(ax, "idle")
    assert mc.to_hex(idle.get_facecolor()[0]) == mc.to_hex(plots.QUANTITY_COLORS["bubble"])
    blocks = idle_blocks(res.timeline, res.makespan)
    assert len(idle.get_paths()) == len(blocks)
    for rank in range(4):
        assert sum(e - s for r, s, e in blocks if r == rank) == pytest.approx(res.idle[rank])
    assert _collection(ax, "chunks") is None
    assert "idle (bubble)" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert plots.figure_problems(fig) == []


def test_interleaved_chunks_are_hatched_once():
    """Interleaved 1F1B (v = 2) at 32 micro-batches: one hatch collection over exactly the second chunk's ops; a
    second draw_idle_and_chunks on the same axes adds nothing (the dashboard calls plot_timeline on a kept axes)."""
    res = simulate(schedule("interleaved-1f1b", 4, 32, 2))
    fig = plot_timeline(res, title="interleaved-1f1b, m = 32 (simulated)")
    ax = fig.axes[0]
    hatch = _collection(ax, "chunks")
    assert len(hatch.get_paths()) == int((res.timeline.chunk % 2 == 1).sum()) > 0
    n = len(ax.collections)
    draw_idle_and_chunks(ax, res.timeline, res.makespan)
    assert len(ax.collections) == n
    assert "later chunks" in [t.get_text() for t in ax.get_legend().get_texts()]
    assert plots.figure_problems(fig) == []


def test_boxes_stay_apart_at_many_micro_batches():
    """GPipe on 16 ranks with 128 micro-batches: the boxes are too narrow for white edges, so neighbouring
    micro-batches alternate in lightness and two consecutive forwards on a rank never share a face colour (with
    one colour per kind, as before, the 128 forwards of a rank merged into one bar). A small chart keeps edges."""
    res = simulate(schedule("gpipe", 16, 128))
    ax = plot_timeline(res, title="gpipe, m = 128 (simulated)").axes[0]
    ops = _ops(ax)
    assert float(np.max(ops.get_linewidths())) == 0.0
    tl = res.timeline.reset_index(drop=True)
    faces = ops.get_facecolor()[:, :3]
    fwd = tl[(tl["rank"] == 0) & (tl.kind == "F")].sort_values("start").index.to_numpy()
    same = [np.allclose(faces[a], faces[b]) for a, b in zip(fwd, fwd[1:])]
    assert len(same) == 127 and not any(same)
    small = _ops(plot_timeline(simulate(schedule("gpipe", 4, 8)), title="gpipe").axes[0])
    assert float(np.max(small.get_linewidths())) > 0
