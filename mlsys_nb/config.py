"""Model configuration shared by the models, the calculators and the widgets.

One dataclass describes a transformer's shape. The same object builds the package's real small
PyTorch model (``mlsys_nb.models.Transformer``) and feeds the calculators (``mlsys_nb.memory``,
``mlsys_nb.flops``), so a preset's published shape can be instantiated small and measured.

Presets with published shapes and their sources live in ``data/models.yaml``
(``load_model_preset(name)``, ``model_presets()``). ``ModelConfig.param_count()`` is the one exact
parameter count (``ParamCount``); ``layer_params``, ``attention_params``, ``mlp_params``, ``norm_params``
are its per-layer terms, TP- and EP-sharded for ``mlsys_nb.memory``.

Also here, because every part of the kit uses them: the one argument validator (``check_int``,
``check_number``, ``check_seconds``, ``check_choice``, ``check_probability``, ``check_multiple``,
``check_divides``, ``check_power_of_two``, raising ``ArgumentError``, a ``ValueError``
naming the parameter and its allowed range) and the one dtype table (``DTYPE_BYTES``,
``dtype_bytes``, ``dtype_name``, ``torch_dtype``).
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
_ACTIVATIONS = ("swiglu", "gelu", "relu")
_NORMS = ("rmsnorm", "layernorm")


# ---- argument checks: the one validator of the kit --------------------------------------------
class ArgumentError(ValueError):
    """A bad argument: the message names the parameter, the allowed range and the value given.

    Raised by the checks below (``check_int``, ``check_number``, ``check_seconds``,
    ``check_choice``), which every entry point runs before any work starts (no rank process, no
    model); a ``ValueError``, so ``except ValueError`` catches it."""


def check_int(
    name: str, value, lo: int = 1, hi: int | None = None, *, error: type[ArgumentError] = ArgumentError
) -> int:
    """``value`` must be an int (not a bool) in ``[lo, hi]`` (``hi=None``: no upper bound).
    ``error``: ``ArgumentError`` or a subclass (e.g. ``mlsys_nb.pipeline.ScheduleError``)."""
    allowed = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Integral)
        or value < lo
        or (hi is not None and value > hi)
    ):
        raise error(f"{name} must be an int {allowed}, got {value!r}")
    return int(value)


def check_number(
    name: str,
    value,
    lo: float | None = None,
    hi: float | None = None,
    *,
    lo_open: bool = False,
    hi_open: bool = False,
    unit: str = "",
    error: type[ArgumentError] = ArgumentError,
) -> float:
    """``value`` must be a finite real number (not a bool) with ``lo <= value <= hi`` (``lo < value``
    when ``lo_open``, ``value < hi`` when ``hi_open``); ``None`` bounds are not checked. ``unit`` only
    words the message."""
    parts = [f"{'>' if lo_open else '>='} {lo:g}"] if lo is not None else []
    if hi is not None:
        parts.append(f"{'<' if hi_open else '<='} {hi:g}")
    ok = not isinstance(value, bool) and isinstance(value, numbers.Real) and math.isfinite(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        what = f"a finite number of {unit}" if unit else "a finite number"
        raise error(f"{name} must be {what} {' and '.join(parts)}, got {value!r}".replace("  ", " "))
    return float(value)


def check_seconds(name: str, value) -> float:
    """A duration in seconds, > 0."""
    return check_number(name, value, 0, lo_open=True, unit="seconds")


def check_choice(name: str, value, choices, *, error: type[ArgumentError] = ArgumentError):
    """``value`` must be one of ``choices`` (compared with ``==``)."""
    choices = tuple(choices)
    if value not in choices:
        raise error(f"{name}={value!r} is not allowed: {name} must be one of {choices}")
    return value


def check_probability(name: str, value, *, lo_open: bool = False, hi_open: bool = False) -> float:
    """A probability or fraction: a finite number in ``[0, 1]`` (``lo_open``: ``> 0``, ``hi_open``: ``< 1``)."""
    return check_number(name, value, 0.0, 1.0, lo_open=lo_open, hi_open=hi_open)


def check_multiple(name: str, value, of: int, of_name: str, *, error: type[ArgumentError] = ArgumentError) -> int:
    """``value`` must be an int >= 1 that is a multiple of ``of`` (the value of parameter ``of_name``),
    e.g. a batch that splits evenly over ``world_size`` ranks."""
    check_int(name, value, 1, error=error)
    if value % of:
        raise error(f"{name} must be a multiple of {of_name}={of} (an int >= 1), got {value!r}")
    return int(value)


def check_divides(name: str, value, total: int, total_name: str, *, error: type[ArgumentError] = ArgumentError) -> int:
    """``value`` must be an int >= 1 that divides ``total`` (the value of parameter ``total_name``),
    e.g. a tensor-parallel degree that divides the number of heads."""
    check_int(name, value, 1, error=error)
    if total % value:
        raise error(f"{name} must be an int >= 1 that divides {total_name}={total}, got {value!r}")
    return int(value)


def check_power_of_two(name: str, value, *, error: type[ArgumentError] = ArgumentError) -> int:
    """``value`` must be an int >= 1 that is a power of two (1, 2, 4, ...)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1 or value & (value - 1):
        raise error(f"{name} must be a power of two (1, 2, 4, ...), got {value!r}")
    return int(value)


