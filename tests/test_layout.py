"""The package layout and its conventions: public names, one subpackage per topic, one validator,
one dtype table, and the places where one function now serves several callers."""

import importlib
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import mlsys_nb
from mlsys_nb import config, memory
from mlsys_nb.config import DTYPE_BYTES, ArgumentError, check_choice, check_int, check_number, dtype_bytes

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlsys_nb"


def test_public_names_of_the_issue_still_work():
    assert callable(mlsys_nb.launch) and callable(mlsys_nb.device) and isinstance(mlsys_nb.Cluster, type)
    assert callable(mlsys_nb.load_ipython_extension)
    from mlsys_nb import dashboard, flops, plots, scaling
    from mlsys_nb.config import ModelConfig, TrainConfig
    from mlsys_nb.hardware import gpu
    from mlsys_nb.models import Transformer
    from mlsys_nb.pipeline import SCHEDULES, schedule, simulate

    assert all(
        callable(f)
        for f in (
            memory.preset,
            memory.presets,
            memory.estimate,
            memory.param_count,
            memory.model_state_bytes,
            scaling.law,
            scaling.fit,
            schedule,
            simulate,
            gpu,
        )
    )
    assert dashboard.Dashboard and plots.new_figure and flops.flops_per_token and ModelConfig and TrainConfig
    assert Transformer and "gpipe" in SCHEDULES
    from mlsys_nb.run import main

    assert callable(main)


def test_the_torchrun_entry_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "mlsys_nb.run", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0 and "module:function" in out.stdout, out.stderr


def test_at_most_ten_top_level_modules_and_every_subpackage_has_a_front_page():
    modules = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert len(modules) <= 10, f"top-level modules (a new topic gets a subpackage): {modules}"
    for sub in sorted(p for p in PKG.iterdir() if (p / "__init__.py").exists()):
        doc = importlib.import_module(f"mlsys_nb.{sub.name}").__doc__ or ""
        assert len(doc.strip().splitlines()) >= 3, f"mlsys_nb/{sub.name}/__init__.py needs a front-page docstring"


def test_one_error_family_for_launch_and_cluster():
    from mlsys_nb.runtime import RankError, RankTimeoutError, cluster, launcher

    assert launcher.RankError is cluster.RankError is RankError
    assert launcher.RankTimeoutError is cluster.RankTimeoutError is RankTimeoutError
    assert issubclass(RankTimeoutError, RankError) and issubclass(RankTimeoutError, TimeoutError)
    err = pickle.loads(pickle.dumps(RankTimeoutError("stuck", stacks={1: "in recv"}, restarted=True)))
    assert err.stacks == {1: "in recv"} and err.restarted and err.ranks == [1]
    source = (PKG / "runtime" / "cluster.py").read_text()
    assert "from .launcher" not in source, "the cluster must use the shared rank runtime, not the launcher"


def test_bytes_sent_is_the_only_spelling_of_the_bytes_a_rank_sends():
    hits = [str(p.relative_to(ROOT)) for p in PKG.rglob("*.py") if "sent_bytes" in p.read_text()]
    assert not hits, f"use bytes_sent / bytes_received: {hits}"


def test_threads_is_the_only_spelling_of_the_thread_count():
    import inspect

    from mlsys_nb.runtime.cluster import Cluster
    from mlsys_nb.runtime.launcher import launch

    assert "threads" in inspect.signature(launch).parameters
    assert "threads" in inspect.signature(Cluster).parameters
    hits = [p for p in PKG.rglob("*.py") if "num_threads=" in p.read_text() or "num_threads:" in p.read_text()]
    assert not hits, hits


