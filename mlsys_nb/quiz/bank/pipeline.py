"""Families on pipeline parallelism: bubble and activations for each schedule, bytes across stage boundaries.

Answer keys: ``mlsys_nb.pipeline.simulate`` (the event simulator, itself tested against the closed
forms and against real ranks); ``pipeline.boundary_bytes`` and ``pp_bytes_per_step`` (beside TP's
``parallel.tensor.tp_bytes_per_layer``, imported only when that family draws). Costs of the schedules: a
forward F = 1 and a full backward 2 (B = 1 input gradient + W = 1 weight gradient, the zero-bubble papers'
equal-cost setting), no communication latency.
"""

from __future__ import annotations

from ... import pipeline as pl
from ...config import PIPELINE_SCHEDULES, load_model_preset
from ..core import family
from ._util import numeric_family, pick, picks, ratio_family, tensor_parallel

SEC = "notebooks/08_pipeline_parallelism.ipynb"
SEC_BUBBLE = SEC + ", §1 Cutting a model into stages, and the bubble"
SEC_SCHEDULES = SEC + ", §4 1F1B and activation memory, §9 All schedules side by side"
REF = {
    "gpipe": "docs/references.md#gpipe (Huang et al. 2019, arXiv:1811.06965)",
    "1f1b": "docs/references.md#pipedream-flush (Narayanan et al. 2021, arXiv:2006.09503)",
    "interleaved-1f1b": "docs/references.md#megatron-ptdp (Narayanan et al. 2021, arXiv:2104.04473, §2.2)",
    "zb-h1": "docs/references.md#zero-bubble (Qi et al. 2024, arXiv:2401.10241)",
    "zb-h2": "docs/references.md#zero-bubble (Qi et al. 2024, arXiv:2401.10241)",
    "zbv": "docs/references.md#zero-bubble-v (Qi et al. 2024, arXiv:2405.15362)",
    "dualpipe": "docs/references.md#dualpipe (DeepSeek-AI 2024, arXiv:2412.19437, §3.2.1)",
    "dualpipev": "docs/references.md#dualpipe (DeepSeek-AI 2024, arXiv:2412.19437)",
}
SEC_INTERLEAVING = SEC + ", §5 Interleaving: v chunks per rank"
COSTS = "F = 1, B = 1 (input gradient), W = 1 (weight gradient; a full backward costs 2), no comm latency"


def pipeline_case(rng, name: str | None = None):
    """A valid (schedule, p, m, v) drawn from ``rng``."""
    name = name or pick(rng, list(pl.SCHEDULES))
    p = pick(rng, [2, 4, 8]) if name != "dualpipe" else pick(rng, [2, 4, 8])
    if name == "interleaved-1f1b":
        return name, p, p * pick(rng, [1, 2, 4]), pick(rng, [2, 3, 4])
    if name in ("zbv", "dualpipev"):
        return name, p, pick(rng, [2 * p, 3 * p, 4 * p]), 2
    if name == "dualpipe":
        return name, p, 2 * p * pick(rng, [1, 2, 3]), 2
    return name, p, pick(rng, [p, 2 * p, 4 * p, 8, 16, 32]), None


def sim(name, p, m, v):
    return pl.simulate(pl.schedule(name, p, m, v), F=1.0, B=1.0, W=1.0)


def _hints(name):
    h = {
        "gpipe": "All forwards then all backwards: the ramp costs (p−1)(F + B_full).",
        "1f1b": "Same bubble as GPipe, (p−1)(F + B_full); it only caps in-flight activations at p.",
        "interleaved-1f1b": "v chunks per rank divide the bubble time by v: (p−1)(F + B_full)/v.",
        "zb-h1": "Deferring W fills the cool-down: bubble (p−1)(F + B − W).",
        "zb-h2": "With m >= 2p−1 and F = B = W only the start-up (p−1)F remains.",
        "zbv": "V-shaped placement, two half-size chunks: bubble (p−1)F/2 once m >= 2p−1.",
        "dualpipe": "Bidirectional: (p/2 − 1)(F&B + B − 3W).",
        "dualpipev": "DualPipe folded into a V on p ranks: (p − 1)(F&B + B − 3W)/2.",
    }[name]
    return [h, "bubble_fraction = total idle / (p × makespan); makespan = busy + bubble time."]


