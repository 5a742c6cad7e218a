"""What every visualizer in ``mlsys_nb.widgets`` shares: the dashboard protocol.

A subclass builds ``self.controls`` (name -> ipywidgets control), ``self.widget`` (the container
to display), ``self.figure`` (a matplotlib Figure it redraws in place) and ``self.output`` (an
``Output`` widget showing the figure), then calls ``self._wire()`` and implements ``update()``:
read ``self.state()``, call a calculator, set ``self.error`` (None or the message shown in place)
and ``self._table``, redraw, and ``self._show()``. The widget computes nothing itself.
"""
from __future__ import annotations

import pandas as pd


class ControlPanel:
    controls: dict
    error: str | None = None
    _table: pd.DataFrame = pd.DataFrame()
    _hold: bool = False

    def _wire(self) -> None:
        """Redraw on every control change (set_state holds redraws until all values are set)."""
        for ctl in self.controls.values():
            ctl.observe(self._on_change, names="value")

    def _on_change(self, _change) -> None:
        if not self._hold:
            self.update()

    def update(self) -> None:  # pragma: no cover - every subclass implements it
        raise NotImplementedError

    # ---- the dashboard protocol ----------------------------------------------------------------
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
        self.update()

    def table(self) -> pd.DataFrame:
        """The numbers currently shown (empty while an invalid combination is shown)."""
        return self._table.copy()

    def _show(self) -> None:
        """Show the current figure, or nothing while ``self.error`` is set (a stale figure would
        contradict the message)."""
        from IPython.display import display

        with self.output:
            self.output.clear_output(wait=self.error is None)
            if self.error is None:
                display(self.figure)