@pytest.mark.parametrize(
    "call, words",
    [
        (lambda: check_int("world_size", 0), ["world_size", ">= 1", "0"]),
        (lambda: check_int("zero", 5, 0, 3), ["zero", "[0, 3]", "5"]),
        (lambda: check_int("p", 2.0), ["p", "int"]),
        (lambda: check_number("mfu", 1.5, 0, 1, lo_open=True), ["mfu", "> 0", "<= 1", "1.5"]),
        (lambda: check_number("timeout", float("nan"), 0), ["timeout", "nan"]),
        (lambda: check_choice("backend", "mpi", ("gloo", "nccl")), ["backend", "gloo", "nccl", "mpi"]),
        (lambda: mlsys_nb.launch(lambda: 0, 0), ["world_size", ">= 1"]),
        (lambda: config.ModelConfig(n_layers=0, hidden=8, n_heads=2, vocab_size=10), ["n_layers", ">= 1"]),
        (lambda: config.TrainConfig(zero=4), ["zero", "[0, 3]"]),
        (lambda: config.TrainConfig(pp_schedule="afab"), ["pp_schedule", "gpipe"]),
    ],
)
def test_one_validator_names_the_parameter_and_the_allowed_range(call, words):
    with pytest.raises(ArgumentError) as info:
        call()
    assert isinstance(info.value, ValueError)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_schedule_errors_are_argument_errors():
    from mlsys_nb.pipeline import ScheduleError, schedule

    with pytest.raises(ScheduleError, match="p must be an int >= 1"):
        schedule("1f1b", 0, 4)
    assert issubclass(ScheduleError, ArgumentError)


def test_dtype_table_and_torch_dtypes():
    assert DTYPE_BYTES == {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
    for t in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.int8):
        assert dtype_bytes(t) == torch.empty((), dtype=t).element_size(), t
    assert config.dtype_name(torch.bfloat16) == "bf16" and config.torch_dtype("tf32") is torch.float32
    with pytest.raises(ArgumentError, match="dtype"):
        dtype_bytes("float32")
    with pytest.raises(ArgumentError, match="torch.float64"):
        dtype_bytes(torch.float64)
    from mlsys_nb import flops, hardware

    h100 = hardware.gpu("H100-SXM")
    assert h100.peak(torch.bfloat16) == h100.peak("bf16") == 989.4e12
    assert (
        flops.training_time(7e9, 1e12, gpu="H100-SXM", n_gpus=8, mfu=0.4, dtype=torch.bfloat16).days
        == flops.training_time(7e9, 1e12, gpu="H100-SXM", n_gpus=8, mfu=0.4, dtype="bf16").days
    )


def test_flops_parameter_count_is_memory_param_count_and_both_match_the_module():
    from mlsys_nb import flops
    from mlsys_nb.models import Transformer

    for name in ("llama-3.2-1b", "mixtral-8x7b"):
        cfg = memory.preset(name)
        pc = memory.param_count(cfg)
        assert flops.parameter_count(cfg, active=False) == pc.total
        assert flops.parameter_count(cfg) == pc.active
        with torch.device("meta"):
            assert Transformer(cfg).num_parameters() == pc.total  # the module counts its own tensors


def test_the_byte_counter_takes_its_factors_from_the_cost_module(monkeypatch):
    from mlsys_nb.comm import counting, cost

    assert counting.bytes_sent("all_reduce", 1000, 4) == cost.bytes_sent_per_rank("all_reduce", 1000, 4) == 1500
    assert counting.bytes_sent("all_gather_into_tensor", 1000, 4) == 750
    assert counting.bytes_sent("send", 1000, 4) == 1000 and counting.bytes_sent("recv", 1000, 4) == 0
    # break the cost model: the counter must follow it (it restates nothing)
    monkeypatch.setattr(counting, "bytes_sent_per_rank", lambda op, s, n, algorithm="ring": 7.0)
    assert counting.bytes_sent("all_reduce", 1000, 4) == 7.0


def test_memory_in_flight_micro_batches_are_the_pipeline_closed_forms(monkeypatch):
    from mlsys_nb.pipeline import closed_form, peak_in_flight, schedule, simulate

    cfg = memory.preset("llama-3.1-8b")
    for name, v, m in (
        ("gpipe", None, 8),
        ("1f1b", None, 8),
        ("zb-h1", None, 8),
        ("zb-h2", None, 12),
        ("interleaved-1f1b", 2, 8),
        ("zbv", None, 8),
    ):
        train = config.TrainConfig(pp=4, n_microbatches=m, pp_schedule=name, seq_len=1024, virtual_stages=v or 1)
        got = [memory.estimate(cfg, train, stage=s).in_flight for s in range(4)]
        assert got == peak_in_flight(name, 4, m, v) == closed_form(name, 4, m, v)["peak_activations"]
        sim = simulate(schedule(name, 4, m, v), W=1.0 if name.startswith("z") else None)
        assert got == pytest.approx(sim.peak_activations), name  # the simulator agrees, independently
    # a wrong closed form shows up in the memory estimate
    monkeypatch.setattr(memory.stages, "peak_in_flight", lambda name, p, m, v=None: [1.0] * p)
    train = config.TrainConfig(pp=4, n_microbatches=8, pp_schedule="gpipe", seq_len=1024)
    assert memory.estimate(cfg, train, stage=0).in_flight == 1.0