def _v_text(name, v):
    return f", v = {v} chunks per rank" if name == "interleaved-1f1b" else ""


@family("pipeline.bubble_fraction", difficulty=2, section=SEC_BUBBLE, reference=REF["1f1b"])
def _bubble_fraction(rng):
    for _ in range(50):  # a zero bubble cannot be checked relatively: draw again
        name, p, m, v = pipeline_case(rng)
        r = sim(name, p, m, v)
        if r.bubble_fraction > 1e-9:
            break
    busy = r.busy[0]
    return dict(
        text=f"Schedule {name} on p = {p} stages with m = {m} micro-batches{_v_text(name, v)}; {COSTS}. "
        f"What fraction of the step are the ranks idle (bubble_fraction)?",
        params={"schedule": name, "p": p, "m": m, "v": v},
        answer=r.bubble_fraction,
        unit="fraction",
        hints=_hints(name),
        solution=[
            f"Each rank is busy m × (F + B + W) = {busy:g}.",
            f"Simulated makespan = {r.makespan:g}; idle per rank = {[round(x, 3) for x in r.idle]}.",
            f"bubble_fraction = Σ idle / (p × makespan) = {r.bubble_fraction:.4g} "
            "(pipeline.simulate(...).bubble_fraction).",
        ],
        diagnostics=[
            (
                r.bubble_ratio / r.bubble_fraction,
                "that is bubble/busy (bubble_ratio); the question asks idle / total time",
            )
        ],
    )


def _case(rng, name=None) -> dict:
    name, p, m, v = pipeline_case(rng, name)
    return {"schedule": name, "p": p, "m": m, "v": v}


def _sim(q):
    """``pipeline.simulate`` of the case ``q`` (F = B = W = 1)."""
    return sim(q["schedule"], q["p"], q["m"], q["v"])


def _setup(q) -> str:
    return f"{q['schedule']}, p = {q['p']}, m = {q['m']}{_v_text(q['schedule'], q['v'])}"


def _simulated_family(name: str, key, *, draw=_case, **words):
    """A question on ``pipeline.simulate`` of a drawn schedule; ``key`` reads the answer off its result."""
    numeric_family(
        family(name, section=SEC_BUBBLE, reference=REF["1f1b"]),
        draw=draw,
        calc=_sim,
        key=key,
        fields=lambda q, r: {"setup": _setup(q), "costs": COSTS},
        **words,
    )


_simulated_family(
    "pipeline.bubble_ratio",
    lambda r: r.bubble_ratio,
    draw=lambda rng: _case(rng, pick(rng, ["gpipe", "1f1b", "interleaved-1f1b"])),
    unit="ratio",
    text="{setup}; {costs}. Bubble time over busy time (the Megatron 'bubble ratio')?",
    hints=lambda q: _hints(q["schedule"])[:1] + ["1F1B: (p−1)/m; interleaved: (p−1)/(v·m)."],
    solution=["bubble_ratio = Σ idle / Σ busy = {result.bubble_ratio:.4g} (pipeline.simulate)."],
    diagnostics=lambda q, r: [(r.bubble_fraction / r.bubble_ratio, "that is the idle fraction of the whole step")],
)

_simulated_family(
    "pipeline.makespan",
    lambda r: r.makespan,
    unit="F units",
    text="{setup}; {costs}. How long is one step (makespan, in units of F)?",
    hints=lambda q: _hints(q["schedule"])[:1] + ["makespan = m(F + B + W) + bubble time."],
    solution=["Busy {result.busy[0]:g} + bubble {result.bubble_time:g} = {result.makespan:g} (pipeline.simulate)."],
)

