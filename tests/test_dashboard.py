"""The dashboard in-process: every tab responds, refuses invalid input in place, exports, and its
configuration round-trips through JSON and a URL query string."""

import base64
import contextlib
import html
import json
import re

import pytest

from mlsys_nb import plots
from mlsys_nb.dashboard import TABS, Dashboard, figure_bytes, self_check


@pytest.fixture(scope="module")
def dash():
    return Dashboard()


@pytest.fixture(scope="module")
def hidden():
    """A dashboard nobody displays (``images=False``): its tabs draw their figures but render no PNG."""
    return Dashboard(images=False)


@contextlib.contextmanager
def restored(d: Dashboard):
    """``d`` for a test that changes its settings: the tabs it changed, and the selected tab, are put
    back afterwards (the module's dashboard serves every test; a fresh one costs seconds to draw)."""
    start = d.state()
    try:
        yield d
    finally:
        now = d.state()
        d.set_state({k: v for k, v in start.items() if now[k] != v})
        assert d.state() == start


def test_every_tab_responds_and_explains_invalid_input(dash):
    report = self_check(dash)
    assert report["ok"], report["problems"]
    assert report["tabs"] == [t.key for t in TABS]


def test_every_tab_figure_keeps_the_house_style(dash):
    """No overlapping or clipped titles, annotations inside their axes, integer ticks on counts
    (``plots.figure_problems``; tests/test_plots_house_style.py shows it fails on each broken rule)."""
    for key, obj in dash.tabs.items():
        assert plots.figure_problems(obj.figure) == [], key


def test_a_dashboard_without_images_draws_the_same_figures(dash, hidden):
    """``images=False`` (the self-check's and the link round trips' dashboards): no PNG for the page,
    and each tab's figure, numbers and link as a shown dashboard's at the same settings."""
    assert hidden.state() == dash.state() and hidden.to_query() == dash.to_query() == ""
    for key, obj in hidden.tabs.items():
        shown = dash.tabs[key]
        assert bytes(obj.image.value) == b"" and bytes(shown.image.value).startswith(b"\x89PNG"), key
        assert figure_bytes(obj.figure) == figure_bytes(shown.figure), key
        assert obj.table().equals(shown.table()), key


def test_the_same_figure_check_fails_when_a_hidden_tab_skips_its_drawing(dash, monkeypatch):
    from mlsys_nb.widgets.pipeline import PipelineWidget

    monkeypatch.setattr(PipelineWidget, "draw", lambda self, result: None)  # an empty figure
    hidden = Dashboard(tabs=[t for t in TABS if t.key == "pipeline"], images=False)
    assert figure_bytes(hidden.tabs["pipeline"].figure) != figure_bytes(dash.tabs["pipeline"].figure)


def test_intro_names_every_tab(dash):
    intro = dash.intro.value
    for t in TABS:
        assert f"<b>{t.title}</b>: {html.escape(t.blurb)}" in intro and len(t.blurb) > 20, t.key


def test_probe_changes_the_numbers_view(hidden):
    """The numbers view follows each tab's redraws (its ``on_update``); no PNG needed (``hidden``:
    the self-check above drives the shown dashboard through the same changes)."""
    dash = hidden
    for spec in TABS:
        before = dash.numbers_html(spec.key)
        start = dash.tabs[spec.key].state()
        dash.tabs[spec.key].set_state(spec.probe)  # through the tab, as a control change would
        assert dash.numbers_html(spec.key) != before, f"{spec.key}: numbers view not refreshed"
        dash.tabs[spec.key].set_state(spec.invalid)
        assert "mlsys-error" in dash.numbers_html(spec.key)
        dash.tabs[spec.key].set_state(start)


def test_exports_are_real_files(dash):
    """The files behind the Export button's links (each figure rendered once per format)."""
    for spec in TABS:
        links = dash.show_exports(spec.key)
        files = {
            fmt: base64.b64decode(re.search(f'download="{spec.key}.{fmt}" href="data:[^;]+;base64,([^"]*)"', links)[1])
            for fmt in ("png", "svg", "csv")
        }
        assert files["png"].startswith(b"\x89PNG"), spec.key
        assert b"<svg" in files["svg"][:2000], spec.key
        header = files["csv"].decode().splitlines()[0]
        assert header.count(",") >= 1, f"{spec.key}: CSV has no columns: {header!r}"


def test_configuration_round_trip(dash):
    with restored(dash) as changed:
        for spec in TABS:
            changed.tabs[spec.key].set_state(spec.probe)
        changed.set_state({"tab": "pipeline"})
        via_json = Dashboard(config=json.dumps(changed.state()), images=False)
        assert via_json.state() == changed.state()
        via_link = Dashboard(images=False)
        assert via_link.load_query("?" + changed.to_query())
        assert via_link.state() == changed.state()
        assert via_link.tab.selected_index == [t.key for t in TABS].index("pipeline")


