"""What the planner ranks: a ``Layout`` (one parallel configuration), its ``Plan`` (the modelled cost), and
``compare(a, b)``: which time component decides between two plans and where its formula comes from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import PP_SCHEDULES

COLUMNS = [
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero",
    "recompute",
    "recompute_layers",
    "micro_batch",
    "schedule",
    "v",
    "memory_bytes",
    "step_s",
    "mfu",
    "bottleneck",
]

SCHEDULES = tuple(s for s in PP_SCHEDULES if s not in ("zb-h2", "zbv"))  # the schedules bubble_ratio prices

_PLAIN = frozenset((int, str))


@dataclass(frozen=True)
class Layout:
    """One parallel configuration: degrees (``dp`` counts data-parallel replicas; ``ep`` is carved out
    of dp x cp), ZeRO stage, recomputation, sequences per micro-batch, pipeline schedule and chunks
    per rank ``v`` (``schedule="none"`` when pp = 1). ``recompute_layers`` (with ``recompute="full"``):
    layers of each pipeline stage that are recomputed, the others keep every activation (Megatron-LM's
    ``--recompute-method block``); 0: all of them."""

    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    recompute: str = "none"
    micro_batch: int = 1
    schedule: str = "1f1b"
    v: int = 1
    recompute_layers: int = 0

    def __post_init__(self):  # accept numpy scalars (a DataFrame row) as plain Python values
        if _PLAIN.issuperset(map(type, self.__dict__.values())):  # the common case (search builds ~10^5): C loop
            return
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if hasattr(v, "item") and not isinstance(v, (int, str)):
                object.__setattr__(self, name, v.item())

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass
class Plan:
    """A layout's modelled cost: ``memory`` (``mlsys_nb.memory.Breakdown`` of the heaviest stage,
    ``memory_bytes`` incl. overhead), ``time`` (seconds per step by component, summing to
    ``step_s``), ``mfu`` (model FLOPs / (GPUs x peak x step)), ``hfu`` (hardware FLOPs, i.e. with
    the recomputed forward, / (GPUs x peak x step), from the heaviest stage's FLOP ratio),
    ``bottleneck`` (a sentence)."""

    layout: Layout
    microbatches: int
    memory_bytes: float
    gpu_memory_bytes: float
    step_s: float
    mfu: float
    bottleneck: str
    time: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    memory: object = None
    hfu: float = float("nan")

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.gpu_memory_bytes

    def to_frame(self):
        """Time components (seconds and share of the step) of this plan."""
        import pandas as pd

        df = pd.DataFrame({"seconds": self.time}).rename_axis("component")
        df["share"] = df["seconds"] / self.step_s
        return df


def memory_schedule(schedule: str, v: int) -> dict:
    """The ``TrainConfig`` fields of a planner schedule: ``pp_schedule`` (pp = 1's ``"none"`` is 1F1B for
    ``mlsys_nb.memory``) and ``virtual_stages`` (``v`` for interleaved 1F1B, else 1)."""
    return dict(
        pp_schedule={"none": "1f1b"}.get(schedule, schedule),
        virtual_stages=v if schedule == "interleaved-1f1b" else 1,
    )


# where each time component's formula comes from (compare() names it with the deciding term)
TERM_SOURCES = {
    "compute": "matmul FLOPs of the heaviest stage (mlsys_nb.flops; Narayanan et al. 2021, arXiv:2104.04473, "
    "eq. 3 less recomputation) at the fitted matmul efficiency",
    "recompute": "Korthikanti et al. 2022, arXiv:2205.05198 (full recomputation re-runs the forward, "
    "selective the attention core)",
    "non-matmul": "Ivanov et al. 2021, arXiv:2007.00072 (normalisation and element-wise kernels are memory-bound); "
    "bytes fitted",
    "TP comm": "Korthikanti et al. 2022, arXiv:2205.05198 (sequence parallelism: all-gather + reduce-scatter per "
    "layer), alpha-beta ring costs (Thakur et al. 2005)",
    "CP comm": "Llama Team 2024, arXiv:2407.21783, §3.3.2 (all-gather of K and V per layer)",
    "EP comm": "DeepSeek-AI 2024, arXiv:2412.19437, §3.2 (dispatch and combine all-to-all, DualPipe overlap)",
    "PP comm": "Narayanan et al. 2021, arXiv:2104.04473 (one activation per stage boundary and micro-batch)",
    "bubble": "Narayanan et al. 2021, arXiv:2104.04473 (1F1B, interleaved); Qi et al. 2023, arXiv:2401.10241 "
    "(ZB-H1); DeepSeek-AI 2024, arXiv:2412.19437 (DualPipe)",
    "DP comm": "Patarasuk & Yuan 2009 (ring all-reduce); Rajbhandari et al. 2020, arXiv:1910.02054 (ZeRO)",
    "fixed per layer": "Narayanan et al. 2021, arXiv:2104.04473, §3.4 (a micro-batch's time does not scale with its "
    "size: throughput per GPU grows with it); seconds per layer fitted",
}


def compare(a: Plan, b: Plan):
    """Where the time goes in two plans: seconds per component of ``a`` and ``b``, ``b - a``, and in
    ``.attrs['decides']`` the component whose difference is largest in the direction of the total
    (the term by which the faster plan wins; ``.attrs['total']`` is b.step_s - a.step_s;
    ``.attrs['source']`` where that term's formula comes from, ``TERM_SOURCES``)."""
    import pandas as pd

    df = pd.DataFrame({"a": pd.Series(a.time), "b": pd.Series(b.time)}).fillna(0.0)
    df["b - a"] = df["b"] - df["a"]
    total = b.step_s - a.step_s
    sign = 1.0 if total >= 0 else -1.0
    decides = (sign * df["b - a"]).idxmax()
    df.attrs.update(decides=decides, total=total, source=TERM_SOURCES.get(decides))
    return df.rename_axis("component")