PEAK_HINTS = {
    "gpipe": "GPipe runs all m forwards first.",
    "1f1b": "1F1B: min(p − r, m) on rank r.",
    "interleaved-1f1b": "Interleaved: p + (p−1)/v on rank 0 (in L/p-layer units).",
    "zb-h1": "ZB-H1 keeps 1F1B's in-flight count.",
    "zb-h2": "ZB-H2: 2p − 1 on rank 0.",
    "zbv": "ZBV: p once m >= 2p − 1 (two half-size chunks).",
}

for _n in (n for n in PIPELINE_SCHEDULES if not n.startswith("dualpipe")):
    numeric_family(
        family(
            f"pipeline.peak_activations_{_n.replace('-', '_')}", difficulty=2, section=SEC_SCHEDULES, reference=REF[_n]
        ),
        draw=lambda rng, name=_n: _case(rng, name),
        calc=_sim,
        key=lambda r: r.peak_activations[0],
        unit="micro-batches",
        fields=lambda p, result: {
            "chunks": _v_text(p["schedule"], p["v"]),
            "peak_hint": PEAK_HINTS.get(p["schedule"], "Simulate it."),
            "peaks": [round(x, 3) for x in result.peak_activations],
            "peak": result.peak_activations[0],
        },
        text=(
            "{schedule} on p = {p} stages, m = {m} micro-batches{chunks}: how many micro-batches' activations "
            "(each over L/p layers) does rank 0 hold at its peak?"
        ),
        hints=["Count forwards whose backward has not run yet.", "{peak_hint}"],
        solution=["Peak in flight per rank: {peaks} (pipeline.simulate(...).peak_activations).", "Rank 0: {peak:g}."],
    )


def _bubble_1f1b(p: int, m: int) -> float:
    """1F1B's bubble fraction with F = 1, B = 2 (``pipeline.closed_form``, what the simulator is tested against)."""
    bubble = pl.closed_form("1f1b", p, m, F=1.0, B=2.0)["bubble_time"]
    return bubble / (bubble + 3.0 * m)


def _fewest_microbatches(q) -> int:
    m = 1
    while _bubble_1f1b(q["p"], m) > q["target"]:
        m += 1
    return m


numeric_family(
    family("pipeline.min_microbatches", difficulty=2, section=SEC_BUBBLE, reference=REF["1f1b"]),
    draw=lambda rng: picks(rng, p=[2, 4, 8], target=[0.05, 0.1, 0.2, 0.25]),
    calc=_fewest_microbatches,
    unit="micro-batches",
    tolerance=0.0,
    fields=lambda p, result: {
        "costs": COSTS,
        "fraction": _bubble_1f1b(p["p"], result),
        "m1": result - 1,
        "fraction_before": _bubble_1f1b(p["p"], max(result - 1, 1)),
    },
    text=(
        "1F1B on p = {p} stages ({costs}): the smallest number of micro-batches m that brings the bubble "
        "fraction to at most {target:.0%}?"
    ),
    hints=["bubble_fraction = (p−1)/(m + p − 1) for 1F1B.", "Solve for m, round up."],
    solution=[
        (
            "Scanning m with pipeline.closed_form: m = {result} gives {fraction:.4g}, m = {m1} gives "
            "{fraction_before:.4g}."
        )
    ],
)


def _interleaved_case(rng):
    _, p, m, v = pipeline_case(rng, "interleaved-1f1b")
    return {"p": p, "m": m, "v": v}


ratio_family(
    family("pipeline.interleaving_gain", section=SEC_INTERLEAVING, reference=REF["interleaved-1f1b"]),
    draw=_interleaved_case,
    calc=lambda q, schedule, v: sim(schedule, q["p"], q["m"], v).bubble_time,
    over=dict(schedule="1f1b", v=None),
    under=lambda q: dict(schedule="interleaved-1f1b", v=q["v"]),
    fields=lambda p, over, under, ratio: {"costs": COSTS},
    text=(
        "p = {p}, m = {m}: by what factor does interleaved 1F1B with v = {v} chunks per rank shrink the "
        "bubble TIME of plain 1F1B? ({costs})"
    ),
    hints=["Each chunk is 1/v of the layers: the ramp is v times shorter.", "Cost: v× more P2P messages."],
    solution=["1F1B bubble {over:g}, interleaved {under:g} (pipeline.simulate).", "Ratio = {ratio:g}."],
)


