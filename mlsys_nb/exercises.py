"""The notebooks' "Try it yourself" checks: tell an untouched stub from an answer, and say so.

Every exercise in notebooks 01-20 has three cells: a stub the learner fills in, a hidden worked
solution that runs only ``if solutions:``, and a check. The check reads::

    from mlsys_nb import passed
    from mlsys_nb.exercises import exercise

    if exercise(1, my_sync, hint="write my_sync above, or run with solutions=True"):
        ...  # assertions against an independent reference
        passed("exercise 1, ...")  # prints "check passed: exercise 1, ..." and records it for the tests

``exercise(1, my_sync, hint=...)`` returns True when ``my_sync`` has been written; while it is still
the stub it prints ``exercise 1: not attempted (write my_sync above, or run with solutions=True)``
and returns False, so the check is skipped and the notebook still runs top to bottom. Inside a
check function, ``if not exercise(label, fn, probe=(2, 3)): return`` does the same.

What counts as a stub (every convention the notebooks use, see ``attempted``):

- the value ``...`` (``my_d = ...``) or ``None``;
- a non-empty list or tuple of only ``...`` (a worksheet's ``[...] * n``);
- a function whose body is only ``...``, ``pass``, a docstring or ``raise NotImplementedError``;
- a class all of whose methods are such stubs;
- a function that, called on ``probe`` arguments, returns ``None`` or raises ``NotImplementedError``
  (any other exception counts as an attempt: the check itself then shows the error).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from typing import Any

__all__ = ["attempted", "exercise", "not_attempted_line"]


def _is_stub_statement(s: ast.stmt) -> bool:
    if isinstance(s, ast.Pass):
        return True
    if isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant):
        return s.value.value is ... or isinstance(s.value.value, str)
    if isinstance(s, ast.Raise) and s.exc is not None:
        exc = s.exc.func if isinstance(s.exc, ast.Call) else s.exc
        return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"
    return False


def _stub_body(fn) -> bool | None:
    """True if ``fn``'s source body is only stub statements, False if not, None if its source is unknown."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return None
    node = tree.body[0] if tree.body else None
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    return all(_is_stub_statement(s) for s in node.body)


def attempted(answer: Any, probe: tuple | None = None) -> bool:
    """False while ``answer`` is still an exercise's stub, True once something has been written.

    ``answer``: the learner's value, function or class. ``probe``: optional positional arguments;
    when given, a function whose source is not a stub is also called on them, and returning
    ``None`` or raising ``NotImplementedError`` reads as not attempted.
    """
    if answer is ... or answer is None:
        return False
    if isinstance(answer, (list, tuple)):
        return not (len(answer) > 0 and all(a is ... for a in answer))
    if isinstance(answer, type):
        methods = [getattr(v, "__func__", v) for v in vars(answer).values()]
        return any(attempted(f) for f in methods if inspect.isfunction(f))
    if callable(answer):
        if inspect.isfunction(answer) and _stub_body(answer):
            return False
        if probe is not None:
            if not isinstance(probe, tuple):
                raise TypeError(f"probe={probe!r}: give a tuple of positional arguments, e.g. probe=(2, 3)")
            try:
                return answer(*probe) is not None
            except NotImplementedError:
                return False
            except Exception:
                return True  # an attempt that fails: the check's own assertions show it
    return True


def not_attempted_line(label: int | str, hint: str | None = None) -> str:
    """The line a check prints for an untouched stub: ``exercise 2: not attempted (hint)``.

    ``label``: an exercise number (int >= 1) or a free label such as ``"comm"``.
    """
    if isinstance(label, bool) or not isinstance(label, (int, str)):
        raise TypeError(f"label={label!r}: give an exercise number (int >= 1) or a label (str)")
    if isinstance(label, int):
        if label < 1:
            raise ValueError(f"label={label}: exercise numbers start at 1")
        label = f"exercise {label}"
    return f"{label}: not attempted" + (f" ({hint})" if hint else "")


def exercise(label: int | str, *answers: Any, hint: str | None = None, probe: tuple | None = None) -> bool:
    """True when every one of ``answers`` has been attempted (see ``attempted``), so its check should run.

    Otherwise prints ``not_attempted_line(label, hint)`` and returns False. ``probe`` is passed to
    ``attempted`` for each answer.
    """
    if not answers:
        raise TypeError("exercise() needs at least one answer to look at, e.g. exercise(1, my_fn)")
    line = not_attempted_line(label, hint)  # validates label even when everything is attempted
    if all(attempted(a, probe) for a in answers):
        return True
    print(line)
    return False
