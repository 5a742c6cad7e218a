"""The engine step a learner reads (issue 48): ``LLMEngine.step`` is schedule -> run -> sample -> update ->
outputs in at most 35 lines with one ``try`` (around the forward), ``__init__`` at most 40; async scheduling
is a subclass (``AsyncLLMEngine``, its step in its own file) that ``async_scheduling=True`` builds and that
overrides ``step``, reusing the parent's parts."""

import ast
import inspect
import textwrap

from mlsys_nb.inference import AsyncLLMEngine, LLMEngine

STEP_LINES, INIT_LINES = 35, 40


def lines(fn) -> int:
    return len(inspect.getsource(fn).splitlines())


def test_the_step_and_the_constructor_fit_their_budgets():
    assert lines(LLMEngine.step) <= STEP_LINES, lines(LLMEngine.step)
    assert lines(LLMEngine.__init__) <= INIT_LINES, lines(LLMEngine.__init__)


def test_the_step_has_one_try_around_the_forward():
    tree = ast.parse(textwrap.dedent(inspect.getsource(LLMEngine.step)))
    tries = [n for n in ast.walk(tree) if isinstance(n, ast.Try)]
    assert len(tries) == 1
    calls = [ast.unparse(n.func) for n in ast.walk(tries[0].body[0]) if isinstance(n, ast.Call)]
    assert "self.runner.run" in calls, calls


def test_async_scheduling_builds_the_subclass_that_overrides_step(engine_test_model):
    assert issubclass(AsyncLLMEngine, LLMEngine)
    assert inspect.getsourcefile(inspect.unwrap(AsyncLLMEngine.step)).endswith("async_engine.py")
    assert AsyncLLMEngine.step is not LLMEngine.step
    source = inspect.getsource(AsyncLLMEngine.step)
    for part in ("_schedule", "_idle", "_sample", "_outputs", "_isolate_forward"):
        assert f"self.{part}(" in source, part
        assert getattr(AsyncLLMEngine, part) is getattr(LLMEngine, part), part  # reused, not copied
    sync = LLMEngine(engine_test_model)
    eng = LLMEngine(engine_test_model, async_scheduling=True)
    assert type(sync) is LLMEngine and type(eng) is AsyncLLMEngine
    eng.close()