# ---- number formats: the one table of dtype names and bytes --------------------------------------
# Bytes per element of each format the kit names. Every ``dtype=`` argument in the kit takes one of
# these names or a ``torch.dtype`` (``dtype_bytes``, ``dtype_name``, ``torch_dtype``).
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5}
# torch.dtype (by its name after "torch.") -> the table's name. tf32 is a matmul mode of fp32
# tensors, and int4 has no torch tensor dtype of its own, so neither is a torch name here.
_TORCH_NAMES = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float16": "fp16",
    "float8_e4m3fn": "fp8",
    "float8_e5m2": "fp8",
    "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "int8": "int8",
}
_TO_TORCH = {
    "fp32": "float32",
    "tf32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8": "float8_e4m3fn",
    "int8": "int8",
}


def dtype_name(dtype, name: str = "dtype") -> str:
    """The table name (``"bf16"``, ...) of ``dtype``: a name of ``DTYPE_BYTES`` or a ``torch.dtype``
    (``torch.bfloat16`` -> ``"bf16"``). ``name`` is the parameter named in the error."""
    if isinstance(dtype, str):
        return check_choice(name, dtype, DTYPE_BYTES)
    text = str(dtype)
    if type(dtype).__name__ == "dtype" and text.startswith("torch."):
        if text[6:] in _TORCH_NAMES:
            return _TORCH_NAMES[text[6:]]
        raise ArgumentError(
            f"{name}={text} has no entry in the dtype table: use one of "
            f"{tuple(DTYPE_BYTES)} or torch.{', torch.'.join(_TORCH_NAMES)}"
        )
    raise ArgumentError(f"{name} must be one of {tuple(DTYPE_BYTES)} or a torch.dtype, got {dtype!r}")


def dtype_bytes(dtype, name: str = "dtype") -> float:
    """Bytes per element of ``dtype`` (a name of ``DTYPE_BYTES`` or a ``torch.dtype``):
    fp32/tf32 4, bf16/fp16 2, fp8/int8 1, int4 0.5. ``name``: the parameter named in the error."""
    return DTYPE_BYTES[dtype_name(dtype, name)]


