"""The pipeline widget headless: controls change the table and the figure; invalid combinations
show a message instead of raising; state round-trips."""

import io
import json

import numpy as np
import pandas as pd
import pytest

from mlsys_nb.pipeline import SCHEDULES, ScheduleError, check_args, schedule, simulate
from mlsys_nb.pipeline.compare import compare_schedules
from mlsys_nb.widgets.base import dim_png
from mlsys_nb.widgets.pipeline import LIMITS, PipelineWidget, nearest_valid


def _mean_grey(png: bytes) -> float:
    from PIL import Image

    return float(np.asarray(Image.open(io.BytesIO(png)).convert("L"), float).mean())


def test_dim_png_fades_towards_white():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (4, 2), (0, 100, 255)).save(buf, format="png")
    px = Image.open(io.BytesIO(dim_png(buf.getvalue(), keep=0.25))).convert("RGB").getpixel((1, 1))
    assert px == pytest.approx((191, 216, 255), abs=1)  # 0.25 x colour + 0.75 x 255
    with pytest.raises(ValueError, match="keep"):
        dim_png(buf.getvalue(), keep=1.5)


def test_nearest_valid_values_match_a_full_scan():
    """On random combinations: the nearest valid m, v, p below and above (others fixed), against
    listing every valid value of each and taking the closest on each side."""
    rng = np.random.default_rng(0)
    names = list(SCHEDULES)
    for _ in range(60):
        sched = names[rng.integers(len(names))]
        p, m, v = int(rng.integers(1, 9)), int(rng.integers(1, 20)), int(rng.integers(1, 4))
        got = nearest_valid(sched, p, m, v)
        now = {"p": p, "m": m, "v": v}
        for name in ("m", "v", "p"):
            ok = []
            for x in range(LIMITS[name][0], LIMITS[name][1] + 1):
                try:
                    check_args(sched, **(now | {name: x}))
                    ok.append(x)
                except ScheduleError:
                    pass
            want = [
                x
                for x in (
                    max([x for x in ok if x < now[name]], default=None),
                    min([x for x in ok if x > now[name]], default=None),
                )
                if x is not None
            ]
            assert got.get(name, []) == want, (sched, p, m, v, name)


def test_widget_updates_and_reports_errors():
    w = PipelineWidget()
    assert w.error is None and len(w.image.value) > 1000
    t0 = w.table()
    row = t0.set_index("schedule").loc["1f1b"]
    ref = simulate(schedule("1f1b", 4, 8), F=1, B=1, W=1)
    assert row["makespan"] == pytest.approx(ref.makespan)
    assert row["bubble_fraction (idle/total)"] == pytest.approx(3 / 11)  # (p−1)/(m+p−1)
    png0 = w.image.value
    w.set_state({"m": 16})
    assert w.table().set_index("schedule").loc["1f1b", "bubble_ratio (idle/busy)"] == pytest.approx(3 / 16)
    assert w.image.value != png0
    # picking a V-shaped schedule moves v to 2; forcing v = 3 is invalid and shown in place
    w.controls["schedule"].value = "zbv"
    assert w.state()["v"] == 2 and w.error is None
    w.controls["v"].value = 3
    assert w.error is not None and "v must be 2" in w.error and "v must be 2" in w.message.value
    w.set_state({"schedule": "dualpipe", "v": 2, "p": 3})
    assert "even" in w.error
    w.set_state({"schedule": "interleaved-1f1b", "p": 4, "m": 8, "v": 2})
    assert w.error is None
    valid_png = w.image.value
    w.set_state({"m": 6})  # the message offers the nearest valid values; the last chart stays, dimmed
    assert "multiple of p" in w.error and "try m = 4 or 8, or p = 3 or 6" in w.message.value
    assert w.image.layout.display is None and "mlsys-stale" in w.image._dom_classes
    assert w.image.value != valid_png and _mean_grey(w.image.value) > _mean_grey(valid_png) + 20
    w.set_state({"m": 8})
    assert w.error is None and "mlsys-stale" not in w.image._dom_classes
    st = w.state()
    assert json.loads(json.dumps(st)) == st
    w2 = PipelineWidget(**st)
    pd.testing.assert_frame_equal(w2.table(), w.table())
    with pytest.raises(ValueError, match="unknown settings"):
        w.set_state({"nope": 1})


def test_compare_table_marks_invalid_schedules():
    t = compare_schedules(3, 4, 1, 1.0, 1.0, 1.0, 0.0).set_index("schedule")
    assert "even" in t.loc["dualpipe", "note"] and "m >= 2p" in t.loc["dualpipev", "note"]
    assert t.loc["zb-h2", "bubble_ratio (idle/busy)"] < t.loc["1f1b", "bubble_ratio (idle/busy)"]


def test_idle_time_is_drawn_as_blocks_and_later_chunks_are_hatched():
    """The bubble is explicit: grey blocks whose widths add up, per rank, to the simulation's idle time; an
    interleaved schedule hatches its second chunk's boxes; the peak-activation bars are the activations'
    colour (issue 53)."""
    import matplotlib.colors as mc

    from mlsys_nb.plots import QUANTITY_COLORS
    from mlsys_nb.widgets.pipeline import idle_blocks

    w = PipelineWidget(schedule="1f1b", p=4, m=8)
    res = w.result["simulation"]
    blocks = idle_blocks(res.timeline, res.makespan)
    for rank in range(4):
        assert sum(e - s for r, s, e in blocks if r == rank) == pytest.approx(res.idle[rank])
    gids = [c.get_gid() for c in w.figure.axes[0].collections]
    assert "idle" in gids and "chunks" not in gids and "idle" in w.figure.axes[0].get_title()
    mem = w.figure.axes[1].collections[0]
    assert mc.to_hex(mem.get_facecolor()[0]) == QUANTITY_COLORS["activations"].lower()
    w.set_state({"schedule": "interleaved-1f1b", "v": 2})
    hatched = [c for c in w.figure.axes[0].collections if c.get_gid() == "chunks"]
    ops = w.result["simulation"].timeline
    assert len(hatched) == 1 and len(hatched[0].get_paths()) == int((ops.chunk % 2 == 1).sum()) > 0