@family("pipeline.best_schedule_for_memory", kind="choice", difficulty=2, section=SEC_SCHEDULES, reference=REF["1f1b"])
def _best(rng):
    p = pick(rng, [4, 8])
    m = pick(rng, [2 * p, 4 * p])
    peaks = {n: sim(n, p, m, None).peak_activations[0] for n in ("gpipe", "1f1b", "zb-h2")}
    bubbles = {n: sim(n, p, m, None).bubble_fraction for n in peaks}
    ans = min(peaks, key=lambda n: (peaks[n], bubbles[n]))
    return dict(
        text=f"p = {p}, m = {m}: which of GPipe, 1F1B, ZB-H2 holds the FEWEST in-flight activations on rank 0 "
        f"(ties broken by the smaller bubble)?",
        params={"p": p, "m": m},
        answer=ans,
        choices=sorted(peaks),
        hints=["GPipe holds all m; 1F1B at most p; ZB-H2 about 2p − 1."],
        solution=[f"{n}: peak {peaks[n]:g}, bubble {bubbles[n]:.3g}" for n in peaks] + [f"Answer: {ans}."],
    )


# ---- §10: bytes across stage boundaries (answer keys: pipeline.boundary_bytes, pp_bytes_per_step) ------
SEC_BOUNDARY = SEC + ", §10 Pipeline communication, measured"
REF_BOUNDARY = REF["interleaved-1f1b"] + ", #llama3"
MODELS = {"Llama-3.1-8B": "llama-3.1-8b", "Llama-3.1-70B": "llama-3.1-70b", "Llama-3.1-405B": "llama-3.1-405b"}


def _shape(model: str) -> dict:
    """Hidden size and layers of ``model`` (its preset in data/models.yaml)."""
    cfg = load_model_preset(MODELS[model])
    return {"hidden": cfg.hidden, "layers": cfg.n_layers}


def _boundary_case(rng) -> dict:
    p = picks(rng, model=list(MODELS), mbs=[1, 2, 4], seq_len=[2048, 4096, 8192], dtype=["bf16", "fp32"])
    return {**p, "hidden": _shape(p["model"])["hidden"]}


numeric_family(
    family("pipeline.boundary_bytes", section=SEC_BOUNDARY, reference=REF_BOUNDARY),
    draw=_boundary_case,
    calc=lambda q: pl.boundary_bytes(q["mbs"], q["seq_len"], q["hidden"], q["dtype"]),
    unit="bytes",
    text=(
        "{model} (hidden {hidden}) cut into pipeline stages; micro-batches of {mbs} sequence(s) of {seq_len} "
        "tokens, {dtype} activations: bytes one micro-batch sends across one stage boundary in the forward pass?"
    ),
    hints=["A stage hands on its output activations [mbs, seq, h]: one tensor, one point-to-point send."],
    solution=["{mbs} × {seq_len} × {hidden} × bytes({dtype}) = {result:.4g} B (pipeline.boundary_bytes)."],
    diagnostics=[(2.0, "one direction only: the gradient coming back in the backward is another send")],
)


def _rank_case(rng) -> dict:
    q = {**_boundary_case(rng), "dtype": "bf16", **picks(rng, p=[4, 8], m=[8, 16, 32], v=[1, 2])}
    q["rank"] = pick(rng, [0, 1, q["p"] - 1])
    return q


def _per_rank(q) -> list[float]:
    """Bytes each pipeline rank sends per step (``pipeline.pp_bytes_per_step``)."""
    return pl.pp_bytes_per_step(q["p"], q["m"], q["mbs"], q["seq_len"], q["hidden"], q["v"], q["dtype"])


def _sends_per_microbatch(q) -> int:
    """Messages rank ``q["rank"]`` sends per micro-batch (forward: not from the last stage; backward: not the first)."""
    return (q["v"] - (q["rank"] == q["p"] - 1)) + (q["v"] - (q["rank"] == 0))