def torch_dtype(dtype):
    """The ``torch.dtype`` that stores ``dtype`` (tf32 -> float32, fp8 -> float8_e4m3fn); int4
    has none and raises ``ArgumentError``."""
    import torch

    key = dtype_name(dtype)
    if key not in _TO_TORCH:
        raise ArgumentError(f"dtype={key!r} has no torch tensor dtype: use one of {tuple(_TO_TORCH)}")
    return getattr(torch, _TO_TORCH[key])


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a decoder-only (Llama- or GPT-style) transformer.

    Sizes are counts (not bytes). ``ffn_hidden`` is the FFN inner width per branch (for SwiGLU the
    gate and up projections are each ``hidden x ffn_hidden``). MoE: ``n_experts > 0`` replaces
    every layer's MLP by ``n_experts`` routed experts of width ``expert_ffn_hidden`` (top-``top_k``
    routing) plus ``n_shared_experts`` always-on experts of the same width, and a router
    ``hidden x n_experts``; ``n_dense_layers`` first layers keep a dense MLP of width ``ffn_hidden``.
    """

    n_layers: int
    hidden: int
    n_heads: int
    vocab_size: int
    ffn_hidden: int | None = None  # default: 4*hidden (gelu/relu) or 8/3*hidden rounded (swiglu)
    n_kv_heads: int | None = None  # default: n_heads (MHA); 1 = MQA
    head_dim: int | None = None  # default: hidden // n_heads
    seq_len: int = 2048  # maximum context (RoPE table size); training s lives in TrainConfig
    tied_embeddings: bool = False
    activation: str = "swiglu"
    norm: str = "rmsnorm"
    bias: bool = False  # biases in linear layers (GPT-2/3 style)
    n_experts: int = 0
    top_k: int = 0
    expert_ffn_hidden: int | None = None
    n_shared_experts: int = 0
    n_dense_layers: int = 0
    dropout: float = 0.0
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5  # epsilon of every RMSNorm/LayerNorm (Llama checkpoints: 1e-5 or 1e-6)
    qkv_bias: bool = False  # biases on the q/k/v projections only (Qwen2); ``bias`` puts them everywhere
    name: str = ""
    source: str = field(default="", compare=False)
    # Multi-head latent attention (DeepSeek-V2/V3), counted by mlsys_nb.memory only (the small
    # Transformer builds ordinary attention): low-rank query/KV projections and a decoupled RoPE
    # key of width rope_head_dim; 0 = not MLA.
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    rope_head_dim: int = 0

    def __post_init__(self):
        check_int("n_layers", self.n_layers)
        check_int("hidden", self.hidden)
        check_int("n_heads", self.n_heads)
        check_int("vocab_size", self.vocab_size, 2)
        check_int("seq_len", self.seq_len)
        check_choice("activation", self.activation, _ACTIVATIONS)
        check_choice("norm", self.norm, _NORMS)
        if self.ffn_hidden is None:
            if self.activation == "swiglu":
                f = int(8 * self.hidden / 3)
                f = 8 * ((f + 7) // 8)
            else:
                f = 4 * self.hidden
            object.__setattr__(self, "ffn_hidden", f)
        check_int("ffn_hidden", self.ffn_hidden)
        if self.n_kv_heads is None:
            object.__setattr__(self, "n_kv_heads", self.n_heads)
        check_int("n_kv_heads", self.n_kv_heads, 1, self.n_heads)
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} must be divisible by n_kv_heads={self.n_kv_heads} (GQA groups)")
        if self.head_dim is None:
            if self.hidden % self.n_heads:
                raise ValueError(
                    f"hidden={self.hidden} is not divisible by n_heads={self.n_heads}: "
                    "pass head_dim explicitly or change one of them"
                )
            object.__setattr__(self, "head_dim", self.hidden // self.n_heads)
        check_int("head_dim", self.head_dim)
        check_int("n_experts", self.n_experts, 0)
        check_int("n_shared_experts", self.n_shared_experts, 0)
        check_int("n_dense_layers", self.n_dense_layers, 0, self.n_layers)
        if self.n_experts:
            check_int("top_k", self.top_k, 1, self.n_experts)
            if self.expert_ffn_hidden is None:
                object.__setattr__(self, "expert_ffn_hidden", self.ffn_hidden)
            check_int("expert_ffn_hidden", self.expert_ffn_hidden)
        for name in ("q_lora_rank", "kv_lora_rank", "rope_head_dim"):
            check_int(name, getattr(self, name), 0)
        check_number("norm_eps", self.norm_eps, 0.0, 1.0, lo_open=True)
        check_probability("dropout", self.dropout, hi_open=True)

    # ---- derived -------------------------------------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def q_dim(self) -> int:
        """Width of the concatenated query heads, n_heads * head_dim."""
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the concatenated key (or value) heads, n_kv_heads * head_dim."""
        return self.n_kv_heads * self.head_dim

    def param_count(self) -> ParamCount:
        """Exact parameter count (elements) as ``mlsys_nb.models.Transformer`` builds this shape (plus MLA for
        DeepSeek presets, which the small Transformer does not build): total, active per token, embedding,
        head, per layer. The one formula: ``memory.param_count`` and ``flops.parameter_count`` call it."""
        return _count_params(self)

    def replace(self, **changes) -> ModelConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def scaled_down(self, *, n_layers=2, hidden=64, n_heads=4, vocab_size=256, seq_len=64) -> ModelConfig:
        """The same architecture (activation, norm, GQA ratio, tying, MoE layout) at a small size,
        so a preset can be instantiated and measured on a laptop."""
        group = self.n_heads // self.n_kv_heads  # query heads per KV head, kept if it fits
        n_kv = n_heads // group if (group <= n_heads and n_heads % group == 0) else n_heads
        ratio = self.ffn_hidden / self.hidden
        changes = dict(
            n_layers=n_layers,
            hidden=hidden,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            head_dim=None,
            vocab_size=vocab_size,
            seq_len=seq_len,
            ffn_hidden=max(8, int(round(hidden * ratio))),
            n_dense_layers=min(self.n_dense_layers, n_layers),
        )
        if self.is_moe:
            changes.update(
                n_experts=min(self.n_experts, 8),
                top_k=min(self.top_k, min(self.n_experts, 8)),
                expert_ffn_hidden=max(8, int(round(hidden * self.expert_ffn_hidden / self.hidden))),
            )
        return self.replace(**changes)