def test_the_executor_checks_causality_with_the_schedules_own_dependencies(monkeypatch):
    import pandas as pd

    from mlsys_nb.pipeline import executor, schedule

    sched = schedule("1f1b", 2, 2)

    def run(order):  # (kind, microbatch, stage) in time order, one op per time unit, stage s on rank s
        rows = [(st, k, mb, 0, st, True, float(t), t + 1.0) for t, (k, mb, st) in enumerate(order)]
        tl = pd.DataFrame(rows, columns=["rank", "kind", "microbatch", "chunk", "stage", "full", "start", "end"])
        return executor.RealRun(sched, 0.0, 0.0, 0.0, tl)

    good = run([("F", 0, 0), ("F", 1, 0), ("F", 0, 1), ("B", 0, 1), ("F", 1, 1), ("B", 1, 1), ("B", 0, 0), ("B", 1, 0)])
    early = run(
        [("F", 0, 0), ("F", 1, 0), ("B", 0, 0), ("F", 0, 1), ("B", 0, 1), ("F", 1, 1), ("B", 1, 1), ("B", 1, 0)]
    )
    assert good.causal() and not early.causal()  # stage 0's B of micro-batch 0 before stage 1's
    monkeypatch.setattr(executor, "dependency", lambda *a: None)  # no dependencies: nothing is caught
    assert early.causal()


def test_presets_are_read_by_one_loader():
    src = "".join(p.read_text() for p in sorted((PKG / "memory").glob("*.py")))  # the memory/ package
    assert 'models.yaml")' not in src and "def _presets" not in src
    assert memory.presets() == list(config.model_presets())
    assert memory.preset("llama-3.1-8b") is config.load_model_preset("llama-3.1-8b")


def test_optimizer_names_are_the_config_names():
    from mlsys_nb.parallel import harness

    assert isinstance(config.OPTIMIZERS, tuple)
    assert not hasattr(harness, "OPTIMIZERS")
    for name in ("adamw", "adam", "sgd", "sgd-momentum"):
        assert name in config.OPTIMIZERS
        opt = harness.make_optimizer(name, [torch.nn.Parameter(torch.zeros(2))])
        assert isinstance(opt, torch.optim.Optimizer)
    assert harness.make_optimizer("sgd-momentum", [torch.nn.Parameter(torch.zeros(1))]).defaults["momentum"] == 0.9
    assert harness.make_optimizer("sgd", [torch.nn.Parameter(torch.zeros(1))]).defaults["momentum"] == 0
    with pytest.raises(ArgumentError, match="optimizer"):
        harness.make_optimizer("lion", [])


def test_readme_tree_lists_every_subpackage():
    readme = (ROOT / "README.md").read_text()
    for sub in sorted(p.name for p in PKG.iterdir() if (p / "__init__.py").exists()):
        assert f"{sub}/" in readme, f"README's 'How it is built' does not show mlsys_nb/{sub}/"


def test_every_dashboard_tab_follows_the_widget_protocol():
    from mlsys_nb.dashboard import TABS, Dashboard, check_widget
    from mlsys_nb.widgets.base import Widget

    dash = Dashboard()
    for spec in TABS:
        tab = dash.tabs[spec.key]
        assert isinstance(tab, Widget), spec.key
        seen = []
        tab.on_update(lambda seen=seen: seen.append(1))
        tab.set_state(spec.probe)
        assert seen == [1], f"{spec.key}: on_update callbacks must run once per set_state"

    class NoProtocol:
        widget = figure = error = None

    with pytest.raises(TypeError, match="on_update"):
        check_widget(NoProtocol(), "x")


TEMPLATE = ("compute", "rows", "headline", "draw")


def _template_problems(cls) -> list[str]:
    """How ``cls`` departs from the ControlPanel template: a missing one of TEMPLATE, or its own update()."""
    from mlsys_nb.widgets.base import ControlPanel

    problems = [
        f"{cls.__name__} does not implement {n}()" for n in TEMPLATE if getattr(cls, n) is getattr(ControlPanel, n)
    ]
    if cls.update is not ControlPanel.update:
        problems.append(f"{cls.__name__} overrides update()")
    return problems


