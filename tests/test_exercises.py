"""The exercise machinery of the notebooks (``mlsys_nb.exercises``), without launching ranks.

- ``attempted`` tells every kind of stub the notebooks use (``...``, ``None``, ``[...] * n``, a function
  or a class whose bodies are ``...``/``pass``/``raise NotImplementedError``, a function returning
  ``None`` on a probe) from an answer, on random values; ``exercise`` prints the notebooks' exact
  "not attempted" line; no notebook keeps a local copy of the helper.
- Exercise checks that need no ranks (notebooks 08, 10, 11, 14, 15) are executed from the stored notebook
  on a stub (they print "not attempted" and do not raise), on a wrong answer (they raise) and on the
  worked solution (they print their pass line): the checks can fail, and the solutions pass them.
"""

from __future__ import annotations

import contextlib
import io
import json
import random
import re
from pathlib import Path

import numpy as np
import pytest

from mlsys_nb.exercises import attempted, exercise, not_attempted_line

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(nb_path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _exec_file(src: str, ns: dict, path: Path) -> dict:
    """Execute ``src`` as if from a file (so ``inspect.getsource`` finds its functions)."""
    path.write_text(src)
    exec(compile(src, str(path), "exec"), ns)
    return ns


def _exercise(nb_name: str, k: int) -> tuple[str, str, str]:
    """(stub, solution, check) sources of exercise k of a notebook."""
    cells = _cells(ROOT / "notebooks" / nb_name)
    i = next(i for i, c in enumerate(cells) if re.search(rf'passed\(\s*f?"exercise {k}\b', _src(c)))
    assert "solution" in cells[i - 1]["metadata"].get("tags", []), (nb_name, k)
    return _src(cells[i - 2]), _src(cells[i - 1]), _src(cells[i])


STUBS = '''
def stub_ellipsis(x):
    ...

def stub_doc(x):
    """doc"""
    ...

def stub_pass(x):
    pass

def stub_raise(x):
    """doc"""
    raise NotImplementedError

def stub_raise_msg(x):
    raise NotImplementedError("write me")

def stub_one_line(x): ...  # your code

class StubFn:
    """doc"""

    @staticmethod
    def forward(ctx, x): ...

    @staticmethod
    def backward(ctx, dy): ...
'''

ANSWERS = """
def answer(x):
    return x + 1

def answer_none(x):
    return None  # written, but returns nothing: read as a stub only when probed

def answer_raises(x):
    raise ValueError("wrong shape")

def answer_not_impl(x):
    y = x + 1
    raise NotImplementedError

class HalfDone:
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, dy): ...
"""


def test_stubs_read_as_not_attempted(tmp_path):
    ns = _exec_file(STUBS, {}, tmp_path / "stubs.py")
    rng = random.Random(7)
    n = rng.randint(1, 20)
    stubs = [..., None, [...] * n, (...,) * n] + [v for k, v in ns.items() if k.startswith(("stub", "Stub"))]
    assert len(stubs) == 11
    for s in stubs:
        assert not attempted(s), s
        assert not attempted(s, probe=(rng.random(),)), s  # a stub is never called


def test_answers_read_as_attempted(tmp_path):
    ns = _exec_file(ANSWERS, {}, tmp_path / "answers.py")
    rng = random.Random(8)
    n = rng.randint(2, 20)
    partly = [...] * n
    partly[rng.randrange(n)] = rng.random()
    values = [0, 0.0, rng.uniform(-1e9, 1e9), "", False, [], partly, np.zeros(n), ns["answer"], ns["HalfDone"]]
    for v in values:
        assert attempted(v), v
    assert attempted(lambda x: x) and attempted(len)  # no source to read, or a builtin: an answer
    x = (rng.random(),)
    assert attempted(ns["answer"], probe=x) and attempted(ns["answer_raises"], probe=x)  # a wrong answer is checked
    assert attempted(ns["answer_none"]) and not attempted(ns["answer_none"], probe=x)  # None on a probe: a stub
    assert not attempted(ns["answer_not_impl"], probe=x)
    assert not attempted(lambda x: None, probe=x)


def test_exercise_prints_the_notebooks_line(capsys):
    rng = random.Random(9)
    k = rng.randint(1, 9)
    assert not exercise(k, ..., hint="write my_fn above, or run with solutions=True")
    assert not exercise("comm", [...] * 3)
    assert not exercise(k, 1.0, ...)  # every answer must be attempted
    assert capsys.readouterr().out == (
        f"exercise {k}: not attempted (write my_fn above, or run with solutions=True)\n"
        "comm: not attempted\n"
        f"exercise {k}: not attempted\n"
    )
    assert exercise(k, rng.random(), [1, ...], hint="x") and exercise("exercise 1 (solution)", lambda: 0)
    assert capsys.readouterr().out == ""  # an attempt prints nothing: its check prints "check passed: ..."
    assert not_attempted_line(k) == f"exercise {k}: not attempted"


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="label=0"):
        exercise(0, 1.0)
    with pytest.raises(TypeError, match="label=1.5"):
        exercise(1.5, 1.0)
    with pytest.raises(TypeError, match="at least one answer"):
        exercise(1)
    with pytest.raises(TypeError, match="probe=3"):
        attempted(lambda x: x, probe=3)


