"""Run by every notebook kernel the test suite starts (``PYTHONSTARTUP``, set in the root ``conftest.py``):
a figure that breaks the house style fails the cell that shows it (``plots.check_figures_when_rendered``)."""

from mlsys_nb.plots import check_figures_when_rendered

check_figures_when_rendered()
