"""``python -m mlsys_nb.run module:function`` under torchrun (the ``mlsys-nb-run`` script):
the entry point lives in ``mlsys_nb.runtime.torchrun``; see its docstring for usage."""

from __future__ import annotations

import sys

from .runtime.torchrun import load_function, main

__all__ = ["main", "load_function"]

if __name__ == "__main__":
    sys.exit(main())
