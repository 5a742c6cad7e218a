"""The exercise machinery of the notebooks, without launching ranks.

- Notebooks 01-11 carry the same ``attempted`` helper, and it tells a stub (``...``,
  a function or a class whose bodies are ``...``) from an answer.
- Exercise checks that need no ranks (notebooks 08, 10, 11) are executed from the stored notebook on a
  stub (they print "not attempted" and do not raise), on a wrong answer (they raise) and on the
  worked solution (they print their pass line): the checks can fail, and the solutions pass them.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _cells(nb_path: Path) -> list[dict]:
    return json.loads(nb_path.read_text())["cells"]


def _src(cell: dict) -> str:
    return "".join(cell["source"])


def _helper_sources() -> dict[str, str]:
    out = {}
    for p in NOTEBOOKS:
        for c in _cells(p):
            if c["cell_type"] == "code" and _src(c).startswith("# Exercise helper"):
                out[p.name] = _src(c)
    return out


def _exec_file(src: str, ns: dict, path: Path) -> dict:
    """Execute ``src`` as if from a file (so ``inspect.getsource`` finds its functions)."""
    path.write_text(src)
    exec(compile(src, str(path), "exec"), ns)
    return ns


def _exercise(nb_name: str, k: int) -> tuple[str, str, str]:
    """(stub, solution, check) sources of exercise k of a notebook."""
    cells = _cells(ROOT / "notebooks" / nb_name)
    i = next(i for i, c in enumerate(cells) if f"check passed: exercise {k}" in _src(c))
    assert "solution" in cells[i - 1]["metadata"].get("tags", []), (nb_name, k)
    return _src(cells[i - 2]), _src(cells[i - 1]), _src(cells[i])


def test_the_exercise_helper_is_the_same_everywhere():
    helpers = _helper_sources()
    assert {f"{k:02d}" for k in (1, 2, 3, 4, 5, 6, 7, 8, 10, 11)} <= {n[:2] for n in helpers}, sorted(helpers)
    assert len(set(helpers.values())) == 1, "the exercise helper differs between notebooks"


def test_attempted_tells_stubs_from_answers(tmp_path):
    ns = _exec_file(next(iter(_helper_sources().values())), {}, tmp_path / "helper.py")
    _exec_file(
        '''
def stub(x):
    """doc"""
    ...

def answer(x):
    return x + 1

class StubFn:
    @staticmethod
    def forward(ctx, x):
        ...

    @staticmethod
    def backward(ctx, dy):
        ...

class HalfDone:
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, dy):
        ...
''',
        ns,
        tmp_path / "learner.py",
    )
    attempted = ns["attempted"]
    assert not attempted(...) and not attempted(ns["stub"]) and not attempted(ns["StubFn"])
    assert attempted(ns["answer"]) and attempted(ns["HalfDone"]) and attempted(0) and attempted(3.5)


def _run_check(check: str, ns: dict) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(check, ns)
    return out.getvalue()


def _namespace(nb_name: str, tmp_path: Path) -> dict:
    ns = _exec_file(_helper_sources()[nb_name], {"np": np, "seed": 3, "solutions": True}, tmp_path / "helper.py")
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
