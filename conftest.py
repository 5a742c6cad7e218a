"""Loaded for every test path (``tests/`` and the notebooks nbval collects).

Notebook kernels started by the suite (nbval, papermill) run ``tests/kernel_startup.py`` first: IPython
honours ``PYTHONSTARTUP``, plain ``python`` scripts and the ranks they spawn do not (not interactive)."""

import os
from pathlib import Path

os.environ["PYTHONSTARTUP"] = str(Path(__file__).resolve().parent / "tests" / "kernel_startup.py")
