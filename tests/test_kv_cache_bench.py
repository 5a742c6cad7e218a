"""benchmarks/kv_cache.py --quick runs and prints its table (no timing is asserted)."""
import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("transformers")


def test_quick(capsys):
    path = Path(__file__).resolve().parent.parent / "benchmarks" / "kv_cache.py"
    spec = importlib.util.spec_from_file_location("bench_kv_cache", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = mod.main(["--quick"])
    assert [r[0] for r in rows] == [32, 128] and all(t > 0 for r in rows for t in r[1:])
    assert "uncached / cached" in capsys.readouterr().out