def _chunks(q) -> str:
    return " (one stage per rank)" if q["v"] == 1 else f", interleaved: v = {q['v']} chunks per rank (stages r, r + p)"


numeric_family(
    family("pipeline.pp_bytes_per_rank", difficulty=2, section=SEC_BOUNDARY, reference=REF_BOUNDARY),
    draw=_rank_case,
    calc=lambda q: _per_rank(q)[q["rank"]],
    unit="bytes",
    text=lambda q: (
        f"{q['model']} (hidden {q['hidden']}) on p = {q['p']} pipeline ranks{_chunks(q)}; m = {q['m']} "
        f"micro-batches of {q['mbs']} sequence(s) of {q['seq_len']} tokens, bf16 activations. Bytes rank "
        f"{q['rank']} sends per step (activations forward and their gradients backward)?"
    ),
    hints=[
        "Every stage but the last sends each micro-batch's activations forward (mbs·seq·h·2 bytes).",
        "Every stage but the first sends their gradient backward: the same bytes.",
    ],
    solution=lambda q, result: [
        f"One message: {q['mbs']} × {q['seq_len']} × {q['hidden']} × 2 B = "
        f"{pl.boundary_bytes(q['mbs'], q['seq_len'], q['hidden']):.4g} B.",
        f"Rank {q['rank']} sends m × (v − [r = p−1] + v − [r = 0]) = {q['m']} × "
        f"{_sends_per_microbatch(q)} messages = {result:.4g} B.",
        f"Per rank: {', '.join(f'{b:.4g}' for b in _per_rank(q))} B (pipeline.pp_bytes_per_step).",
    ],
    diagnostics=[(0.5, "count both directions: the gradients come back through every boundary")],
)


def _tp_over_pp(q) -> float:
    """TP's bytes per rank per step (``parallel.tensor.tp_bytes_per_layer``, forward and backward, every layer,
    every micro-batch) over a middle PP rank's (``pipeline.pp_bytes_per_step``), each alone at degree ``d``."""
    tp = 2 * q["layers"] * q["m"] * tensor_parallel.tp_bytes_per_layer(1, q["seq_len"], q["hidden"], q["d"], sp=False)
    return tp / pl.pp_bytes_per_step(q["d"], q["m"], 1, q["seq_len"], q["hidden"])[1]


def _strategy_case(rng) -> dict:
    q = picks(rng, model=list(MODELS), d=[4, 8], m=[8, 16, 32], seq_len=[4096, 8192])
    return {**q, **_shape(q["model"])}


numeric_family(
    family("pipeline.tp_over_pp_bytes", difficulty=2, section=SEC_BOUNDARY, reference=REF_BOUNDARY + ", #megatron"),
    draw=_strategy_case,
    calc=_tp_over_pp,
    unit="ratio",
    fields=lambda q, result: {"d_minus_1": q["d"] - 1},
    text=(
        "{model} ({layers} layers, hidden {hidden}), m = {m} micro-batches of one {seq_len}-token sequence, bf16. "
        "Either TP alone at degree {d} (Megatron: two all-reduces of the activations per layer in the forward, "
        "two in the backward, ring) or PP alone on {d} stages: how many times more bytes per step does a TP rank "
        "send than a middle PP rank?"
    ),
    hints=["PP middle rank: 2·m boundary messages of s·h·2 bytes.", "TP: 4 ring all-reduces a layer a micro-batch."],
    solution=[
        "TP / PP = 2·L·m·2·2(d−1)/d·x / (2·m·x) = 4·L·(d−1)/d = 4 × {layers} × {d_minus_1}/{d} = {result:.4g} "
        "(parallel.tensor.tp_bytes_per_layer, pipeline.pp_bytes_per_step).",
        "Independent of m, s and h: why PP crosses nodes and TP stays inside one.",
    ],
    diagnostics=[(0.5, "TP all-reduces in the backward too: 4 per layer, not 2")],
)