def _control_panels() -> list[type]:
    """Every ControlPanel subclass defined in mlsys_nb.widgets (all its modules imported)."""
    import pkgutil

    import mlsys_nb.widgets as widgets
    from mlsys_nb.widgets.base import ControlPanel

    for info in pkgutil.iter_modules(widgets.__path__):
        importlib.import_module(f"mlsys_nb.widgets.{info.name}")
    found, todo = [], list(ControlPanel.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return [c for c in found if c.__module__.startswith("mlsys_nb.widgets.")]


def test_every_control_panel_follows_the_template():
    """Each calculator widget declares compute/rows/headline/draw and leaves update() to the base."""
    from mlsys_nb.widgets.base import ControlPanel
    from mlsys_nb.widgets.memory import MemoryWidget

    panels = _control_panels()
    names = {c.__name__ for c in panels}
    assert {"MemoryWidget", "ScalingWidget", "PipelineWidget", "PlannerWidget", "InferenceWidget"} <= names
    assert "RLHFSizingWidget" in names
    for cls in panels:
        assert not _template_problems(cls), _template_problems(cls)

    class OwnUpdate(MemoryWidget):  # the check fails when its idea is broken
        def update(self):
            pass

    class NoHeadline(ControlPanel):
        def compute(self, state):
            return state

        rows = draw = compute

    assert _template_problems(OwnUpdate) == ["OwnUpdate overrides update()"]
    assert _template_problems(NoHeadline) == ["NoHeadline does not implement headline()"]


def _toy_panel(errors=None):
    """A one-control ControlPanel whose compute validates ``n`` with ``check_int`` (ArgumentError)."""
    import ipywidgets as w
    import pandas as pd
    from matplotlib.figure import Figure

    from mlsys_nb.widgets.base import ControlPanel

    class Toy(ControlPanel):
        def __init__(self):
            figure = Figure(figsize=(2, 2))
            self._ax = figure.add_subplot()
            self._build({"n": w.IntText(value=2, description="n")}, figure, columns=(), label_width="40px")

        def compute(self, state):
            return {"n": check_int("n", state["n"], 1, 10)}

        def rows(self, r):
            return pd.DataFrame({"n": [r["n"]]})

        def headline(self, r):
            return f"n = {r['n']}"

        def draw(self, r):
            self._ax.clear()
            self._ax.bar([0], [r["n"]])

    if errors is not None:
        Toy.errors = errors
    return Toy()


def test_bad_input_is_shown_in_place_of_the_figure():
    """compute raising ArgumentError: its message (naming the parameter) replaces the figure, the
    table is empty; a valid value brings both back. A panel that does not catch it would raise."""
    from mlsys_nb.widgets.scaling import ScalingWidget

    toy = _toy_panel()
    assert toy.error is None and toy.table()["n"].tolist() == [2] and toy.stats.value == "n = 2"
    assert bytes(toy.image.value).startswith(b"\x89PNG") and toy.image.layout.display is None
    png = toy.image.value
    toy.set_state({"n": 0})
    assert toy.error == "n must be a whole number in [1, 10], got 0"
    assert "Invalid input:</b> n must be a whole number in [1, 10], got 0" in toy.message.value
    assert toy.image.layout.display == "none" and toy.table().empty and toy.stats.value == "" and toy.result is None
    toy.set_state({"n": 3})
    assert toy.error is None and toy.message.value == "" and toy.image.layout.display is None
    assert toy.table()["n"].tolist() == [3] and toy.image.value != png
    with pytest.raises(ArgumentError, match="n must be"):  # the template's catch is what shows it in place
        _toy_panel(errors=()).set_state({"n": 11})
    # a real widget whose calculator raises ArgumentError
    sw = ScalingWidget()
    with pytest.raises(ArgumentError, match="mfu"):
        sw.compute(sw.state() | {"mfu": 1.5})
    sw.set_state({"mfu": 1.5})
    assert sw.error.startswith("MFU must be") and sw.error in sw.message.value
    assert sw.image.layout.display == "none" and sw.table().empty


def test_a_key_error_is_shown_without_its_quotes():
    from mlsys_nb.widgets.base import error_text

    assert error_text(KeyError("law='x': choose one of ['a']")) == "law='x': choose one of ['a']"
    assert error_text(ValueError("choice must be one of ('a',), got 'b'")) == "choice must be one of ('a',), got 'b'"
