"""One tabbed dashboard over the package's visualizers (memory, scaling laws, pipeline schedules,
inference, the parallelism planner, RLHF systems, interview practice): ``TABS``.

It opens in JupyterLab (``notebooks/00_dashboard.ipynb``) and as a standalone web page served by
Voilà (``make dashboard``). It computes nothing itself: each tab is a widget object from
``mlsys_nb.widgets`` following one small protocol, ``mlsys_nb.widgets.base.Widget``:

- ``.widget``: the ipywidgets container to display,
- ``.state() -> dict`` / ``.set_state(dict)``: its settings, JSON-serialisable,
- ``.figure``: the current matplotlib Figure, ``.table() -> pandas.DataFrame``: the numbers shown,
- ``.error``: ``None`` or the message shown in place for an invalid combination,
- ``.on_update(callback)``: the tab calls ``callback()`` after every redraw,

and the dashboard adds what is common: a numbers view (``refresh(key)``, ``numbers_html(key)``),
figure/CSV export (``export``, ``show_exports``), and a shareable configuration (``state``/``set_state``,
JSON text or a ``?config=...`` query string that Voilà passes to the kernel). The share link holds only
the settings that differ from the defaults (``changed_state``) and stays current after every redraw.
``self_check`` drives
every tab with its probe and its invalid combination.
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import io
import json
import os
import re
import urllib.parse
from dataclasses import dataclass, field

import ipywidgets as W

from .config import check_choice
from .plots import human_number
from .widgets.base import Widget, without_images


@dataclass(frozen=True)
class TabSpec:
    """One tab. ``probe`` is a valid change that must change the tab's numbers and ``invalid`` a
    combination the tab must refuse with a message; the self-check, the tests, the browser test
    and the responsiveness benchmark all drive the tab with them."""

    key: str  # short name used in configs and URLs
    title: str  # tab label
    module: str
    cls: str
    probe: dict = field(default_factory=dict)
    invalid: dict = field(default_factory=dict)
    blurb: str = ""  # what the tab shows, one line for the page's intro (``intro_html``)


TABS = (
    TabSpec(
        "memory",
        "Training memory",
        "mlsys_nb.widgets.memory",
        "MemoryWidget",
        probe={"tp": 8},
        invalid={"tp": 64},
        blurb="memory per GPU by component for a model and a parallel layout, swept over one setting",
    ),
    TabSpec(
        "scaling",
        "Scaling laws",
        "mlsys_nb.widgets.scaling",
        "ScalingWidget",
        probe={"compute": 1e24},
        invalid={"mfu": 1.5},
        blurb="the compute-optimal model and data size for a budget, its GPU time and cost",
    ),
    TabSpec(
        "pipeline",
        "Pipeline schedules",
        "mlsys_nb.widgets.pipeline",
        "PipelineWidget",
        probe={"m": 16},
        invalid={"schedule": "interleaved-1f1b", "p": 4, "v": 2, "m": 3},
        blurb="a simulated pipeline schedule per rank: its bubble and peak activations",
    ),
    TabSpec(
        "inference",
        "Inference",
        "mlsys_nb.widgets.inference",
        "InferenceWidget",
        probe={"batch": 32},
        invalid={"batch": 0},
        blurb="whether a model fits for serving, its KV cache, concurrency, prefill and decode time",
    ),
    TabSpec(
        "planner",
        "Parallelism planner",
        "mlsys_nb.widgets.planner",
        "PlannerWidget",
        probe={"gpus": 512},
        invalid={"sequences": 0},
        blurb="the best parallel layouts for a cluster, with the chosen one's step time and memory",
    ),
    TabSpec(
        "rlhf",
        "RLHF systems",
        "mlsys_nb.widgets.rlhf",
        "RLHFSizingWidget",
        probe={"n_gpus": 64},
        invalid={"n_gpus": 0},
        blurb="per-GPU memory and the modelled PPO step of a co-located and a split RLHF layout, side by side",
    ),
    TabSpec(
        "practice",
        "Practice",
        "mlsys_nb.widgets.practice",
        "PracticeWidget",
        probe={"seed": 1},
        invalid={"seed": -1},
        blurb="seeded interview questions answered by the same calculators, and a timed mock interview",
    ),
)

# Values that older versions of the kit wrote into shared configurations, read as today's names:
# {tab: {setting: {old value: new value}}}. The memory tab called the GPipe schedule "afab".
LEGACY_VALUES = {"memory": {"pp_schedule": {"afab": "gpipe"}}}

_VALUE_WIDGETS = (W.ValueWidget,)
_DISPLAY_ONLY = (W.HTML, W.HTMLMath, W.Label, W.Textarea, W.Image)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", str(text).lower()).strip("-") or "control"


def _controls(widget) -> list:
    """Every interactive control under ``widget`` (depth first), display-only widgets excluded."""
    found, stack = [], [widget]
    while stack:
        w = stack.pop(0)
        if isinstance(w, _VALUE_WIDGETS) and not isinstance(w, _DISPLAY_ONLY):
            found.append(w)
        stack.extend(getattr(w, "children", ()) or ())
    return found


def _html_table(df) -> str:
    if df is None or len(df) == 0:
        return "<i>no numbers for this setting</i>"

    # 1e23 FLOPs as "1e23", never "100,000,000,000,000,008,388,608"; 1,234,567 GPU-hours with commas
    return df.to_html(classes="mlsys-numbers", border=0, float_format=human_number)


def intro_html(tabs) -> str:
    """The page's intro: one line per tab, its title in bold and its ``blurb``."""
    import html

    items = "".join(f"<li><b>{html.escape(t.title)}</b>: {html.escape(t.blurb)}</li>" for t in tabs)
    return (
        "<div style='line-height:1.4'>Move a control in any tab and its figure and numbers follow (models "
        f"from the package's calculators, labelled as such):<ul style='margin:2px 0'>{items}</ul></div>"
    )


