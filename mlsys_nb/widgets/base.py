"""What every visualizer in ``mlsys_nb.widgets`` shares: the ``Widget`` protocol the dashboard
relies on, ``Panel``, which implements it, and ``ControlPanel``, the one template of a calculator
widget.

A ``ControlPanel`` subclass declares its controls and its figure, builds them with ``self._build``
and implements four methods; the base owns the message, the stats line, the image, the layout and
``update()``, which runs them in this order and catches bad input once:

- ``compute(state) -> result``: call the calculators (the widget computes nothing itself); raises
  ``ValueError`` (e.g. ``mlsys_nb.config.ArgumentError``), ``KeyError`` or ``TypeError`` for bad
  input, whose message, naming the parameter, is then shown in place of the figure;
- ``rows(result) -> DataFrame``: the numbers shown (``table()``);
- ``headline(result) -> str``: the stats line (HTML) above the figure;
- ``draw(result)``: redraw ``self.figure`` in place;
- optionally ``details(result) -> str``: HTML shown below the figure (e.g. a table of layouts).

Every redraw caused by a control or by ``set_state`` then calls the ``on_update`` callbacks.
"""

from __future__ import annotations

import contextlib
import contextvars
import re
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import pandas as pd


@runtime_checkable
class Widget(Protocol):
    """What the dashboard needs from a tab (``mlsys_nb.dashboard``).

    - ``widget``: the ipywidgets container to display;
    - ``state() -> dict`` / ``set_state(dict)``: its settings, JSON-serialisable; ``set_state``
      raises ``ValueError`` for an unknown name and shows an invalid value as ``error``;
    - ``figure``: the current matplotlib Figure; ``table() -> DataFrame``: the numbers shown;
    - ``error``: ``None`` or the message shown in place of the figure for an invalid combination;
    - ``on_update(callback)``: call ``callback()`` after every redraw (control change or ``set_state``).
    """

    widget: object
    figure: object
    error: str | None

    def state(self) -> dict: ...

    def set_state(self, state: dict) -> None: ...

    def table(self) -> pd.DataFrame: ...

    def on_update(self, callback: Callable[[], None]) -> None: ...


_SUPERSCRIPT = str.maketrans("-0123456789", "\u207b\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")


def pow10_label(x: float, _pos=None) -> str:
    """A log-axis tick label '10¹⁸' in plain text (a ``FuncFormatter`` function): matplotlib's default
    log labels are mathtext, whose parsing was over half of a log-axis figure's redraw."""
    return "10" + str(int(round(np.log10(x)))).translate(_SUPERSCRIPT) if x > 0 else ""


def dim_png(png: bytes, keep: float = 0.35) -> bytes:
    """``png`` faded towards white: each pixel becomes ``keep`` x itself + (1 - ``keep``) x white
    (``keep`` in [0, 1]); how a figure that no longer matches the controls is shown."""
    import io

    from PIL import Image

    from ..config import check_probability

    check_probability("keep", keep)
    img = Image.open(io.BytesIO(png)).convert("RGB")
    out = Image.blend(Image.new("RGB", img.size, "white"), img, keep)
    buf = io.BytesIO()
    out.save(buf, format="png", compress_level=1)
    return buf.getvalue()


def error_text(error: BaseException) -> str:
    """The message of a caught bad-input exception (a ``KeyError`` without the quotes its ``str`` adds)."""
    if isinstance(error, KeyError) and len(error.args) == 1:
        return str(error.args[0])
    return str(error)


# parameter names the calculators' messages use, in the words a learner reads on the tabs
WORDS = {
    "n_heads": "attention heads",
    "n_kv_heads": "KV heads",
    "n_layers": "layers",
    "n_experts": "experts",
    "ffn_hidden": "FFN width",
    "virtual_stages": "virtual stages",
    "micro_batch": "micro-batch",
    "n_microbatches": "micro-batches per step",
    "seq_len": "sequence length",
    "overhead_bytes": "overhead",
    "recompute_layers": "recomputed layers",
}
_JARGON = (("must be an int", "must be a whole number"), ("a finite number", "a number"))
_LAYOUT = re.compile(r"Layout\(([^()]*)\)")


def layout_words(fields: str) -> str:
    """A ``Layout(dp=1, tp=1, pp=3, ..., zero=0, recompute='full', micro_batch=1, schedule='1f1b', v=1,
    recompute_layers=0)`` repr's fields as words: ``"DP 1 × TP 1 × PP 3 × CP 1 × EP 1, ZeRO-0, full
    recomputation, micro-batch 1, 1f1b schedule"`` (``v`` when above 1)."""
    f = dict(kv.split("=", 1) for kv in re.split(r",\s*", fields.strip()) if "=" in kv)
    f = {k.strip(): v.strip().strip("'\"") for k, v in f.items()}
    dims = " × ".join(f"{k.upper()} {f[k]}" for k in ("dp", "tp", "pp", "cp", "ep") if k in f)
    parts = [dims] if dims else []
    if "zero" in f:
        parts.append(f"ZeRO-{f['zero']}")
    if "recompute" in f:
        parts.append("no recomputation" if f["recompute"] == "none" else f"{f['recompute']} recomputation")
    if "micro_batch" in f:
        parts.append(f"micro-batch {f['micro_batch']}")
    if "schedule" in f:
        parts.append(f"{f['schedule']} schedule" + (f" (v = {f['v']})" if f.get("v", "1") != "1" else ""))
    return ", ".join(parts)


