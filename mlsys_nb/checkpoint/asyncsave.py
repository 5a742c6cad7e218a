"""An asynchronous checkpoint from scratch: copy to host memory, then write on a thread.

``ThreadedSaver().save(state, path)`` stalls the caller only while it clones every tensor of ``state`` (the
staging copy), then a thread writes the copy with ``torch.save`` atomically (a ``.part`` file, fsync, rename)
and training goes on. The copy is the whole point: without it (``stage=False``) the thread writes whatever the
tensors hold when it gets to them, and a training step that ran in between leaks into the checkpoint.
``dcp.async_save`` does the same with a staging buffer per rank (notebook 24, section 4).
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch

__all__ = ["ThreadedSaver"]


class ThreadedSaver:
    """Write checkpoints on a background thread; ``stage`` (default True) copies the tensors first."""

    def __init__(self, stage: bool = True):
        self.stage = stage
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def save(self, state: dict, path, *, gate: threading.Event | None = None) -> None:
        """Start writing ``state`` ({name: tensor}) to ``path``; returns after the staging copy. ``gate``: the
        thread waits for it before writing (tests use it to order the write after a training step)."""
        self.wait()
        staged = {k: v.detach().clone() for k, v in state.items()} if self.stage else dict(state)
        self.thread = threading.Thread(target=self._write, args=(staged, Path(path), gate), daemon=True)
        self.thread.start()

    def _write(self, staged: dict, path: Path, gate) -> None:
        try:
            if gate is not None and not gate.wait(timeout=60):
                raise TimeoutError("the gate was not opened within 60 s")
            part = path.with_name(path.name + ".part")
            with open(part, "wb") as f:
                torch.save(staged, f)
                f.flush()
                os.fsync(f.fileno())
            os.replace(part, path)
        except BaseException as e:  # noqa: B902 - reported by wait()
            self.error = e

    def wait(self, timeout: float = 60.0) -> None:
        """Block until the last write finished (at most ``timeout`` seconds); re-raise its error."""
        if self.thread is not None:
            self.thread.join(timeout)
            if self.thread.is_alive():
                raise TimeoutError(f"the checkpoint write did not finish within {timeout:g} s")
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