# The share link's copy button. Script inside an HTML widget does not run, but an inline event
# handler does: the button resolves its relative link against the page's address, puts the full
# address in the read-only box, selects it and writes it to the clipboard (where the browser
# refuses the clipboard, the address stays selected for Ctrl+C and the button says so). Inside an
# inline handler a bare ``URL`` is ``document.URL`` (a string): the constructor is ``window.URL``.
COPY_HANDLER = (
    "const u = new window.URL(this.dataset.href, document.baseURI).href;"
    " const box = this.parentElement.querySelector('.mlsys-share-url'); box.value = u; box.select();"
    " const done = (t) => { this.textContent = t; this.dataset.copied = u; };"
    " (navigator.clipboard ? navigator.clipboard.writeText(u) : Promise.reject())"
    ".then(() => done('Copied \u2713'), () => done('Selected: press Ctrl+C'));"
)


def _data_link(data: bytes, mime: str, filename: str, label: str) -> str:
    b64 = base64.b64encode(data).decode()
    return (
        f'<a class="mlsys-export-{filename.rsplit(".", 1)[1]}" download="{filename}" '
        f'href="data:{mime};base64,{b64}">{label}</a>'
    )


class Dashboard:
    """The tabbed app. ``Dashboard(config=...)`` starts from a saved configuration (dict or JSON).
    ``images=False``: a dashboard nobody displays (a self-check, a link round trip): its tabs draw
    their figures but render no PNG for the page (``mlsys_nb.widgets.base.without_images``)."""

    def __init__(self, tabs=TABS, config=None, images: bool = True):
        self.specs = {t.key: t for t in tabs}
        self.tabs = {}
        self._numbers, self._exports = {}, {}
        panels = []
        for spec in tabs:
            with contextlib.nullcontext() if images else without_images():
                obj = getattr(importlib.import_module(spec.module), spec.cls)()
            self.tabs[spec.key] = obj
            panels.append(self._panel(spec, obj))
        self.tab = W.Tab(children=panels)
        for i, spec in enumerate(tabs):
            self.tab.set_title(i, spec.title)
        self.tab.add_class("mlsys-tabs")
        self.intro = W.HTML(intro_html(tabs))
        self.intro.add_class("mlsys-intro")
        self.config_text = W.Textarea(
            placeholder="A configuration: press 'Show configuration', or paste one and press 'Load'",
            layout=W.Layout(width="100%", height="70px"),
        )
        self.config_text.add_class("mlsys-config")
        self.link_text = W.HTML()
        self.link_text.add_class("mlsys-share-link")
        self.share_message = W.HTML()
        self.share_message.add_class("mlsys-share-message")
        copy_btn = W.Button(description="Show configuration", icon="code", layout=W.Layout(width="200px"))
        load_btn = W.Button(description="Load", icon="upload")
        copy_btn.add_class("mlsys-copy")
        load_btn.add_class("mlsys-load")
        copy_btn.on_click(lambda _: self.show_config())
        load_btn.on_click(lambda _: self.load_text())
        share = W.VBox(
            [
                W.HTML("<b>Share these settings</b>"),
                self.link_text,
                W.HBox([copy_btn, load_btn]),
                self.config_text,
                self.share_message,
            ]
        )
        self.widget = W.VBox([self.intro, self.tab, share], layout=W.Layout(max_width="1200px"))
        self.widget.add_class("mlsys-dashboard")
        self.defaults = {k: t.state() for k, t in self.tabs.items()}  # what a link leaves out
        self.tab.observe(lambda _: self.show_link(), names="selected_index")
        if config:
            self.set_state(json.loads(config) if isinstance(config, str) else config)
        self.show_link()

    # ---- per-tab panel ------------------------------------------------------------------------
    def _panel(self, spec: TabSpec, obj):
        numbers = W.HTML(_html_table(obj.table()))
        numbers.add_class(f"mlsys-numbers-{spec.key}")
        self._numbers[spec.key] = numbers
        export_links = W.HTML()
        export_links.add_class(f"mlsys-export-links-{spec.key}")
        self._exports[spec.key] = export_links
        export_btn = W.Button(description="Export figure + numbers", icon="download", layout=W.Layout(width="230px"))
        export_btn.add_class(f"mlsys-export-{spec.key}")
        export_btn.on_click(lambda _, k=spec.key: self.show_exports(k))
        for ctl in _controls(obj.widget):  # stable CSS classes for browser tests and styling
            ctl.add_class(f"mlsys-{spec.key}-{_slug(getattr(ctl, 'description', '') or type(ctl).__name__)}")
        check_widget(obj, spec.key)
        obj.on_update(lambda k=spec.key: self.refresh(k))  # the numbers view follows every redraw
        numbers_box = W.Accordion(children=[numbers], titles=("Numbers",))
        numbers_box.selected_index = None  # collapsed: the tab shows its headline numbers itself
        panel = W.VBox([obj.widget, numbers_box, W.HBox([export_btn, export_links])])
        panel.add_class(f"mlsys-panel-{spec.key}")
        return panel

    def refresh(self, key: str) -> None:
        """Show the tab's current numbers (or its error) in its numbers view; drop stale export links.
        Runs after every redraw of the tab (its ``on_update``) and after ``set_state``."""
        obj = self._tab(key)
        self._numbers[key].value = (
            f'<span class="mlsys-error">{obj.error}</span>' if obj.error else _html_table(obj.table())
        )
        self._exports[key].value = ""  # stale links would export the old figure
        if hasattr(self, "defaults"):  # the share link follows every change (not during construction)
            self.show_link()

    def numbers_html(self, key: str) -> str:
        """The HTML the tab's numbers view shows: its table, or its error in a ``mlsys-error`` span."""
        self._tab(key)  # an unknown key: KeyError naming the tabs
        return self._numbers[key].value

    # ---- export -------------------------------------------------------------------------------
    def export(self, key: str) -> dict:
        """The tab's current figure as PNG and SVG bytes and its numbers as CSV text."""
        obj = self._tab(key)
        out = {"csv": obj.table().to_csv(index=True)}
        for fmt in ("png", "svg"):
            buf = io.BytesIO()
            obj.figure.savefig(buf, format=fmt)
            out[fmt] = buf.getvalue()
        return out

    def show_exports(self, key: str) -> str:
        """Put download links (PNG, SVG, CSV as data: URLs) under the tab (its Export button); returns their HTML."""
        files = self.export(key)
        self._exports[key].value = " · ".join(
            [
                _data_link(files["png"], "image/png", f"{key}.png", "PNG"),
                _data_link(files["svg"], "image/svg+xml", f"{key}.svg", "SVG"),
                _data_link(files["csv"].encode(), "text/csv", f"{key}.csv", "CSV"),
            ]
        )
        return self._exports[key].value

    # ---- state --------------------------------------------------------------------------------
    def _tab(self, key: str):
        if key not in self.tabs:
            raise KeyError(f"unknown tab {key!r}: choose one of {sorted(self.tabs)}")
        return self.tabs[key]

    def state(self) -> dict:
        """Every tab's settings plus the selected tab, as a JSON-serialisable dict."""
        keys = list(self.tabs)
        return {"tab": keys[self.tab.selected_index or 0], **{k: t.state() for k, t in self.tabs.items()}}

    def set_state(self, state: dict) -> None:
        """Apply a configuration (all keys optional). Unknown tabs raise ValueError naming them."""
        if not isinstance(state, dict):
            raise ValueError(f"a configuration must be a JSON object, got {type(state).__name__}")
        for key in state:
            check_choice("configuration key", key, ("tab", *sorted(self.tabs)))
        for key, tab_state in state.items():
            if key != "tab":
                self.tabs[key].set_state(_upgrade(key, tab_state))
                self.refresh(key)
        if "tab" in state:
            self._tab(state["tab"])
            self.tab.selected_index = list(self.tabs).index(state["tab"])

    def changed_state(self) -> dict:
        """The settings that differ from a fresh dashboard's, per tab, and the selected tab unless it
        is the first: what a link needs, since the page it opens starts from the defaults."""
        out = {}
        state = self.state()
        if state["tab"] != next(iter(self.tabs)):
            out["tab"] = state["tab"]
        for key, tab_state in state.items():
            if key == "tab":
                continue
            changed = {k: v for k, v in tab_state.items() if not _same(self.defaults[key].get(k), v)}
            if changed:
                out[key] = changed
        return out

    def to_query(self) -> str:
        """The configuration as a short URL query string, ``config=<url-encoded JSON>`` of the
        settings that differ from the defaults (``changed_state``); empty when nothing changed."""
        changed = self.changed_state()
        return urllib.parse.urlencode({"config": json.dumps(changed, separators=(",", ":"))}) if changed else ""

    def show_link(self) -> None:
        """Show the share link, relative to this page (its address is the browser's: the kernel
        does not know it), and a one-click copy button (``COPY_HANDLER``) with a read-only box."""
        import html

        q = self.to_query()
        href = html.escape("?" + q if q else "?", quote=True)
        shown = html.escape(urllib.parse.unquote("?" + q) if q else "(all settings at their defaults)")
        self.link_text.value = (
            f'Link to these settings: <a class="mlsys-query" href="{href}" target="_blank">{shown}</a><br>'
            f'<button class="mlsys-copy-link" type="button" data-href="{href}" '
            f'onclick="{html.escape(COPY_HANDLER, quote=True)}">Copy link</button> '
            '<input class="mlsys-share-url" readonly size="60" placeholder="the full address appears here">'
        )

    def load_query(self, query: str | None = None) -> bool:
        """Apply ``config=...`` from a query string (default: Voilà's ``QUERY_STRING``).
        Returns True if a configuration was found and applied."""
        query = os.environ.get("QUERY_STRING", "") if query is None else query
        values = urllib.parse.parse_qs(query.lstrip("?")).get("config")
        if not values:
            return False
        self.set_state(json.loads(values[0]))
        return True

    def show_config(self) -> None:
        """Write the whole configuration as JSON into the text box (the Show button)."""
        self.config_text.value = json.dumps(self.state(), indent=1)
        self.show_link()
        self.share_message.value = ""

    def load_text(self) -> None:
        """Apply the configuration in the text box (the Load button); a bad one is explained in
        ``share_message``, not raised."""
        try:
            self.set_state(json.loads(self.config_text.value))
        except (ValueError, KeyError, TypeError) as e:  # JSONDecodeError is a ValueError
            self.share_message.value = f'<span class="mlsys-error">Could not load: {e}</span>'
        else:
            self.share_message.value = "<span>Loaded.</span>"