def in_words(message: str, words: dict) -> str:
    """``message`` with parameter names said in words: ``words`` (a widget's control names -> their labels)
    and ``WORDS``; ``name=value`` becomes ``label value``; a raw ``Layout(...)`` becomes ``layout_words``;
    "must be an int" becomes "must be a whole number"."""
    message = _LAYOUT.sub(lambda m: f"the layout ({layout_words(m.group(1))})", message)
    table = WORDS | dict(words)
    for name in sorted(table, key=len, reverse=True):
        message = re.sub(
            rf"(?<![\w.]){re.escape(name)}(?:=|\b)(?![(])",
            lambda m, n=name: table[n] + (" " if m.group(0).endswith("=") else ""),
            message,
        )
    for old, new in _JARGON:
        message = message.replace(old, new)
    return message


_IMAGES = contextvars.ContextVar("mlsys_widget_images", default=True)


@contextlib.contextmanager
def without_images():
    """Panels built inside this block draw their figures but never render them to PNG for display
    (``Panel.images`` is False): for widgets nobody looks at, such as the dashboard's self-check and
    link round trips (``Dashboard(images=False)``). Their ``figure``, numbers and errors are the same."""
    token = _IMAGES.set(False)
    try:
        yield
    finally:
        _IMAGES.reset(token)


