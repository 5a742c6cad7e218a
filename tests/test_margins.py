"""``margins.check_margin`` (the value beside its bound, parsed back), ``runtime.machine.capability_env`` (each CPU
capability with its own caches) and ``benchmarks/portability.py``'s record (merge and page), without a notebook."""

import sys
from pathlib import Path

import pytest

from mlsys_nb.runtime import check_margin, parse_margins
from mlsys_nb.runtime.machine import capability_env

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


def test_check_margin_prints_the_room_and_parses_back(capsys):
    assert check_margin("PPO: rise", 2.31, ">", 1.5) == 2.31
    check_margin("KL (nats)", 3.2, "<", 8)
    check_margin("equal is enough", 1.0, ">=", 1.0)
    got = parse_margins(capsys.readouterr().out)
    assert [(m["label"], m["op"], m["room"]) for m in got] == [
        ("PPO: rise", ">", pytest.approx(0.81)),
        ("KL (nats)", "<", pytest.approx(4.8)),
        ("equal is enough", ">=", 0.0),
    ]


def test_check_margin_fails_below_its_bound_and_on_nan(capsys):
    with pytest.raises(AssertionError, match=r"rise: 1.4 is not > 1.5: PPO did not learn"):
        check_margin("rise", 1.4, ">", 1.5, why="PPO did not learn")
    (m,) = parse_margins(capsys.readouterr().out)
    assert m["room"] == pytest.approx(-0.1), "a failing check still prints its (negative) room"
    with pytest.raises(AssertionError):
        check_margin("rise", float("nan"), "<", 1.5)
    with pytest.raises(AssertionError):
        check_margin("strict", 1.0, ">", 1.0)
    with pytest.raises(ValueError, match="op="):
        check_margin("x", 1, "==", 1)
    with pytest.raises(ValueError, match="label="):
        check_margin("a = b", 1, ">", 0)


def test_capability_env_keeps_each_capabilitys_caches_apart():
    base = {"PATH": "/bin", "ATEN_CPU_CAPABILITY": "avx2"}
    native = capability_env(None, base)
    assert "ATEN_CPU_CAPABILITY" not in native and native["PATH"] == "/bin"
    envs = {c: capability_env(c, base) for c in ("default", "avx2", "AVX512")}
    assert [e["ATEN_CPU_CAPABILITY"] for e in envs.values()] == ["default", "avx2", "avx512"]
    for key in ("TORCHINDUCTOR_CACHE_DIR", "MLSYS_NB_CACHE"):
        assert len({e[key] for e in envs.values()}) == 3, f"{key} shared between capabilities"
    with pytest.raises(ValueError, match="capability='sse'"):
        capability_env("sse", base)


def test_the_kept_rlhf_start_is_keyed_on_the_cpu_kernels(monkeypatch):
    """A start trained with other kernels is another model: its key differs (the broken idea, a key without the
    capability, would hand notebook 19 under AVX2 a model notebook 18 trained under AVX-512)."""
    import torch

    from mlsys_nb.rl import rlhf as R

    kw = dict(seed=0, steps=1, demos=["ab"], train_pairs=[])
    native = R.start_key(**kw)
    other = "DEFAULT" if torch.backends.cpu.get_cpu_capability() != "DEFAULT" else "AVX2"
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: other)
    assert R.start_key(**kw) != native


def test_the_portability_record_replaces_a_rerun_and_reports_the_worst_room(tmp_path):
    import portability as P

    csv = tmp_path / "p.csv"
    two = "margin: rise = 2 > 1 (margin +1)\nmargin: KL = 3 < 2 (margin -1)\n"
    P.merge(P.rows_of("18", 0, "avx2", two, "", 10.0), csv)
    P.merge(P.rows_of("18", 1, "default", two, "AssertionError: KL", 12.0), csv)
    df = P.merge(P.rows_of("18", 0, "avx2", "margin: rise = 5 > 1 (margin +4)", "", 9.0), csv)
    assert len(df) == 4, "the rerun of seed 0 under avx2 replaced its two rows with one"
    assert sorted(df.status) == ["broke", "error", "held", "held"]
    page = P.markdown(df)
    assert "| rise | > 1 | 2 | +1 (1, default) | +2.5 | 2 - 5 | 2 |" in page
    assert "FAILED at seed 1, default: AssertionError: KL" in page
