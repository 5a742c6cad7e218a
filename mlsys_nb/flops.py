"""FLOPs of a transformer, MFU/HFU, and training time and cost.

Units: a *FLOP count* is a number of floating-point operations ("FLOPs"); a *rate* is FLOP/s.
One multiply-accumulate = 2 FLOPs, so a matmul ``[m, k] @ [k, n]`` costs ``2 m n k`` FLOPs
(Kaplan et al. 2020, arXiv:2001.08361, §2.1; Chowdhery et al. 2022, arXiv:2204.02311, App. B).

Exact per-token count (``breakdown``), per layer, forward, with ``a`` query heads, ``n_kv`` KV heads
of width ``d_h``, hidden ``h``, FFN width ``f`` and sequence length ``s``:

- ``qkv``: ``2 h (a d_h + 2 n_kv d_h)`` (GQA: K and V are narrower; DeepSeek MLA presets: 2 x the
  low-rank query/KV projection weights, and the scores use ``a (d_h + d_rope)``)
- ``attn_scores``: ``2 a d_h s_eff`` (Q K^T)
- ``attn_values``: ``2 a d_h s_eff`` (probabilities x V)
- ``out_proj``: ``2 a d_h h``
- ``mlp``: ``2 h f x (3 if SwiGLU else 2)`` (MoE: router ``2 h E`` + top_k routed + shared experts)
- ``lm_head``: ``2 h V`` (once, not per layer)

``s_eff = s`` for the full (non-causal) score matrix. With ``causal=True`` only the ``s (s + 1) / 2``
query-key pairs a causal mask keeps are counted, ``s_eff = (s + 1) / 2`` on average: that is what a
fused causal kernel (FlashAttention) can skip to. FlashAttention's own benchmark uses ``s / 2``;
the two differ by ``1 / s``. The package's ``attn_impl="matmul"`` path computes the full ``s x s``
scores and then masks them, so ``FlopCounterMode`` sees the **non-causal** count (tested exactly).

Backward costs twice the forward for every matmul (gradient w.r.t. the input and w.r.t. the
weight, or w.r.t. both operands of ``Q K^T`` and ``P V``), so training = 3 x forward. Element-wise
work (norms, softmax, activations, RoPE, biases, the loss) is not counted: it is O(h) per token
and ``FlopCounterMode`` does not count it either. Embedding lookups cost 0 FLOPs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .config import ModelConfig, as_model_config, check_choice, check_int, check_number, dtype_name


COMPONENTS = ("qkv", "attn_scores", "attn_values", "out_proj", "mlp", "lm_head")
SECONDS_PER_DAY = 86400.0
PF_DAY = 1e15 * SECONDS_PER_DAY  # FLOPs in one petaflop/s-day (Kaplan et al. unit)


# ---- helpers ---------------------------------------------------------------------------------
def _check_seq_len(seq_len) -> int:
    return check_int("seq_len (tokens)", seq_len, 1)


def _check_positive(name: str, value, hi: float | None = None) -> float:
    return check_number(name, value, 0, hi, lo_open=True)


def parameter_count(model, *, exclude_embedding: bool = False, active: bool = True) -> float:
    """Parameters of ``model`` (a ModelConfig, a module with ``.cfg``, or a number = N itself).

    ``exclude_embedding`` drops the embedding table and an untied LM head (Kaplan's N).
    ``active`` (MoE only) counts the experts a token actually uses (top_k routed + shared),
    which is what enters ``6N``. The counts come from ``ModelConfig.param_count`` (as ``memory.param_count``'s)."""
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return _check_positive("model (parameter count)", model)
    pc = as_model_config(model).param_count()
    n = pc.active if active else pc.total
    return float(n - (pc.embedding + pc.head if exclude_embedding else 0))


# ---- exact per-token FLOPs -----------------------------------------------------------------------
@dataclass(frozen=True)
class FlopBreakdown:
    """Exact matmul FLOPs per token, per component, summed over layers.

    ``forward[c]`` is the forward cost of component ``c`` (FLOPs per token); the training cost of a
    component is ``3 * forward[c]`` (backward = 2 x forward)."""

    seq_len: int
    causal: bool
    forward: dict = field(default_factory=dict)

    @property
    def forward_total(self) -> float:
        """Forward FLOPs per token."""
        return float(sum(self.forward.values()))

    @property
    def backward_total(self) -> float:
        """Backward FLOPs per token (2 x forward)."""
        return 2.0 * self.forward_total

    def total(self, backward: bool = True) -> float:
        """FLOPs per token: forward, plus backward when ``backward``."""
        return self.forward_total * (3.0 if backward else 1.0)

    def to_frame(self):
        import pandas as pd

        rows = [
            {"component": c, "forward FLOPs/token": v, "fwd+bwd FLOPs/token": 3 * v, "share": v / self.forward_total}
            for c, v in self.forward.items()
        ]
        rows.append(
            {
                "component": "total",
                "forward FLOPs/token": self.forward_total,
                "fwd+bwd FLOPs/token": 3 * self.forward_total,
                "share": 1.0,
            }
        )
        return pd.DataFrame(rows).set_index("component")


def mlp_forward_flops(cfg: ModelConfig, width: int) -> float:
    """Forward FLOPs per token of one MLP of inner ``width`` (2 FLOPs per multiply-add; SwiGLU has 3 matrices)."""
    return 2.0 * cfg.hidden * width * (3 if cfg.activation == "swiglu" else 2)


def breakdown(model, seq_len: int, *, causal: bool = True) -> FlopBreakdown:
    """Per-component forward FLOPs per token (see the module docstring for each formula)."""
    cfg = as_model_config(model)
    s = _check_seq_len(seq_len)
    h, L = cfg.hidden, cfg.n_layers
    s_eff = (s + 1) / 2.0 if causal else float(s)
    dense_mlp = mlp_forward_flops(cfg, cfg.ffn_hidden)
    if cfg.is_moe:
        moe_layers = L - cfg.n_dense_layers
        expert = mlp_forward_flops(cfg, cfg.expert_ffn_hidden)
        moe_mlp = 2.0 * h * cfg.n_experts + (cfg.top_k + cfg.n_shared_experts) * expert
        mlp = cfg.n_dense_layers * dense_mlp + moe_layers * moe_mlp
    else:
        mlp = L * dense_mlp
    if cfg.kv_lora_rank:  # DeepSeek MLA (as mlsys_nb.memory counts it): low-rank q and kv paths
        a, d, dr, qr, kvr = cfg.n_heads, cfg.head_dim, cfg.rope_head_dim, cfg.q_lora_rank, cfg.kv_lora_rank
        q_path = (h * qr + qr * a * (d + dr)) if qr else h * a * (d + dr)
        qkv = q_path + h * (kvr + dr) + kvr * a * 2 * d
        score_w = a * (d + dr)  # queries and keys carry the decoupled RoPE part
    else:
        qkv, score_w = h * (cfg.q_dim + 2 * cfg.kv_dim), cfg.q_dim
    fwd = {
        "qkv": L * 2.0 * qkv,
        "attn_scores": L * 2.0 * score_w * s_eff,
        "attn_values": L * 2.0 * cfg.q_dim * s_eff,
        "out_proj": L * 2.0 * cfg.q_dim * h,
        "mlp": mlp,
        "lm_head": 2.0 * h * cfg.vocab_size,
    }
    return FlopBreakdown(seq_len=s, causal=bool(causal), forward=fwd)


def flops_per_token(model, seq_len: int, *, backward: bool = True, causal: bool = True) -> float:
    """Exact matmul FLOPs per token of ``model`` at sequence length ``seq_len`` (tokens).

    Forward only, or forward + backward (= 3 x forward) when ``backward``. ``causal=True`` counts
    only the query-key pairs a causal mask keeps; ``causal=False`` the full ``s x s`` scores (what
    the explicit-matmul attention executes and ``FlopCounterMode`` counts).
    Per-component numbers: ``breakdown(model, seq_len, causal=...)``."""
    return breakdown(model, seq_len, causal=causal).total(backward)


def hardware_flops_per_token(
    model, seq_len: int, *, recompute: str = "none", causal: bool = True, early_stop: bool = True
) -> float:
    """FLOPs per token actually executed in a training step, counting recomputation (for HFU).

    Textbook accounting (``early_stop=False``): ``recompute="full"`` re-runs every block's forward
    in backward (not the LM head, which ``Transformer(recompute="full")`` does not checkpoint);
    ``"selective"`` re-runs the attention core (scores and values).

    PyTorch's non-reentrant ``torch.utils.checkpoint`` (the default, ``early_stop=True``) stops
    recomputing as soon as every tensor backward needs has been regenerated, so the *last* matmul
    of a checkpointed region is not redone: the MLP down projection for a full block (dense
    models), the probabilities x V product for the attention core. ``FlopCounterMode`` confirms
    this count exactly (tests/test_flops.py)."""
    check_choice("recompute", recompute, ("none", "selective", "full"))
    cfg = as_model_config(model)
    b = breakdown(cfg, seq_len, causal=causal)
    if recompute == "none":
        extra = 0.0
    elif recompute == "selective":
        extra = b.forward["attn_scores"] + (0.0 if early_stop else b.forward["attn_values"])
    else:  # "full"
        extra = b.forward_total - b.forward["lm_head"]
        if early_stop and not cfg.is_moe:
            width = cfg.ffn_hidden
            extra -= cfg.n_layers * 2.0 * width * cfg.hidden  # down projection not recomputed
    return b.total(True) + extra


# ---- the usual approximations -----------------------------------------------------------------
def six_n(model, *, exclude_embedding: bool = False) -> float:
    """The ``6N`` approximation of training FLOPs per token (N = active parameters)."""
    return 6.0 * parameter_count(model, exclude_embedding=exclude_embedding)


def six_n_attention(model, seq_len: int, *, exclude_embedding: bool = False) -> float:
    """PaLM's ``6N + 12 L (a d_h) s`` training FLOPs per token (non-causal attention term)."""
    cfg = as_model_config(model)
    return six_n(cfg, exclude_embedding=exclude_embedding) + 12.0 * cfg.n_layers * cfg.q_dim * _check_seq_len(seq_len)


def approximation_table(model, seq_len: int, *, causal: bool = False):
    """Exact training FLOPs per token next to ``6N`` (total and non-embedding N) and
    ``6N + 12 L h s``, with each approximation's relative error (``approx / exact - 1``)."""
    import pandas as pd

    exact = flops_per_token(model, seq_len, backward=True, causal=causal)
    rows = {
        "exact (this module)": exact,
        "6N (N = all parameters)": six_n(model),
        "6N (N = non-embedding)": six_n(model, exclude_embedding=True),
        "6N + 12·L·h·s (all parameters)": six_n_attention(model, seq_len),
    }
    return pd.DataFrame(
        [{"method": k, "FLOPs/token (fwd+bwd)": v, "relative error": v / exact - 1.0} for k, v in rows.items()]
    ).set_index("method")


def count_flops(model, tokens, *, backward: bool = True) -> dict:
    """FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` for one forward (and backward)
    of ``model`` on ``tokens`` [batch, seq]: ``{"forward": ..., "backward": ..., "total": ...}``.

    Give the package's Transformer ``attn_impl="matmul"``: SDPA counts 0 FLOPs on CPU."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as fwd_counter:
        loss = model(tokens, tokens) if backward else model(tokens)
    out = {"forward": float(fwd_counter.get_total_flops()), "backward": 0.0}
    if backward:
        with FlopCounterMode(display=False) as bwd_counter:
            loss.backward()
        out["backward"] = float(bwd_counter.get_total_flops())
        model.zero_grad(set_to_none=True)
    out["total"] = out["forward"] + out["backward"]
    return out


# ---- MFU / HFU ---------------------------------------------------------------------------------
def _peak(gpu, dtype) -> float:
    """Peak FLOP/s per device: a number, or a GPU name from data/hardware.yaml (a unique prefix
    such as ``"A100-80GB"`` for ``"A100-80GB-SXM"`` is accepted) at ``dtype`` (a name of
    ``mlsys_nb.config.DTYPE_BYTES`` or a ``torch.dtype``)."""
    dtype = dtype_name(dtype)
    if isinstance(gpu, (int, float)) and not isinstance(gpu, bool):
        return _check_positive("gpu (peak FLOP/s)", gpu)
    from . import hardware

    table = hardware.gpus()
    if gpu not in table:
        matches = [n for n in table if n.startswith(str(gpu))]
        if len(matches) != 1:
            raise KeyError(f"unknown GPU {gpu!r}: choose one of {sorted(table)} or pass a peak FLOP/s number")
        gpu = matches[0]
    return table[gpu].peak(dtype)


def mfu(
    model,
    tokens_per_s: float,
    *,
    seq_len: int | None = None,
    gpu,
    n_gpus: int = 1,
    dtype="bf16",
    causal: bool = True,
    per_token_flops: float | None = None,
) -> float:
    """Model FLOPs utilisation = tokens/s x model FLOPs per token / (n_gpus x peak FLOP/s).

    Model FLOPs exclude recomputation. ``model`` may be a number N (then ``6N`` is used), or pass
    ``per_token_flops`` to use your own accounting."""
    tps = _check_positive("tokens_per_s", tokens_per_s)
    n = _check_positive("n_gpus", n_gpus)
    if per_token_flops is None:
        per_token_flops = _training_flops_per_token(model, seq_len, causal)
    return tps * per_token_flops / (n * _peak(gpu, dtype))


def hfu(
    model,
    tokens_per_s: float,
    *,
    seq_len: int | None = None,
    gpu,
    n_gpus: int = 1,
    dtype="bf16",
    recompute: str = "none",
    causal: bool = True,
) -> float:
    """Hardware FLOPs utilisation: like ``mfu`` but counting recomputed forwards."""
    cfg = as_model_config(model)
    per_tok = hardware_flops_per_token(cfg, seq_len or cfg.seq_len, recompute=recompute, causal=causal)
    return mfu(model, tokens_per_s, gpu=gpu, n_gpus=n_gpus, dtype=dtype, per_token_flops=per_tok)


# ---- training FLOPs, time, cost ----------------------------------------------------------------
def _training_flops_per_token(model, seq_len, causal) -> float:
    if isinstance(model, (int, float)) and not isinstance(model, bool):
        return 6.0 * _check_positive("model (parameter count)", model)
    cfg = as_model_config(model)
    return flops_per_token(cfg, seq_len or cfg.seq_len, backward=True, causal=causal)


def training_flops(model, tokens: float, *, seq_len: int | None = None, causal: bool = True) -> float:
    """Training FLOPs (a count, not a rate) for ``tokens`` tokens.

    ``model`` a ModelConfig/module (exact count at ``seq_len``, default ``cfg.seq_len``) or a
    parameter count N (then ``6 N D``)."""
    return _training_flops_per_token(model, seq_len, causal) * _check_positive("tokens", tokens)


@dataclass(frozen=True)
class TrainingEstimate:
    """Time and cost of a training run under perfect scaling.

    ``flops`` (FLOPs), ``peak_flops_per_s`` (FLOP/s per GPU), ``mfu`` (fraction), ``seconds``
    (wall-clock), ``gpu_hours`` (= seconds x n_gpus / 3600), ``cost_usd`` (None without a price)."""

    flops: float
    tokens: float
    n_gpus: int
    peak_flops_per_s: float
    mfu: float
    seconds: float
    price_per_gpu_hour: float | None = None

    @property
    def days(self) -> float:
        return self.seconds / SECONDS_PER_DAY

    @property
    def gpu_hours(self) -> float:
        return self.seconds * self.n_gpus / 3600.0

    @property
    def achieved_flops_per_s(self) -> float:
        """Cluster-wide achieved FLOP/s (n_gpus x peak x MFU)."""
        return self.n_gpus * self.peak_flops_per_s * self.mfu

    @property
    def cost_usd(self) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours * self.price_per_gpu_hour

    def __float__(self) -> float:
        return self.seconds

    def to_frame(self):
        import pandas as pd

        rows = [
            ("training compute", self.flops, "FLOPs"),
            ("tokens", self.tokens, "tokens"),
            ("GPUs", self.n_gpus, "devices"),
            ("peak per GPU", self.peak_flops_per_s, "FLOP/s"),
            ("MFU", self.mfu, "fraction"),
            ("achieved (cluster)", self.achieved_flops_per_s, "FLOP/s"),
            ("wall-clock", self.days, "days"),
            ("GPU-hours", self.gpu_hours, "GPU·h"),
        ]
        if self.cost_usd is not None:
            rows.append(("cost", self.cost_usd, "USD"))
        return pd.DataFrame(rows, columns=["quantity", "value", "unit"]).set_index("quantity")


def training_time(
    model,
    tokens: float,
    *,
    gpu,
    n_gpus: int,
    mfu: float,
    dtype="bf16",
    seq_len: int | None = None,
    causal: bool = True,
    price_per_gpu_hour: float | None = None,
) -> TrainingEstimate:
    """``T = C / (n_gpus x peak x MFU)`` seconds for ``C = training_flops(model, tokens)``.

    ``gpu``: a name from ``data/hardware.yaml`` (``"H100-SXM"``, ``"A100-80GB"`` as a unique
    prefix of ``"A100-80GB-SXM"``) or a peak FLOP/s number; ``mfu`` in (0, 1];
    ``price_per_gpu_hour`` (USD, your assumption) gives ``.cost_usd``."""
    check_int("n_gpus", n_gpus, 1)

    u = _check_positive("mfu", mfu, hi=1.0)
    peak = _peak(gpu, dtype)
    price = None if price_per_gpu_hour is None else _check_positive("price_per_gpu_hour", price_per_gpu_hour)
    c = training_flops(model, tokens, seq_len=seq_len, causal=causal)
    return TrainingEstimate(
        flops=c,
        tokens=float(tokens),
        n_gpus=n_gpus,
        peak_flops_per_s=peak,
        mfu=u,
        seconds=c / (n_gpus * peak * u),
        price_per_gpu_hour=price,
    )


def implied_mfu(
    model, tokens: float, gpu_hours: float, *, gpu, dtype="bf16", seq_len: int | None = None, causal: bool = True
) -> float:
    """MFU implied by a reported GPU-hour total: ``C / (gpu_hours x 3600 x peak)``."""
    c = training_flops(model, tokens, seq_len=seq_len, causal=causal)
    return c / (_check_positive("gpu_hours", gpu_hours) * 3600.0 * _peak(gpu, dtype))