def _same(a, b) -> bool:
    """Equal settings; floats within a relative 1e-9 (a browser's slider sends back 1.0000000000000002
    for 1.0 and 1.0000000000000001e23 for 1e23)."""
    import math

    if isinstance(a, float) or isinstance(b, float):
        try:
            return math.isclose(float(a), float(b), rel_tol=1e-9)
        except (TypeError, ValueError):
            return False
    return a == b


def check_widget(obj, key: str = "?"):
    """``obj`` if it follows ``mlsys_nb.widgets.base.Widget``, else ``TypeError`` naming what it lacks."""
    if not isinstance(obj, Widget):
        missing = [
            n for n in ("widget", "figure", "error", "state", "set_state", "table", "on_update") if not hasattr(obj, n)
        ]
        raise TypeError(
            f"tab {key!r} ({type(obj).__name__}) does not follow mlsys_nb.widgets.base.Widget: missing {missing}"
        )
    return obj


def _upgrade(key: str, tab_state):
    """A tab's saved settings with old value names replaced (``LEGACY_VALUES``)."""
    legacy = LEGACY_VALUES.get(key, {})
    if not isinstance(tab_state, dict) or not legacy:
        return tab_state
    return {k: legacy.get(k, {}).get(v, v) if isinstance(v, str) else v for k, v in tab_state.items()}


