"""The pipeline widget headless: controls change the table and the figure; invalid combinations
show a message instead of raising; state round-trips."""

import json

import pandas as pd
import pytest

from mlsys_nb.pipeline import schedule, simulate
from mlsys_nb.pipeline.compare import compare
from mlsys_nb.widgets.pipeline import PipelineWidget


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
    w.set_state({"schedule": "interleaved-1f1b", "p": 4, "m": 6})
    assert "multiple of p" in w.error
    w.set_state({"m": 8, "v": 2})
    assert w.error is None
    st = w.state()
    assert json.loads(json.dumps(st)) == st
    w2 = PipelineWidget(**st)
    pd.testing.assert_frame_equal(w2.table(), w.table())
    with pytest.raises(ValueError, match="unknown settings"):
        w.set_state({"nope": 1})


def test_compare_table_marks_invalid_schedules():
    t = compare(3, 4, 1, 1.0, 1.0, 1.0, 0.0).set_index("schedule")
    assert "even" in t.loc["dualpipe", "note"] and "m >= 2p" in t.loc["dualpipev", "note"]
    assert t.loc["zb-h2", "bubble_ratio (idle/busy)"] < t.loc["1f1b", "bubble_ratio (idle/busy)"]