# ---- parameter counts: one formula (ModelConfig.param_count; memory shards it per TP/PP/EP rank) -------------
@dataclass(frozen=True)
class ParamCount:
    """Exact parameter counts (elements). ``active``: used per token (MoE: top-k routed experts);
    ``embedding``/``head``: the vocabulary matrices (head 0 when tied); ``per_layer``: each layer."""

    total: int
    active: int
    embedding: int
    head: int
    per_layer: tuple = ()

    def __int__(self):
        return self.total

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.head


def norm_params(m: ModelConfig) -> int:
    """Parameters of one normalisation layer: the gain (``hidden``), plus the bias of a LayerNorm with biases."""
    return m.hidden * (2 if (m.norm == "layernorm" and m.bias) else 1)


def mlp_params(m: ModelConfig, width: int) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one MLP of this width."""
    mats = (3 if m.activation == "swiglu" else 2) * m.hidden * width
    if not m.bias:
        return mats, 0
    col_bias = (2 if m.activation == "swiglu" else 1) * width
    return mats + col_bias, m.hidden  # the row-parallel (down) bias is replicated


def attention_params(m: ModelConfig, tp: int = 1) -> tuple[float, int]:
    """(per-rank sharded part, replicated part) of one attention block under TP degree ``tp``."""
    h, a, d = m.hidden, m.n_heads, m.head_dim
    if m.kv_lora_rank:  # DeepSeek multi-head latent attention
        dr, qr, kvr = m.rope_head_dim, m.q_lora_rank, m.kv_lora_rank
        rep = (h * qr + qr if qr else 0) + h * (kvr + dr) + kvr
        q = (qr if qr else h) * a * (d + dr)
        shard = q + kvr * a * 2 * d + a * d * h
        return shard / tp, rep
    kv_heads_rank = m.n_kv_heads / tp if tp <= m.n_kv_heads else 1  # KV heads replicated past n_kv
    shard = h * m.q_dim / tp + 2 * h * d * kv_heads_rank + m.q_dim * h / tp
    rep = 0
    if m.bias or m.qkv_bias:
        shard += m.q_dim / tp + 2 * d * kv_heads_rank
    if m.bias:
        rep += h
    return shard, rep


def layer_kinds(m: ModelConfig, layers: range) -> dict[int, int]:
    """{representative layer index: how many layers of that kind} (dense-MLP vs MoE layers)."""
    out: dict[bool, list] = {}
    for i in layers:
        out.setdefault(m.is_moe and i >= m.n_dense_layers, [i, 0])[1] += 1
    return {i: n for i, n in out.values()}


def layer_params(m: ModelConfig, i: int, *, tp: int = 1, ep: int = 1, active: bool = False) -> dict:
    """Parameters of layer ``i`` held by one rank: ``dense`` (ZeRO over dp x cp) and ``expert``
    (ZeRO over dp x cp / ep)."""
    attn_shard, attn_rep = attention_params(m, tp)
    dense = attn_shard + attn_rep + 2 * norm_params(m)
    expert = 0.0
    if m.is_moe and i >= m.n_dense_layers:
        dense += m.hidden * m.n_experts  # router, replicated
        sh, rep = mlp_params(m, m.expert_ffn_hidden)
        dense += m.n_shared_experts * (sh / tp + rep)
        n_exp = m.top_k if active else m.n_experts / ep
        expert = n_exp * (sh / tp + rep)
    else:
        sh, rep = mlp_params(m, m.ffn_hidden)
        dense += sh / tp + rep
    return {"dense": dense, "expert": expert}


@lru_cache(maxsize=256)
def _count_params(model: ModelConfig) -> ParamCount:
    kinds = layer_kinds(model, range(model.n_layers))
    per = {i: layer_params(model, i) for i in kinds}
    per_active = {i: layer_params(model, i, active=True) for i in kinds}
    emb = model.vocab_size * model.hidden
    head = 0 if model.tied_embeddings else emb
    outside = emb + head + norm_params(model)
    total = outside + sum(n * (per[i]["dense"] + per[i]["expert"]) for i, n in kinds.items())
    active = outside + sum(n * (per_active[i]["dense"] + per_active[i]["expert"]) for i, n in kinds.items())
    kind_of = lambda j: max(i for i in kinds if i <= j) if model.is_moe else next(iter(kinds))  # noqa: E731
    layers = tuple(int(round(per[kind_of(j)]["dense"] + per[kind_of(j)]["expert"])) for j in range(model.n_layers))
    return ParamCount(int(round(total)), int(round(active)), emb, head, layers)


def load_yaml(name: str) -> dict:
    """Load ``data/<name>`` (YAML)."""
    import yaml

    path = DATA_DIR / name
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: the data file ships with the repository")
    with open(path) as f:
        return yaml.safe_load(f)


_MODEL_FIELDS = {f.name for f in dataclasses.fields(ModelConfig)}


@lru_cache(maxsize=1)
def _read_presets() -> dict[str, ModelConfig]:
    raw = load_yaml("models.yaml")["models"]
    out = {}
    for name, spec in raw.items():
        spec = {k: v for k, v in spec.items() if k in _MODEL_FIELDS}
        spec.setdefault("name", name)
        out[name] = ModelConfig(**spec)
    return out


def model_presets() -> dict[str, ModelConfig]:
    """All presets from ``data/models.yaml``, by name (read once; a fresh dict each call)."""
    return dict(_read_presets())


def load_model_preset(name: str) -> ModelConfig:
    """One preset from ``data/models.yaml``; the error lists the valid names."""
    presets = _read_presets()
    if name not in presets:
        raise KeyError(f"unknown model preset {name!r}: choose one of {sorted(presets)}")
    return presets[name]


def as_model_config(model) -> ModelConfig:
    """A ``ModelConfig`` from a preset name (``data/models.yaml``), a ``ModelConfig``, or a module carrying
    one as ``.cfg`` (the package's ``Transformer``). The one coercion every calculator uses."""
    if isinstance(model, ModelConfig):
        return model
    if isinstance(model, str):
        return load_model_preset(model)
    cfg = getattr(model, "cfg", None)
    if isinstance(cfg, ModelConfig):
        return cfg
    raise TypeError(f"model must be a preset name, a ModelConfig or a Transformer, got {type(model).__name__}")


# ---- training configuration (used by mlsys_nb.memory, .flops and the parallelism helpers) -------
PRECISIONS = ("fp32", "bf16-mixed", "bf16-nomaster", "fp8-te", "fp8-dsv3")
OPTIMIZERS = ("adam", "adamw", "sgd", "sgd-momentum", "adam-8bit")
RECOMPUTE = ("none", "selective", "full")
# every pipeline schedule the kit builds, the one list of their names (mlsys_nb.pipeline.SCHEDULES is this tuple)
PIPELINE_SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")
# those whose activation memory mlsys_nb.memory models (all but DualPipeV)
PP_SCHEDULES = tuple(s for s in PIPELINE_SCHEDULES if s != "dualpipev")
ZERO_LAYOUTS = ("flat", "units", "fsdp2")
KERNELS = ("fused", "eager")
DEVICES = ("cuda", "cpu")
FINETUNES = ("full", "lora", "qlora")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # QLoRA: all linear
OFFLOADS = ("none", "optimizer", "optimizer+params")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained on each GPU (everything ``mlsys_nb.memory.estimate`` needs).

    - ``micro_batch`` sequences of ``seq_len`` tokens per forward pass on one rank (before CP).
    - ``precision``: ``fp32``; ``bf16-mixed`` (bf16 params/grads/activations + fp32 master + fp32
      optimizer states, 16 B/param with Adam); ``bf16-nomaster`` (the Playbook plots' and the
      tutorial's 12 B/param accounting, incomplete); ``fp8-te`` (Transformer Engine: fp32 weights,
      grads and states, 16 B/param; not counted: Transformer Engine's fp8 weight copies, 1 B/param, 2 on Hopper;
      Megatron-Core's bf16 training holds 18 B/param); ``fp8-dsv3`` (DeepSeek-V3: fp8 weights, bf16 grads, fp32 master
      and accumulation, bf16 Adam moments, 15 B/param). ``fp32_grad_accum`` adds a 4 B/param fp32
      gradient-accumulation buffer (20 B/param with bf16-mixed Adam).
    - ``optimizer``: states per parameter (adam/adamw 2, sgd-momentum 1, sgd 0, adam-8bit 2 x 1 B);
      ``optimizer_bytes_per_param`` overrides the optimizer-state bytes (the ZeRO paper's K minus
      the master copy).
    - ``recompute``: none / selective (attention core) / full (store block inputs only).
      ``recompute_layers`` (with ``full``): recompute only this many layers of each pipeline stage and keep
      every activation of the others (Megatron-LM's ``--recompute-method block --recompute-num-layers``);
      None: every layer.
    - parallel degrees ``dp``, ``tp`` (``sp`` = sequence parallelism in the TP group), ``pp`` with
      ``pp_schedule`` and ``virtual_stages`` (``pp_layers``: layers per stage, default ⌊L/pp⌋ or
      ⌈L/pp⌉, see ``mlsys_nb.memory.stage_layers``; ``dualpipe``: each rank holds stages i and
      pp-1-i), ``cp``, ``ep``; ``n_microbatches`` per step per
      pipeline (gradient accumulation; default ``pp``); ``zero`` stage 0-3 over the dp x cp group.
    - ``zero_layout``: how ZeRO cuts the states into N shards, which decides the padding:
      ``flat`` (one flat buffer per stage, padded to a multiple of N: the textbook figure),
      ``units`` (this package's ``parallel.zero``: one flat buffer per unit, i.e. the embedding, each
      block, the final norm, the LM head, each padded to a multiple of N; below stage 3 the full
      parameters live in those padded buffers, and at stage 1 the gradients too), ``fsdp2``
      (PyTorch's ``fully_shard``: every parameter split along dim 0 into ⌈rows/N⌉-row shards).
      ``units`` and ``fsdp2`` are exact for tp = pp = ep = cp = 1 (what those implementations run);
      otherwise ``flat`` is used.
    - ``flash_attention``: no s^2 tensors are stored (q, k, v, output and a fp32 log-sum-exp).
    - ``kernels``: ``fused`` (GPU training stack: fused norms save input + rstd, GQA-aware attention,
      fused RoPE) or ``eager`` (this package's Transformer exactly as written, as measured on CPU).
    - ``device``: ``cuda`` (dropout masks 1 B/element) or ``cpu`` (masks in the activation dtype).
    - ``gpu``: name in ``data/hardware.yaml`` for the fits/OOM verdict; ``overhead_bytes``: CUDA
      context, allocator fragmentation etc. (default 0, typically 1-2 GB for the context).
    - ``finetune``: ``full`` (every parameter trains); ``lora`` (Hu et al. 2021, arXiv:2106.09685: the base
      frozen in the parameter dtype, rank-``lora_rank`` adapters on the blocks' linear layers named in
      ``lora_targets`` train, with gradients, optimizer states and master copies for them only); ``qlora``
      (Dettmers et al. 2023, arXiv:2305.14314: as ``lora``, with every linear weight of the blocks stored in
      NF4 with double quantization, blocks of ``qlora_group_size`` weights).
    - ``offload``: ``none``; ``optimizer`` (ZeRO-Offload, Ren et al. 2021, arXiv:2101.06840: the fp32 master,
      the optimizer states and the gradients live on the host, which runs the update; the accelerator keeps
      the parameters); ``optimizer+params`` (ZeRO-Infinity's CPU variant, Rajbhandari et al. 2021,
      arXiv:2104.07857: the parameters too, fetched layer by layer for forward and backward).
    """

    micro_batch: int = 1
    seq_len: int = 4096
    precision: str = "bf16-mixed"
    fp32_grad_accum: bool = False
    optimizer: str = "adam"
    optimizer_bytes_per_param: float | None = None
    recompute: str = "none"
    recompute_layers: int | None = None
    dp: int = 1
    tp: int = 1
    sp: bool = False
    pp: int = 1
    pp_schedule: str = "1f1b"
    virtual_stages: int = 1
    n_microbatches: int | None = None
    pp_layers: tuple | None = None  # layers per pipeline stage (a published uneven split); None: balanced
    cp: int = 1
    ep: int = 1
    zero: int = 0
    zero_layout: str = "flat"
    flash_attention: bool = True
    kernels: str = "fused"
    device: str = "cuda"
    vocab_parallel: bool = True
    gpu: str = "H100-SXM"
    overhead_bytes: float = 0.0
    finetune: str = "full"
    lora_rank: int = 64
    lora_targets: tuple = LORA_TARGETS
    qlora_group_size: int = 64
    offload: str = "none"

    def __post_init__(self):
        for name in ("micro_batch", "seq_len", "dp", "tp", "pp", "virtual_stages", "cp", "ep"):
            check_int(name, getattr(self, name))
        check_int("zero", self.zero, 0, 3)
        if self.n_microbatches is not None:
            check_int("n_microbatches", self.n_microbatches)
        if self.recompute_layers is not None:
            check_int("recompute_layers", self.recompute_layers)
            if self.recompute != "full":
                raise ArgumentError(
                    f"recompute_layers={self.recompute_layers} needs recompute='full', got {self.recompute!r}"
                )
        if self.pp_layers is not None:
            object.__setattr__(self, "pp_layers", tuple(int(x) for x in self.pp_layers))
            if len(self.pp_layers) != self.pp:
                raise ValueError(f"pp_layers={self.pp_layers}: need one layer count per stage (pp={self.pp})")
        for name, allowed in (
            ("precision", PRECISIONS),
            ("optimizer", OPTIMIZERS),
            ("recompute", RECOMPUTE),
            ("pp_schedule", PP_SCHEDULES),
            ("kernels", KERNELS),
            ("device", DEVICES),
            ("zero_layout", ZERO_LAYOUTS),
            ("finetune", FINETUNES),
            ("offload", OFFLOADS),
        ):
            check_choice(name, getattr(self, name), allowed)
        check_int("lora_rank", self.lora_rank)
        check_int("qlora_group_size", self.qlora_group_size)
        targets = (self.lora_targets,) if isinstance(self.lora_targets, str) else tuple(self.lora_targets)
        object.__setattr__(self, "lora_targets", targets)
        unknown = [x for x in targets if x not in LORA_TARGETS]
        if not targets or unknown:
            raise ArgumentError(f"lora_targets must be a non-empty subset of {LORA_TARGETS}, got {targets}")
        if self.sp and self.tp == 1:
            raise ValueError("sp=True needs tp > 1 (sequence parallelism lives inside the TP group)")
        if self.virtual_stages > 1 and self.pp_schedule != "interleaved-1f1b":
            raise ValueError(f"virtual_stages={self.virtual_stages} needs pp_schedule='interleaved-1f1b'")
        if self.optimizer_bytes_per_param is not None:
            check_number("optimizer_bytes_per_param", self.optimizer_bytes_per_param, 0.0, unit="bytes")
        check_number("overhead_bytes", self.overhead_bytes, 0.0, unit="bytes")

    @property
    def microbatches(self) -> int:
        """Micro-batches per optimizer step per pipeline (``n_microbatches`` or ``pp``)."""
        return self.n_microbatches if self.n_microbatches is not None else self.pp

    @property
    def world_size(self) -> int:
        """GPUs in the job: dp x tp x pp x cp (EP is carved out of dp x cp)."""
        return self.dp * self.tp * self.pp * self.cp

    def replace(self, **changes) -> TrainConfig:
        return dataclasses.replace(self, **changes)


# ---- the one small-model factory ----------------------------------------------------------------
_TINY_BASE = dict(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=64, seq_len=16)


def tiny_config(**overrides) -> ModelConfig:
    """A tiny Llama-style ``ModelConfig`` for tests, ranks and toy runs: by default 2 layers, hidden 32,
    4 query heads and 2 KV heads (GQA), SwiGLU width 64, vocabulary 64, context 16 tokens (22,688
    parameters; every ZeRO unit's size divides by 8).

    ``overrides``: any ``ModelConfig`` fields; ``ffn_hidden=None``, ``n_kv_heads=None`` or
    ``head_dim=None`` take ``ModelConfig``'s own defaults (8/3·hidden rounded up to a multiple of 8,
    MHA, hidden // n_heads). An unknown name raises ``ArgumentError`` listing the valid fields."""
    unknown = sorted(set(overrides) - _MODEL_FIELDS)
    if unknown:
        raise ArgumentError(
            f"tiny_config got unknown field(s) {unknown}: valid ModelConfig fields are {sorted(_MODEL_FIELDS)}"
        )
    return ModelConfig(**{**_TINY_BASE, **overrides})