def in_voila() -> bool:
    """True inside a kernel started by Voilà (it sets the CGI-style SERVER_SOFTWARE variable)."""
    return os.environ.get("SERVER_SOFTWARE", "").startswith("voila")


def self_check(dash: Dashboard) -> dict:
    """Drive every tab with its probe and its invalid combination; restore its state afterwards.

    Returns ``{"ok": bool, "tabs": [...], "problems": [...]}``: a tab passes when the probe changes
    its numbers and figure without an error, and the invalid combination sets ``.error`` and
    shows it in the dashboard's numbers view."""
    problems = []
    for key, obj in dash.tabs.items():
        spec = dash.specs[key]
        start = obj.state()
        table0, fig0 = obj.table().to_csv(), figure_bytes(obj.figure)
        obj.set_state(spec.probe)
        dash.refresh(key)
        if obj.error:
            problems.append(f"{key}: the probe {spec.probe} was refused: {obj.error}")
        elif obj.table().to_csv() == table0:
            problems.append(f"{key}: the probe {spec.probe} did not change the numbers")
        elif figure_bytes(obj.figure) == fig0:
            problems.append(f"{key}: the probe {spec.probe} did not change the figure")
        obj.set_state(spec.invalid)
        dash.refresh(key)
        if not obj.error or obj.error not in dash.numbers_html(key):
            problems.append(f"{key}: the invalid combination {spec.invalid} showed no message")
        obj.set_state(start)
        dash.refresh(key)
        if obj.error:
            problems.append(f"{key}: restoring the start state left an error: {obj.error}")
    return {"ok": not problems, "tabs": list(dash.tabs), "problems": problems}


def figure_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=40)
    return buf.getvalue()
