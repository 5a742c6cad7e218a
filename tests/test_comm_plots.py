"""The collective pictures draw what the semantics say; the cost plots accept a sweep frame."""

import pytest

from mlsys_nb import comm
from mlsys_nb.comm import plots as P
from mlsys_nb.comm.collectives import SEMANTICS_OPS, collective_semantics
from test_plots_house_style import sweep_frame


@pytest.mark.parametrize("n", [2, 5])
def test_draw_collectives_one_labelled_block_per_semantic_block(n):
    fig = P.draw_collectives(n)
    axes = fig.axes
    assert len(axes) == 2 * len(SEMANTICS_OPS)
    for i, op in enumerate(SEMANTICS_OPS):
        before, after = collective_semantics(op, n)
        for ax, blocks in ((axes[2 * i], before), (axes[2 * i + 1], after)):
            assert len(ax.texts) == sum(len(b) for b in blocks), op
            assert op in ax.get_title()
    # all_reduce after: every block is Σ over all n ranks
    ar = axes[2 * SEMANTICS_OPS.index("all_reduce") + 1]
    assert all(t.get_text().startswith(r"$\Sigma") for t in ar.texts)


def test_ring_schedule_shows_2n_minus_2_steps():
    fig = P.draw_ring_schedule(3)
    ax = fig.axes[0]
    assert len(ax.texts) == 3 * 4 and "(" in ax.get_xlabel()


def test_cost_plots_accept_a_sweep_frame():
    sizes, t, df = sweep_frame()  # tests/test_plots_house_style.py: a synthetic comm.sweep frame
    for fig in (P.plot_times(df), P.plot_busbw(df, memcpy_bytes_per_s=5e9)):
        ax = fig.axes[0]
        assert "(bytes" in ax.get_xlabel() and "(" in ax.get_ylabel() and len(ax.lines) >= 1
    fit = comm.fit_alpha_beta(sizes[::2], t[::2], "all_reduce", 4)
    fig = P.plot_fit(fit, sizes[::2], t[::2], sizes[1::2], t[1::2])
    assert "α = 50.0 µs" in fig.axes[0].get_legend().get_texts()[0].get_text()
    fig = P.plot_algorithms(comm.AlphaBeta.from_link("infiniband-ndr"), 64)
    assert any("ring = tree" in t.get_text() for t in fig.axes[0].get_legend().get_texts())