class Panel:
    """Implements ``Widget`` over ``self.controls`` (name -> ipywidgets control): settings, redraw
    on change, callbacks, an error shown in place, the figure shown as PNG. A subclass implements
    ``update()``; calculator widgets use the ``ControlPanel`` template instead."""

    controls: dict  # name -> ipywidgets control; ``state()`` reads them
    widget: object  # the container to display
    figure: object  # matplotlib Figure, redrawn in place
    image: object  # ipywidgets Image showing ``figure`` as PNG
    message: object  # ipywidgets HTML: the error message, shown in place of the figure
    stats: object  # ipywidgets HTML: headline numbers
    error: str | None = None
    keep_stale_figure: bool = False  # on an error, show the last valid figure dimmed instead of hiding it
    _last_png: bytes = b""  # the last valid figure's PNG
    _table: pd.DataFrame = pd.DataFrame()
    _hold: bool = False  # set_state is changing several controls: redraw once at the end
    _listeners: tuple = ()  # on_update callbacks
    images: bool = True  # render the figure to PNG for display; False when built inside ``without_images()``

    def __new__(cls, *args, **kwargs):
        obj = super().__new__(cls)
        obj.images = _IMAGES.get()  # decided before __init__ draws the first figure
        return obj

    def _wire(self) -> None:
        """Redraw on every control change (set_state holds redraws until all values are set)."""
        for ctl in self.controls.values():
            ctl.observe(self._on_change, names="value")

    def _on_change(self, _change) -> None:
        if not self._hold:
            self._redraw()

    def _redraw(self) -> None:
        """``update()``, then every ``on_update`` callback."""
        self.update()
        for callback in self._listeners:
            callback()

    def update(self) -> None:  # pragma: no cover - every subclass implements it
        raise NotImplementedError

    # ---- the dashboard protocol ----------------------------------------------------------------
    def on_update(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every redraw caused by a control or by ``set_state``."""
        self._listeners = (*self._listeners, callback)

    def state(self) -> dict:
        """The settings as a JSON-serialisable dict (numpy floats become Python floats)."""
        return {k: (float(c.value) if isinstance(c.value, float) else c.value) for k, c in self.controls.items()}

    def set_state(self, state: dict) -> None:
        """Set several controls, then redraw once. Unknown names raise ValueError listing the
        allowed ones; an invalid value shows up as ``self.error``, like a slider move would."""
        unknown = set(state) - set(self.controls)
        if unknown:
            raise ValueError(f"unknown settings {sorted(unknown)}; allowed: {sorted(self.controls)}")
        self._hold = True
        try:
            for k, v in state.items():
                self.controls[k].value = v
        finally:
            self._hold = False
        self._redraw()

    def _show_error(self, error: str, label: str = "Invalid combination") -> None:
        """Show ``error`` in place of the figure and the numbers (the dashboard protocol's
        ``.error``); ``self.message`` and ``self.stats`` are HTML widgets."""
        self.error = error
        self.message.value = f"<b style='color:#D55E00'>{label}:</b> {error}"
        self.stats.value = ""
        self._table = pd.DataFrame()
        self._show()

    def table(self) -> pd.DataFrame:
        """The numbers currently shown (empty while an invalid combination is shown)."""
        return self._table.copy()

    # PNG rendering of the figure: the figures have fixed margins or a layout engine, so no
    # "tight" pass; a low zlib level encodes several times faster for ~10% more bytes.
    png_dpi: float = 100
    png_kwargs = {"bbox_inches": None, "pil_kwargs": {"compress_level": 1}}

    @staticmethod
    def _make_image():
        import ipywidgets as w

        return w.Image(format="png")

    def _show(self) -> None:
        """Render the figure to PNG into ``self.image``; while ``self.error`` is set, hide it (a
        stale figure would contradict the message) or, with ``keep_stale_figure``, show the last
        valid one dimmed (class ``mlsys-stale``). An ``Image`` widget, not an ``Output`` one:
        the PNG travels as widget state, so headless runners (nbclient, papermill, Voilà) never
        have to replay captured output messages."""
        import io

        if self.error is not None:
            if self.keep_stale_figure and self._last_png:
                self.image.value = dim_png(self._last_png)
                self.image.add_class("mlsys-stale")
                self.image.layout.display = None
            else:
                self.image.layout.display = "none"
            return
        self.image.layout.display = None
        self.image.remove_class("mlsys-stale")
        if not self.images:  # nobody displays this panel (``without_images``): no PNG
            return
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.png_dpi, **self.png_kwargs)
        width = str(round(self.figure.get_figwidth() * self.png_dpi))
        if self.image.width != width:  # show the PNG at its own size, not stretched to the page
            self.image.width = width
        self.image.value = self._last_png = buf.getvalue()


class ControlPanel(Panel):
    """The template of a calculator widget (see the module docstring): a subclass declares
    ``compute``, ``rows``, ``headline`` and ``draw`` (and optionally ``details``), builds its
    controls and figure with ``_build``, and never overrides ``update()``."""

    error_label = "Invalid input"  # the bold word(s) before an error message
    words: dict = {}  # control name -> the words an error message says for it (``in_words``)
    errors: tuple = (ValueError, KeyError, TypeError)  # what compute() raises for bad input
    result = None  # the last compute() result; None while an error is shown
    details_html = None  # ipywidgets HTML below the figure, when the subclass has ``details``

    # ---- what a widget declares ----------------------------------------------------------------
    def compute(self, state: dict):  # pragma: no cover - every subclass implements it
        """All numbers for ``state`` (no drawing); raises one of ``errors`` on bad input."""
        raise NotImplementedError

    def rows(self, result) -> pd.DataFrame:  # pragma: no cover - every subclass implements it
        """The numbers shown, as a DataFrame (``table()``)."""
        raise NotImplementedError

    def headline(self, result) -> str:  # pragma: no cover - every subclass implements it
        """The stats line above the figure (HTML)."""
        raise NotImplementedError

    def draw(self, result) -> None:  # pragma: no cover - every subclass implements it
        """Redraw ``self.figure`` in place."""
        raise NotImplementedError

    details = None  # optional: ``details(result) -> str``, HTML shown below the figure

    def error_words(self) -> dict:
        """Parameter name -> words, for the error messages: every snake_case control (``n_gpus``) by its label
        without the unit in parentheses ("GPUs"), then the widget's own ``words`` (abbreviations: ``tp``)."""
        labels = {n: re.sub(r"\s*\(.*\)$", "", c.description) for n, c in self.controls.items() if "_" in n}
        return {n: w for n, w in labels.items() if w} | dict(self.words)

    # ---- what the base does --------------------------------------------------------------------
    def _build(
        self,
        controls: dict,
        figure,
        *,
        columns: Sequence[int],
        label_width: str,
        beside: Sequence = (),
        below: Sequence = (),
    ) -> None:
        """Lay out ``controls`` (split into columns at the indices ``columns``; ``beside`` goes
        under the last column), then the message, the stats line, the figure's image, the
        ``details`` HTML and ``below``; redraw on every control change, and draw once."""
        import ipywidgets as w

        self.controls, self.figure = controls, figure
        for c in controls.values():
            c.style = {"description_width": label_width}
        self.message = w.HTML()
        self.stats = w.HTML()
        self.image = self._make_image()
        self.error = None
        self.result = None
        self._table = pd.DataFrame()
        c = list(controls.values())
        cuts = [0, *columns, len(c)]
        cols = [c[a:b] for a, b in zip(cuts, cuts[1:])]
        cols[-1] = cols[-1] + list(beside)
        parts = [w.HBox([w.VBox(col) for col in cols]), self.message, self.stats, self.image]
        if self.details is not None:
            self.details_html = w.HTML()
            parts.append(self.details_html)
        self.widget = w.VBox([*parts, *below])
        self._wire()
        self.update()

    def update(self) -> None:
        """compute -> rows -> headline -> draw, or the error message in place of the figure."""
        try:
            result = self.compute(self.state())
        except self.errors as e:
            self.result = None
            if self.details_html is not None:
                self.details_html.value = ""
            self._show_error(in_words(error_text(e), self.error_words()), self.error_label)
            return
        self.error = None
        self.result = result
        self.message.value = ""
        self._table = self.rows(result)
        self.stats.value = self.headline(result)
        self.draw(result)
        if self.details_html is not None:
            self.details_html.value = self.details(result)
        self._show()
