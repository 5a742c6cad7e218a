"""The planner widget (dashboard "Planner" tab), driven headless by setting control values."""

import re

import pytest

from mlsys_nb import planner
from mlsys_nb.widgets.planner import TIME_PARTS, PlannerWidget

SMALL = {"model": "llama-3-8b", "gpus": 16, "seq_len": 4096, "sequences": 64}


def test_widget_shows_the_planner_and_redraws():
    w = PlannerWidget(**SMALL)
    assert w.error is None
    want = planner.search("llama-3-8b", gpus=16, gpu="H100-SXM", global_batch_tokens=64 * 4096, seq_len=4096, top=10)
    assert w.table()[["dp", "tp", "pp", "step_s"]].equals(want[["dp", "tp", "pp", "step_s"]])
    bars = [p.get_width() for p in w.figure.axes[0].patches]
    assert sum(bars) == pytest.approx(want.step_s[0])  # the time bar is the best layout's step
    mem = sum(p.get_width() for p in w.figure.axes[1].patches)
    assert mem == pytest.approx(want.memory_bytes[0] / 1e9)
    w.controls["show"].value = 3  # a single control change redraws the breakdown
    assert sum(p.get_width() for p in w.figure.axes[0].patches) == pytest.approx(want.step_s[3])
    assert "#3" in w.stats.value and "Bottleneck" in w.stats.value
    # the headline MFU is the calibrated model's, and the uncalibrated upper bound is beside it
    kw = dict(gpus=16, gpu="H100-SXM", global_batch_tokens=64 * 4096, seq_len=4096)
    lay = w.result["plan"].layout
    cal, upper = planner.evaluate("llama-3-8b", lay, **kw), planner.evaluate("llama-3-8b", lay, **kw, calibration=None)
    assert f"MFU <b>{cal.mfu:.0%}</b> (calibrated model" in w.stats.value
    assert f"uncalibrated upper bound {upper.mfu:.0%}" in w.stats.value and upper.mfu > cal.mfu
    # the layouts table: one row per layout, every row as many cells as headings, fixed decimals
    html = w.details_html.value
    heads = re.findall(r"<th>([^<]*)</th>", html.split("</tr>")[0])
    rows = [re.findall(r"<td[^>]*>([^<]*)</td>", r) for r in html.split("</tr>")[1:-1]]
    assert len(rows) == len(want) and all(len(r) == len(heads) - 1 for r in rows)
    assert [r[heads.index("step (s)") - 1] for r in rows] == [f"{x:.3f}" for x in want.step_s]
    col = heads.index("recomputed layers / stage") - 1  # Megatron-LM's --recompute-num-layers
    shown = {"none": "-", "selective": "-"}
    assert [r[col] for r in rows] == [
        shown.get(rc, "all" if k == 0 else str(k)) for rc, k in zip(want.recompute, want.recompute_layers)
    ]
    assert set(w.result["plan"].time) <= set(TIME_PARTS)  # every modelled component is drawn
    w.set_state({"model": "llama-3-70b"})  # on 16 GPUs the best layouts recompute some layers of each stage
    got = w.table()
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", r)[col] for r in w.details_html.value.split("</tr>")[1:-1]]
    assert (got.recompute_layers > 0).any() and cells == [
        shown.get(rc, "all" if k == 0 else str(k)) for rc, k in zip(got.recompute, got.recompute_layers)
    ]
    assert "text-align:right" in html
    w2 = PlannerWidget(**w.state())
    assert w2.state() == w.state() and w2.table().equals(w.table())


@pytest.mark.parametrize(
    "bad, word",
    [({"sequences": 0}, "sequences per step"), ({"gpus": 0}, "GPUs"), ({"gpus_per_node": 0}, "GPUs per node")],
)
def test_invalid_input_is_shown_in_place(bad, word):
    w = PlannerWidget(**SMALL)
    w.set_state(bad)
    assert w.error and word in w.error and w.table().empty
    assert f"{next(iter(bad))} must" not in w.error  # said in words, not the variable (issue 53)
    w.set_state(SMALL | {"gpus": 16, "gpus_per_node": 8})
    assert w.error is None


def test_no_layout_message_says_the_closest_layout_in_words():
    """3 GPUs cannot hold a 70B model: the message describes the closest layout in words, not as a raw
    ``Layout(dp=1, ...)`` repr (issue 53)."""
    w = PlannerWidget(model="llama-3-70b", gpus=3, sequences=8)
    assert w.error and "No layout" in w.message.value
    assert "Layout(" not in w.error and "micro_batch" not in w.error and "overhead_bytes" not in w.error
    assert re.search(r"DP \d+ × TP \d+ × PP \d+", w.error) and "recomputation" in w.error


def test_time_parts_have_their_own_colours_compute_and_bubble_differ():
    from mlsys_nb.plots import QUANTITY_COLORS, quantity_color

    colours = [quantity_color(k) for k in TIME_PARTS]
    assert len(set(colours)) == len(colours)
    assert quantity_color("compute") == QUANTITY_COLORS["compute"] != QUANTITY_COLORS["bubble"]
    w = PlannerWidget(**SMALL)
    import matplotlib.colors as mc

    drawn = {c.get_label(): mc.to_hex(c.patches[0].get_facecolor()) for c in w.figure.axes[0].containers}
    assert "compute" in drawn and len(drawn) > 1
    for name, colour in drawn.items():
        assert colour == quantity_color(name).lower(), name


def test_the_layouts_table_scrolls_instead_of_cutting_its_last_column():
    w = PlannerWidget(**SMALL)
    html = w.details_html.value
    assert "<div class='mlsys-planner-scroll'>" in html and "overflow-x:auto" in html
    assert "white-space:normal" in html  # long headings wrap onto two lines
    assert "<th>bottleneck</th>" in html  # the last column is in the table


def test_a_gpu_without_nvlink_is_explained_with_the_gpus_to_choose():
    """The L4 has no NVLink: the message says so and lists the GPUs the planner can use, instead of the
    calculator's advice to "pass nvlink=", which the tab has no control for (issue 53)."""
    w = PlannerWidget(**SMALL)
    w.set_state({"gpu": "L4"})
    assert w.error and "L4 has no NVLink" in w.error and "H100-SXM" in w.error and "nvlink=" not in w.error


def test_the_figure_titles_carry_the_verdict():
    """The step time, MFU and the memory against the GPU are inside the figure, not only in the text above."""
    w = PlannerWidget(**SMALL)
    plan = w.result["plan"]
    t, m = (ax.get_title() for ax in w.figure.axes[:2])
    assert f"{plan.step_s:.2f} s" in t and f"MFU {plan.mfu:.0%}" in t
    assert f"{plan.memory_bytes / 1e9:.1f} of {plan.gpu_memory_bytes / 1e9:.0f} GB" in m and "fits" in m