@pytest.mark.parametrize("p", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_no_notebook_keeps_its_own_copy(p):
    """Every notebook's checks come from mlsys_nb.exercises: no local ``attempted`` helper is left."""
    for i, c in enumerate(_cells(p)):
        src = _src(c) if c["cell_type"] == "code" else ""
        assert not src.startswith("# Exercise helper"), f"{p.name} cell {i}: a local copy of the helper"
        assert not re.search(r"^\s*def _?attempted\(", src, re.M), f"{p.name} cell {i}: a local attempted()"
        assert not re.search(r"print\(f?\"(exercise \d+|\{\w+\}): not attempted", src), (
            f"{p.name} cell {i}: prints its own 'not attempted' line; use mlsys_nb.exercises.exercise"
        )


def _run_check(check: str, ns: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(check, ns)
    return out.getvalue()


def _namespace(nb_name: str, tmp_path: Path) -> dict:
    from mlsys_nb import passed

    ns = {"np": np, "seed": 3, "solutions": True, "exercise": exercise, "attempted": attempted, "passed": passed}
    if nb_name.startswith("11"):
        from mlsys_nb import flops, scaling

        ns.update(flops=flops, laws={n: scaling.law(n) for n in ("chinchilla", "epoch", "kaplan")})
    elif nb_name.startswith("08"):
        from mlsys_nb.pipeline import schedule

        ns.update(schedule=schedule, p=4, m=8)
    elif nb_name.startswith("10"):
        from mlsys_nb import hardware, memory
        from mlsys_nb.config import ModelConfig, TrainConfig

        ns.update(
            memory=memory,
            ModelConfig=ModelConfig,
            TrainConfig=TrainConfig,
            preset_name="llama-3.1-8b",
            gpu_name="H100-SXM",
            model=memory.preset("llama-3.1-8b"),
            gpu=hardware.gpu("H100-SXM"),
            base=TrainConfig(micro_batch=1, seq_len=4096, gpu="H100-SXM"),
        )
    elif nb_name.startswith("14"):
        from mlsys_nb.inference.paged import BlockManager

        ns.update(rng=random.Random(3), BlockManager=BlockManager, VALID_BLOCK_SIZES=(1, 2, 4, 8, 16, 32))
    elif nb_name.startswith("15"):
        import torch

        from mlsys_nb.inference.sampler import filter_probs

        ns.update(torch=torch, filter_probs=filter_probs)
    return ns


WRONG = {
    ("11_compute_and_scaling_laws.ipynb", 1): "def my_n_opt(law, C):\n    return (C / 120) ** 0.5\n",  # D = 20 N
    ("11_compute_and_scaling_laws.ipynb", 2): "c_reported = 3.64e3 * 1e15 * 3600\n",  # PF/s-hours, not days
    (
        "08_pipeline_parallelism.ipynb",
        1,
    ): "def my_1f1b(p, m, r):\n    return [('F', j) for j in range(m)] + [('B', j) for j in range(m)]\n",  # GPipe
    ("10_training_memory.ipynb", 1): "def my_layer_bytes(s, b, h, a):\n    return s * b * h * 34\n",  # no s² term
    ("10_training_memory.ipynb", 2): "my_d = 1024\n",  # fits, but not the smallest
    (
        "14_kv_cache_management.ipynb",
        1,
    ): "def blocks_and_waste(n_tokens, block_size):\n    return n_tokens // block_size, 0\n",  # floor, not ceil
    ("15_batching_and_scheduling.ipynb", 2): (  # drops the token whose probability reaches p
        "def my_top_p(probs, p):\n"
        "    s, i = probs.sort(descending=True)\n"
        "    keep = torch.zeros_like(probs, dtype=torch.bool)\n"
        "    keep[i[s.cumsum(0) < p]] = True\n"
        "    return probs * keep / (probs * keep).sum()\n"
    ),
}


@pytest.mark.parametrize("nb_name,k", sorted(WRONG), ids=lambda x: str(x))
def test_exercise_check_skips_stub_fails_wrong_passes_solution(nb_name, k, tmp_path):
    stub, solution, check = _exercise(nb_name, k)
    ns = _namespace(nb_name, tmp_path)
    _exec_file(stub, ns, tmp_path / "stub.py")
    assert f"exercise {k}: not attempted" in _run_check(check, ns)
    _exec_file(WRONG[nb_name, k], ns, tmp_path / "wrong.py")
    with pytest.raises(AssertionError):
        _run_check(check, ns)
    _exec_file(stub, ns, tmp_path / "stub2.py")
    _exec_file(solution, ns, tmp_path / "solution.py")
    assert f"check passed: exercise {k}" in _run_check(check, ns)
