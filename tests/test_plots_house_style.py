"""The house style of every figure function (``mlsys_nb.plots.figure_problems``): no overlapping or
clipped titles, annotations inside their axes, no fractional tick labels on count axes. The
dashboard's widget figures are checked in tests/test_dashboard.py (on its module's dashboard)."""

import re

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure

from mlsys_nb import comm, plots
from mlsys_nb.comm import plots as C
from mlsys_nb.pipeline import schedule, simulate
from mlsys_nb.pipeline.plots import plot_timeline


def sweep_frame():
    """(sizes, times, frame): a synthetic frame in the shape comm.sweep returns (values from the α-β model, not
    measured); tests/test_comm_plots.py uses it too."""
    model = comm.AlphaBeta(50e-6, 1e9)
    sizes = np.array([2**k for k in range(10, 20)])
    t = model.time("all_reduce", sizes, 4)
    return (
        sizes,
        t,
        pd.DataFrame(
            dict(
                op="all_reduce",
                impl="torch",
                backend="gloo",
                world_size=4,
                bytes=sizes,
                median_s=t,
                q25_s=t * 0.9,
                q75_s=t * 1.1,
                min_s=t * 0.8,
                busbw_Bps=[comm.busbw("all_reduce", s, x, 4) for s, x in zip(sizes, t)],
            )
        ),
    )


def _figures():
    sizes, t, df = sweep_frame()
    fit = comm.fit_alpha_beta(sizes[::2], t[::2], "all_reduce", 4)
    return {
        "plots.rank_bars": lambda: plots.rank_bars([3, 1, 2], ylabel="bytes (B)", title="bytes per rank"),
        "comm.draw_collectives": lambda: C.draw_collectives(2),
        "comm.draw_ring_schedule": lambda: C.draw_ring_schedule(4),
        "comm.plot_times": lambda: C.plot_times(df),
        "comm.plot_busbw": lambda: C.plot_busbw(df, memcpy_bytes_per_s=5e9),
        "comm.plot_fit": lambda: C.plot_fit(fit, sizes[::2], t[::2], sizes[1::2], t[1::2]),
        "comm.plot_algorithms": lambda: C.plot_algorithms(comm.AlphaBeta.from_link("infiniband-ndr"), 64),
        "pipeline.plot_timeline": lambda: plot_timeline(simulate(schedule("1f1b", 4, 8)), title="1f1b (simulated)"),
    }


@pytest.mark.parametrize("name", list(_figures()))
def test_every_figure_function_keeps_the_house_style(name):
    fig = _figures()[name]()
    assert plots.figure_problems(fig) == [], name


def test_the_check_fails_on_each_broken_rule():
    """A suptitle drawn over panel titles (no layout engine), a count axis with ticks at 0.5 steps and
    an annotation beyond the curves (notebook 16's old star at k = 13 of 10) are all caught; the same
    figures in the house style are not."""
    bad = Figure(figsize=(6, 3), layout="none")
    axes = bad.subplots(1, 2)
    bad.subplots_adjust(top=0.85)
    bad.suptitle("a suptitle", y=0.9)
    for ax in axes:
        ax.set_title("a panel title long enough to reach the middle")
    assert any("overlap" in p and "a suptitle" in p for p in plots.figure_problems(bad))

    good, axes = plots.new_figure(1, 2, figsize=(6, 3))
    good.suptitle("a suptitle")
    for ax in axes:
        ax.set_title("panel title")
    assert plots.figure_problems(good) == []

    fig, ax = plots.new_figure(figsize=(4, 3))
    ax.plot([0, 1, 2], [3.0, 2.5, 2.0])
    ax.set_xlabel("step (count)")
    ax.set_ylabel("loss (nats)")
    ax.text(3, 2.5, "★ best")  # beyond the x range 0..2
    problems = plots.figure_problems(fig)
    assert any("fractional tick label" in p for p in problems) and any("★ best" in p for p in problems)
    ax.texts[0].remove()
    ax.set_ylabel("true_reward (nats)")
    assert any("variable name" in p for p in plots.figure_problems(fig))
    plots.label(ax, "step (count)", "true reward (nats)")  # marks the count axis: integer ticks
    assert plots.figure_problems(fig) == []


def test_table_formats_bytes_percentages_and_counts():
    df = pd.DataFrame(
        {"dp": [8, 16000], "memory_bytes": [8.09e10, 1.5e9], "mfu": [0.5342, 0.41], "step_s": [1.4963, 12.345]}
    )
    cells = re.findall(r">([^<>]+)</td>", plots.table(df).to_html())
    assert cells == ["8", "80.9 GB", "53.4 %", "1.5", "16,000", "1.5 GB", "41.0 %", "12.3"]
    assert df.mfu.tolist() == [0.5342, 0.41]  # the data is not changed
    row = pd.Series({"tp": 4, "memory_bytes": 2.5e10, "mfu": 0.3}, name=0)
    assert re.findall(r">([^<>]+)</td>", plots.table(row).to_html()) == ["4", "25.0 GB", "30.0 %"]
    with pytest.raises(ValueError, match="digits"):
        plots.table(df, digits=0)


# ---- the notebooks' own figures: every kernel the suite starts checks each figure it renders ----
def test_rendering_a_broken_figure_raises_and_undo_restores(tmp_path):
    fig, ax = plots.new_figure()
    ax.plot([0, 1], [0, 2])
    ax.set_xlabel("step_s")
    undo = plots.check_figures_when_rendered()
    try:
        assert plots.check_figures_when_rendered()() is None  # a second install is a no-op
        with pytest.raises(plots.FigureStyleError, match="step_s"):
            fig.savefig(tmp_path / "bad.png")
        ax.set_xlabel("step time (s)")
        fig.savefig(tmp_path / "good.png")
        bare = Figure(layout="none")  # no layout engine (whatever rcParams an earlier test left), default margins
        bare.subplots().plot([0, 1])
        with pytest.raises(plots.FigureStyleError, match="no layout"):
            bare.savefig(tmp_path / "bare.png")
        bare.subplots_adjust(left=0.2)  # margins set by hand (the widgets' fixed layouts) count as laid out
        bare.savefig(tmp_path / "margins.png")
    finally:
        undo()
    ax.set_xlabel("step_s")
    fig.savefig(tmp_path / "unchecked.png")  # undone: rendering no longer checks


@pytest.mark.notebook
def test_a_notebook_figure_that_breaks_the_style_fails_its_cell(tmp_path):
    """The root conftest's PYTHONSTARTUP reaches the kernels papermill (and nbval) start: an inline
    pyplot figure in house style passes, one with a variable-name label fails the cell that shows it."""
    import nbformat
    import papermill as pm
    from nbrun import kernel_name

    nb = nbformat.v4.new_notebook()
    draw = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.plot([0, 1], [0, 2])\nax.set_xlabel({!r})\n"
    nb.cells = [
        nbformat.v4.new_code_cell(draw.format("reward (score)") + "plt.show()"),
        nbformat.v4.new_code_cell(draw.format("true_reward")),  # shown by the inline flush after the cell
        nbformat.v4.new_code_cell("print('not reached')"),
    ]
    src = tmp_path / "figures.ipynb"
    nbformat.write(nb, src)
    with pytest.raises(pm.PapermillExecutionError, match="FigureStyleError") as err:
        pm.execute_notebook(str(src), str(tmp_path / "out.ipynb"), kernel_name=kernel_name(), progress_bar=False)
    assert err.value.cell_index == 1 and "true_reward" in str(err.value)
