"""``ruff check`` and ``ruff format --check`` over the repository (code and notebooks, config in
pyproject.toml) pass."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _ruff() -> list[str]:
    exe = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if exe:
        return [exe]
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    return [sys.executable, "-m", "ruff"]


def test_ruff_check_passes():
    out = subprocess.run(
        [*_ruff(), "check", "--no-cache", "--output-format", "concise", "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, f"ruff check found problems (fix them, or run `make format`):\n{out.stdout}{out.stderr}"


def test_ruff_format_check_passes():
    out = subprocess.run(
        [*_ruff(), "format", "--check", "--no-cache", "."], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, f"files are not formatted (run `make format`):\n{out.stdout}{out.stderr}"