def test_bad_configuration_is_explained(dash):
    with pytest.raises(
        ValueError, match=r"configuration key='memroy' is not allowed: configuration key must be one of \('tab', "
    ):
        dash.set_state({"memroy": {}})
    with pytest.raises(KeyError, match="unknown tab"):
        dash.set_state({"tab": "nope"})
    dash.config_text.value = "{not json"
    dash.load_text()
    assert "Could not load" in dash.share_message.value
    assert dash.load_query("") is False


def test_an_old_link_with_afab_opens_as_gpipe():
    """The memory tab called the GPipe schedule "afab" before the kit used one name for it."""
    import urllib.parse

    old = Dashboard(tabs=[t for t in TABS if t.key == "memory"], images=False)  # the other tabs play no part
    query = "?" + urllib.parse.urlencode({"config": json.dumps({"memory": {"pp": 4, "pp_schedule": "afab"}})})
    assert old.load_query(query)
    assert old.tabs["memory"].state()["pp_schedule"] == "gpipe" and not old.tabs["memory"].error


def _check_short_link(query: str, changed: dict):
    """A share link names exactly the changed settings (nothing at its default) and stays short."""
    import urllib.parse

    got = json.loads(urllib.parse.parse_qs(query)["config"][0])
    assert got == changed, got
    assert len(query) < 40 * (1 + sum(len(v) if isinstance(v, dict) else 1 for v in changed.values())), len(query)


def test_share_link_holds_only_changed_settings_and_round_trips(dash):
    with restored(dash) as d:
        assert d.to_query() == "" and "defaults" in d.link_text.value
        d.tabs["memory"].set_state({"tp": 4})  # through the tab, as the slider would: the link follows
        d.tabs["inference"].set_state({"model": "llama-3-70b"})
        d.set_state({"tab": "inference"})
        changed = {"tab": "inference", "memory": {"tp": 4}, "inference": {"model": "llama-3-70b"}}
        _check_short_link(d.to_query(), changed)
        assert f'href="?{d.to_query()}"' in d.link_text.value
        fresh = Dashboard(images=False)
        assert fresh.load_query("?" + d.to_query())
        assert fresh.state() == d.state()
        assert "does not fit" in fresh.tabs["inference"].stats.value


def test_the_short_link_check_fails_on_the_full_configuration(dash):
    """The old link carried every setting of every tab (about 1.3 KB)."""
    import urllib.parse

    with restored(dash) as d:
        d.tabs["memory"].set_state({"tp": 4})
        full = urllib.parse.urlencode({"config": json.dumps(d.state(), separators=(",", ":"))})
    with pytest.raises(AssertionError):
        _check_short_link(full, {"memory": {"tp": 4}})


def test_large_numbers_read_as_powers_of_ten(hidden):
    """The Scaling tab's numbers view shows a 1e23 FLOPs budget as "1e23", never as the float's 24 digits
    "100,000,000,000,000,008,388,608" (issue 53); counts below 1e12 keep their thousands separators."""
    with restored(hidden) as d:
        d.tabs["scaling"].set_state({"compute": 1e23})
        view = d.numbers_html("scaling")
        assert ">1e23<" in view and "000,000,000,000" not in view
    assert [plots.human_number(x) for x in (1e23, 8.39e23, 1234567.0, 0.25, 2.5e-7)] == [
        "1e23",
        "8.39e23",
        "1,234,567",
        "0.25",
        "2.5e-7",
    ]


def test_one_colour_per_quantity_in_every_tab(hidden):
    """Parameters, gradients, optimizer states, activations, compute, communication and the bubble are drawn
    in one colour each wherever they appear (plots.QUANTITY_COLORS): the Memory and Planner tabs' parameter
    segments share one colour, the RLHF tab's sync is communication's, and no two quantities share one."""
    import matplotlib.colors as mc

    c = plots.QUANTITY_COLORS
    seven = [c[q] for q in ("params", "grads", "optimizer", "activations", "compute", "communication", "bubble")]
    assert len(set(seven)) == 7

    def colours(ax):
        return {k.get_label(): mc.to_hex(k.patches[0].get_facecolor()) for k in ax.containers if k.patches}

    mem = colours(hidden.tabs["memory"].figure.axes[0])
    planner_t, planner_m = (colours(ax) for ax in hidden.tabs["planner"].figure.axes[:2])
    rlhf = colours(hidden.tabs["rlhf"].figure.axes[1])
    assert mem["parameters"] == planner_m["parameters"] == c["params"].lower()
    assert mem["optimizer states"] == planner_m["optimizer"] == c["optimizer"].lower()
    assert planner_t["compute"] == rlhf["train"] == c["compute"].lower()
    assert rlhf["sync"] == c["communication"].lower()
