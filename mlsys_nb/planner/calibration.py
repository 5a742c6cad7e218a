"""The fitted efficiencies of the step-time model (``Calibration``) and the published runs they are fitted
on (``data/published_runs.yaml``): ``fitted_calibration()``, ``published_runs()``, and the runs' goodput.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from .. import flops as _flops
from .. import hardware, memory
from ..config import ModelConfig, check_choice, check_number, check_probability
from .plan import Layout

_GENERATIONS = {"A100": "ampere", "H100": "hopper", "H800": "hopper", "H200": "hopper"}

PARAMS = ("eff_ampere", "eff_hopper", "attn_eff", "overlap", "elem_bytes", "layer_s")
# fitted by calibrate(); attn_eff is held at 1.0 (attention at the matmuls' efficiency): only one
# published run (Llama 3's 128K stage) is attention-heavy, so a fit cannot both use it and be checked on it
FITTED = ("eff_ampere", "eff_hopper", "overlap", "elem_bytes", "layer_s")

FIXED = {"attn_eff": 1.0}
# (low, high) of each fitted parameter, with its physical meaning (see Calibration)
BOUNDS = {
    "eff_ampere": (0.3, 1.0),
    "eff_hopper": (0.3, 1.0),
    "attn_eff": (0.2, 1.0),
    "overlap": (0.0, 1.0),
    "elem_bytes": (0.0, 400.0),
    "layer_s": (0.0, 2e-3),
}


@lru_cache(maxsize=64)
def generation(gpu: str) -> str:
    """GPU generation whose matmul efficiency is fitted ('ampere' for A100, 'hopper' for H100/H800/H200)."""
    for prefix, gen in _GENERATIONS.items():
        if gpu.startswith(prefix):
            return gen
    raise ValueError(
        f"gpu={gpu!r}: no published run of its generation to fit a matmul efficiency on "
        f"(fitted: {sorted(set(_GENERATIONS.values()))}); pass calibration=None (datasheet peak) "
        "or a Calibration naming its efficiency"
    )


@dataclass(frozen=True)
class Calibration:
    """Efficiency parameters of the step-time model, each with a physical meaning and a range (``BOUNDS``):

    - ``eff_ampere``, ``eff_hopper``: achievable fraction of the datasheet dense peak for the
      transformer's matmuls on A100 / H100-class GPUs (a large BF16 GEMM reaches about 0.7-0.8);
    - ``attn_eff``: the attention kernel's (FlashAttention: scores + values) throughput relative to
      those matmuls (FlashAttention-2 reports about 50-70 % of peak forward+backward on A100, less
      than a GEMM: Dao 2023, arXiv:2307.08691);
    - ``overlap``: fraction of TP/CP/EP traffic hidden behind compute (0: none);
    - ``elem_bytes``: bytes moved at HBM bandwidth per token per hidden unit per layer by the
      non-matmul kernels (norms, residuals, activations, dropout), forward + backward;
    - ``layer_s``: seconds per layer and micro-batch, forward + backward, that do not scale with the
      micro-batch's tokens (kernel launches and tails, synchronisation between a layer's kernels and
      collectives; the fit also puts here the lower efficiency of narrow per-rank GEMMs of small models): why
      throughput per GPU grows with the micro-batch size (Narayanan et al. 2021, arXiv:2104.04473, §3.4).

    ``dp_overlap`` (DP traffic hidden behind backward) stays an assumption of ``search``
    (default 0.8), not fitted. ``calibrate()`` fits these on ``data/published_runs.yaml``."""

    eff_ampere: float
    eff_hopper: float
    attn_eff: float
    overlap: float
    elem_bytes: float
    layer_s: float = 0.0

    def __post_init__(self):
        for k in PARAMS:
            lo, hi = BOUNDS[k]
            check_number(k, getattr(self, k), lo, hi)

    def efficiency(self, gpu: str) -> float:
        return getattr(self, f"eff_{generation(gpu)}")

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, k) for k in PARAMS)


def _runs_file():
    """``data/published_runs.yaml``: the runs, the stored calibration and the goodput table."""
    from pathlib import Path

    return Path(__file__).resolve().parent.parent.parent / "data" / "published_runs.yaml"


@lru_cache(maxsize=1)
def _runs_raw() -> dict:
    """``data/published_runs.yaml`` as read (once)."""
    import yaml

    return yaml.safe_load(_runs_file().read_text())


@lru_cache(maxsize=1)
def fitted_calibration() -> Calibration:
    """The calibration stored in ``data/published_runs.yaml`` (key ``calibration``), written from
    ``calibrate()`` on every run with role 'fit' (tests/test_planner.py checks it is that fit)."""
    return Calibration(**{k: float(v) for k, v in _runs_raw()["calibration"].items() if k in PARAMS})


def published_runs(role: str | None = None) -> list[dict]:
    """The runs of ``data/published_runs.yaml`` (``role``: 'fit', 'check' or None for all), each with
    ``config`` (a ModelConfig), ``setup`` (keywords of ``evaluate``/``search``), ``layout`` (a Layout),
    ``reported_step_s`` (seconds per step implied by the reported throughput and the FLOPs the paper
    counts; None where no throughput is reported) and ``reported_mfu`` (this kit's model FLOPs over
    GPUs x BF16 peak x that step)."""
    out = []
    for raw in _runs_raw()["runs"]:
        if role is not None and raw["role"] != role:
            continue
        r = dict(raw)
        if "shape" in r:
            cfg = ModelConfig(**r["shape"], name=r["name"])
        else:
            cfg = memory.preset(r["model"])
        tokens = r["global_batch"] * r["seq_len"]
        setup = dict(gpus=r["gpus"], gpu=r["gpu"], global_batch_tokens=tokens, seq_len=r["seq_len"])
        setup.update(network=r["network"], **r.get("options", {}))
        lay = Layout(**r["layout"])
        rep, g = r["reported"], hardware.gpu(r["gpu"])
        model_flops = _flops.flops_per_token(cfg, r["seq_len"], causal=True) * tokens
        step = None
        if "step_s" in rep:
            step = float(rep["step_s"])
        elif r["counts"] == "megatron-eq3":
            B, s_, L, h, V = r["global_batch"], r["seq_len"], cfg.n_layers, cfg.hidden, cfg.vocab_size
            F = 96 * B * s_ * L * h**2 * (1 + s_ / (6 * h) + V / (16 * L * h))  # Narayanan et al. 2021, eq. 3
            step = F / (r["gpus"] * rep["tflops_per_gpu"] * 1e12)
        elif r["counts"] == "package-model":
            step = model_flops / (r["gpus"] * rep["tflops_per_gpu"] * 1e12)
        r.update(config=cfg, setup=setup, layout=lay, reported_step_s=step)
        r["reported_mfu"] = model_flops / (r["gpus"] * g.peak("bf16") * step) if step else None
        out.append(r)
    return out


def effective_training_time(run: str = "llama3-405b") -> tuple[float, str]:
    """(fraction of wall-clock time spent training, source) of a published run (``goodput`` in
    ``data/published_runs.yaml``; Llama 3: 'higher than 90 %', a lower bound)."""
    table = _runs_raw()["goodput"]
    check_choice("run", run, list(table))
    return float(table[run]["effective_training_time"]), table[run]["source"]


def goodput_mfu(mfu: float, effective_time: float) -> float:
    """MFU over the wall-clock time of a run, failures and restarts included: ``mfu`` (while training)
    x ``effective_time`` (the fraction of the time spent training; Llama 3 reports > 0.90 over a 54-day
    snapshot, arXiv:2407.21783 §3.3.4)."""
    check_probability("mfu", mfu)
    check_probability("effective_time", effective_time)
    return mfu * effective_time
