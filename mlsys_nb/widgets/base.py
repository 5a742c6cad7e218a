"""What every visualizer in ``mlsys_nb.widgets`` shares: the ``Widget`` protocol the dashboard
relies on, and ``ControlPanel``, the base class that implements it.

A subclass builds ``self.controls`` (name -> ipywidgets control), ``self.widget`` (the container
to display), ``self.figure`` (a matplotlib Figure it redraws in place), ``self.image`` (from
``self._make_image()``: an ``Image`` widget showing the figure as PNG), ``self.message`` and
``self.stats`` (HTML widgets), then calls ``self._wire()`` and implements ``update()``:
read ``self.state()``, call a calculator, set ``self.error`` (None or the message shown in place)
and ``self._table``, redraw, and ``self._show()``. The widget computes nothing itself. Every
redraw caused by a control or by ``set_state`` then calls the ``on_update`` callbacks.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable
from collections.abc import Callable

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


class ControlPanel:
    """Implements ``Widget`` for a panel of controls over one calculator (see the module docstring)."""

    controls: dict  # name -> ipywidgets control; ``state()`` reads them
    widget: object  # the container to display
    figure: object  # matplotlib Figure, redrawn in place
    image: object  # ipywidgets Image showing ``figure`` as PNG
    message: object  # ipywidgets HTML: the error message, shown in place of the figure
    stats: object  # ipywidgets HTML: headline numbers
    error: str | None = None
    _table: pd.DataFrame = pd.DataFrame()
    _hold: bool = False  # set_state is changing several controls: redraw once at the end
    _listeners: tuple = ()  # on_update callbacks

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
        ``.error``); ``self.message`` and ``self.stats`` are the subclass's HTML widgets."""
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
        """Render the figure to PNG into ``self.image``; hide it while ``self.error`` is set (a
        stale figure would contradict the message). An ``Image`` widget, not an ``Output`` one:
        the PNG travels as widget state, so headless runners (nbclient, papermill, Voilà) never
        have to replay captured output messages."""
        import io

        self.image.layout.display = "none" if self.error is not None else None
        if self.error is not None:
            return
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=self.png_dpi, **self.png_kwargs)
        width = str(round(self.figure.get_figwidth() * self.png_dpi))
        if self.image.width != width:  # show the PNG at its own size, not stretched to the page
            self.image.width = width
        self.image.value = buf.getvalue()
