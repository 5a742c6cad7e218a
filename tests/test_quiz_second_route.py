"""Second routes for the quiz families that tests/test_quiz.py re-derives only by consistency.

Each test draws several seeds and recomputes ``.answer`` from ``.params`` by a route that does not
call the function the family calls: a real model's tensors on the ``meta`` device (parameter
counts, FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode``), a hand formula written out
from the paper, a brute-force search, or the pipeline's closed forms against its simulator.
``test_second_route_catches_a_broken_key`` shows once that a broken formula is caught.
"""

from __future__ import annotations

import dataclasses
import math
from functools import cache

import numpy as np
import pytest
import torch

from mlsys_nb import hardware, quiz

SEEDS = range(24)
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp32": 4}


def _draws(name, n_min=8, seeds=SEEDS):
    qs = [quiz.make(name, s) for s in seeds]
    assert len(qs) >= n_min
    return qs


@cache
def _meta(preset: str) -> dict:
    """Counts read off the kit's real ``Transformer`` built on the meta device (no memory used)."""
    from mlsys_nb.memory import preset as cfg_of
    from mlsys_nb.models import Transformer

    cfg = cfg_of(preset)
    with torch.device("meta"):
        model = Transformer(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    norms = sum(p.numel() for m in model.modules() if "Norm" in type(m).__name__ for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in model.parameters())  # shared (tied) tensors once
    embedding = model.tok_emb.weight.numel() if hasattr(model, "tok_emb") else cfg.vocab_size * cfg.hidden
    return dict(cfg=cfg, total=total, linear=linear, norms=norms, embedding=embedding)


def _kv_bytes_per_token(cfg, nbytes=2):
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * nbytes  # K and V, every layer (dense GQA/MHA)


# ---- inference: sizes and the roofline ------------------------------------------------------------
def test_weight_bytes_from_a_real_model():
    for q in _draws("inference.weight_bytes"):
        want = _meta(q.params["preset"])["total"] * BYTES[q.params["dtype"]]
        assert q.answer == pytest.approx(want, rel=1e-9), q.params


def test_max_concurrent_sequences_by_hand():
    for q in _draws("inference.max_concurrent_sequences"):
        p = q.params
        m = _meta(p["preset"])
        cfg = m["cfg"]
        budget = 0.9 * hardware.gpu(p["gpu"]).memory_bytes - m["total"] * 2 / p["tp"]
        per_seq = _kv_bytes_per_token(cfg) * p["seq_len"] / min(p["tp"], cfg.n_kv_heads)
        assert q.answer == max(0, math.floor(budget / per_seq)), p


def _roofline(preset, gpu, batch, new, context):
    """Hand roofline (Williams et al. 2009): FLOPs = 2 x matmul weights x tokens + causal attention
    4·L·n_heads·head_dim per (query, key) pair; bytes = weights once + the cache read and written."""
    m = _meta(preset)
    cfg = m["cfg"]
    keys = new * context + new * (new + 1) / 2
    flops = 2 * m["linear"] * batch * new + batch * 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys
    nbytes = 2 * m["linear"] + batch * (context + new) * _kv_bytes_per_token(cfg)
    g = hardware.gpu(gpu)
    peak, bw = g.peak("bf16"), g.hbm_bandwidth_bytes_per_s
    return dict(time=max(flops / peak, nbytes / bw), bound="compute" if flops / nbytes >= peak / bw else "memory")


def test_roofline_families_by_hand():
    for q in _draws("inference.decode_step_time"):
        p = q.params
        assert q.answer == pytest.approx(
            _roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"], rel=1e-9
        )
    for q in _draws("inference.prefill_time"):
        p = q.params
        want = _roofline(p["preset"], p["gpu"], p["batch"], p["prompt_len"], 0)["time"]
        assert q.answer == pytest.approx(want, rel=1e-9)
    for q in _draws("inference.decode_bound"):
        p = q.params
        assert q.answer == _roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["bound"], p
    for q in _draws("serving.decode_throughput"):
        p = q.params
        t = _roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"]
        assert q.answer == pytest.approx(p["batch"] / t, rel=1e-9)
    for q in _draws("serving.batching_speedup"):
        p = q.params
        one = _roofline(p["preset"], p["gpu"], 1, 1, 1024)["time"]
        many = _roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["time"]
        assert q.answer == pytest.approx(p["batch"] * one / many, rel=1e-9)


# ---- FLOPs: counted on the real model's graph -----------------------------------------------------
def _by_layers(cfg, count, full: bool = False):
    """``count(c)`` of the ``cfg.n_layers``-layer model, from the 1- and 2-layer models: every layer of a model
    without dense-first layers is the same block, so the count is f(1) + (L - 1) (f(2) - f(1)) exactly
    (``full=True`` counts the whole model instead: ``test_counts_from_two_layers_equal_the_whole_model``).
    A meta-device pass costs about 1 ms per op in Python: 0.1-0.2 s here instead of 2-7 s per model."""
    if full:
        return count(cfg)
    assert cfg.n_dense_layers == 0, "the layers must all be the same block"
    f1, f2 = (count(dataclasses.replace(cfg, n_layers=n)) for n in (1, 2))
    return f1 + (cfg.n_layers - 1) * (f2 - f1)


def _graph_flops(cfg, seq_len: int) -> int:
    """Forward + backward FLOPs counted by FlopCounterMode on the meta-device model (it counts the full
    s x s attention scores, as the explicit matmuls execute)."""
    from torch.utils.flop_counter import FlopCounterMode

    from mlsys_nb.models import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
        x = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as fc:
        model(x, x).backward()
    return fc.get_total_flops()


@cache
def _counted_flops_per_token(preset: str, seq_len: int, full: bool = False) -> float:
    """Forward + backward FLOPs per token counted on the graph of the meta-device model (``_by_layers``)."""
    from mlsys_nb.memory import preset as cfg_of

    cfg = cfg_of(preset)
    cfg = dataclasses.replace(cfg, seq_len=max(cfg.seq_len, seq_len))  # a longer position table: a lookup, no FLOPs
    return _by_layers(cfg, lambda c: _graph_flops(c, seq_len), full) / seq_len


def test_flops_per_token_counted_on_the_graph():
    seen = 0
    for q in _draws("flops.flops_per_token", seeds=range(10)):
        p = q.params
        cfg = _meta(p["model"])["cfg"]
        s = p["seq_len"]
        full = _counted_flops_per_token(p["model"], s)
        # causal: a query sees (s + 1) / 2 keys on average, not s; QK^T and PV, forward + backward (x3)
        masked = 3 * cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * (s - (s + 1) / 2)
        assert q.answer == pytest.approx(full - masked, rel=1e-9), p
        seen += 1
    assert seen >= 8


# ---- tensor parallelism -------------------------------------------------------------------------
def test_params_per_rank_from_the_real_modules():
    for q in _draws("tensor.params_per_rank"):
        p = q.params
        m = _meta(p["model"])
        split = m["linear"] + (0 if m["cfg"].tied_embeddings else m["embedding"])  # vocab-parallel embedding
        assert q.answer == pytest.approx(split / p["tp"] + m["norms"], rel=1e-9), p


# ---- activations (Korthikanti et al. 2022, arXiv:2205.05198, §4, for a Llama block) --------------
def _acts_per_token(cfg, *, recompute="none", flash=True, seq_len=2048, tp=1, sp=False):
    """Bytes saved for backward per token per layer of a Llama block (bf16 activations, RMSNorm with
    an fp32 reciprocal RMS per token, SwiGLU, no dropout), written out from the block's forward.
    TP shards the head and FFN dimensions; without SP the norm inputs and the inputs of the two
    column-parallel projections stay replicated (Korthikanti et al. 2022, Table 2). Fused kernels: SwiGLU
    keeps its gate and up outputs (SiLU recomputed in backward) and the down projection its input, 3
    FFN-wide tensors; FlashAttention's output is the output projection's input, stored once."""
    h, f, a, hd, kv = cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
    if recompute == "full":
        return 2 * h / (tp if sp else 1)
    replicated = 2 * h + 4 + 2 * h + 2 * h + 4 + 2 * h  # norm inputs + rstd, q/k/v input, mlp input
    sharded = 2 * a * hd + 2 * 2 * kv * hd + 2 * a * hd + 3 * 2 * f  # q, k, v, o-proj input, SwiGLU
    if recompute == "none":
        sharded += 4 * a if flash else 2 * a * seq_len  # flash's LSE (fp32), or the probabilities
    return replicated / (tp if sp else 1) + sharded / tp


LLAMAS = ("llama-2-7b", "llama-3-8b", "llama-2-13b")


def test_activations_per_layer_by_hand():
    seen = 0
    for q in _draws("memory.activations_per_layer", seeds=range(40)):
        p = q.params
        if p["model"] not in LLAMAS:
            continue
        cfg = _meta(p["model"])["cfg"]
        tokens = p["micro_batch"] * p["seq_len"]
        want = tokens * _acts_per_token(cfg, recompute=p["recompute"], seq_len=p["seq_len"])
        assert q.answer == pytest.approx(want, rel=1e-9), p
        seen += 1
    assert seen >= 10


def test_recompute_saving_by_hand():
    seen = 0
    for q in _draws("memory.recompute_saving", seeds=range(40)):
        p = q.params
        if p["model"] not in LLAMAS:
            continue
        cfg = _meta(p["model"])["cfg"]
        none = _acts_per_token(cfg, flash=False, seq_len=p["seq_len"])
        kept = _acts_per_token(cfg, recompute=p["recompute"], flash=False, seq_len=p["seq_len"])
        assert q.answer == pytest.approx(none / kept, rel=1e-9), p
        seen += 1
    assert seen >= 10


def _outside_per_token(cfg, tp=1, sp=False):
    """Outside the layers: token and target ids (int64), the final norm's input and rstd and the LM
    head's input (split by SP), the fp32 log-probs over the vocabulary (vocab-parallel: split by TP)."""
    k = tp if sp else 1
    return 8 + 8 + (2 * cfg.hidden + 4) / k + 2 * cfg.hidden / k + 4 * cfg.vocab_size / tp


def test_sp_activation_saving_by_hand():
    for q in _draws("tensor.sp_activation_saving"):
        p = q.params
        cfg = _meta(p["model"])["cfg"]
        s, tp = p["seq_len"], p["tp"]
        total = {
            sp: cfg.n_layers * s * _acts_per_token(cfg, seq_len=s, tp=tp, sp=sp)
            + s * _outside_per_token(cfg, tp, sp)
            + 4
            for sp in (False, True)
        }
        assert q.answer == pytest.approx(total[False] / total[True], rel=1e-9), p


# ---- whole-GPU verdicts ---------------------------------------------------------------------------
def test_fits_verdict_by_hand_when_not_borderline():
    """States (2 + 2 + 12 B/param, sharded by the stage) + activations by hand against the GPU; seeds
    within 10 % of the edge are left to the calculator (its temporaries are not re-derived here)."""
    decided = 0
    for q in _draws("memory.fits", seeds=range(60)):
        p = q.params
        if p["model"] not in LLAMAS:
            continue
        m = _meta(p["model"])
        n, dp, z = m["total"], p["dp"], p["zero"]
        states = 2 * n / (dp if z >= 3 else 1) + 2 * n / (dp if z >= 2 else 1) + 12 * n / (dp if z >= 1 else 1)
        acts = (
            m["cfg"].n_layers
            * p["micro_batch"]
            * p["seq_len"]
            * _acts_per_token(m["cfg"], recompute=p["recompute"], seq_len=p["seq_len"])
        )
        cap = hardware.gpu(p["gpu"]).memory_bytes
        if states + acts > 1.1 * cap:
            assert q.answer == "no", p
        elif (states + acts) * 1.1 + 4e9 < cap:  # plenty of room left for temporaries and the head
            assert q.answer == "yes", p
        else:
            continue
        decided += 1
    assert decided >= 10


def test_rlhf_memory_per_gpu_by_hand():
    """Actor and critic (the actor's trunk with a scalar head instead of the LM head) at 16 B/param over
    n GPUs (ZeRO-3), reference and reward frozen bf16 over n, the rollout engine's full bf16 actor, and
    the KV cache of the rollout batch (512 + 512 tokens) over n."""
    for q in _draws("rl.rlhf_memory_per_gpu", seeds=range(12)):
        p = q.params
        m = _meta(p["actor"])
        cfg, n = m["cfg"], p["n_gpus"]
        actor = m["total"]
        critic = actor - cfg.vocab_size * cfg.hidden * (1 if cfg.tied_embeddings else 1) + cfg.hidden + 1
        if cfg.tied_embeddings:
            critic += cfg.vocab_size * cfg.hidden  # the embedding stays; there was no separate head
        want = (
            16 * (actor + critic) / n
            + 2 * (actor + critic) / n
            + 2 * actor
            + p["rollout_batch"] * 1024 * _kv_bytes_per_token(cfg) / n
        )
        assert q.answer == pytest.approx(want, rel=q.tolerance / 2), p


# ---- choices: brute force or another calculator ---------------------------------------------------
def test_faster_allreduce_by_hand():
    for q in _draws("comm.faster_allreduce"):
        p = q.params
        n, s, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
        ring = 2 * (n - 1) * a + 2 * (n - 1) / n * s / b
        tree = 2 * math.ceil(math.log2(n)) * a + 2 * s / b  # pipelined (double binary) tree
        assert q.answer == ("ring" if ring < tree else "tree"), p


def test_best_schedule_for_memory_from_the_closed_forms():
    """The family reads peaks and bubbles off the simulator; here they come from the closed forms."""
    from mlsys_nb import pipeline as pl

    for q in _draws("pipeline.best_schedule_for_memory", seeds=range(12)):
        p, m = q.params["p"], q.params["m"]
        rows = {}
        for name in ("gpipe", "1f1b", "zb-h2"):
            cf = pl.closed_form(name, p, m, None, F=1.0, B=1.0, W=1.0)
            rows[name] = (pl.peak_in_flight(name, p, m, None)[0], cf["bubble_time"] / (3 * m + cf["bubble_time"]))
        assert q.answer == min(rows, key=lambda k: rows[k]), (p, m, rows)


def test_smallest_zero_stage_by_hand():
    for q in _draws("layout.smallest_zero_stage"):
        p = q.params
        n, dp = p["n_params"], p["dp"]
        cap = 0.5 * hardware.gpu(p["gpu"]).memory_bytes
        sizes = [(2 + 2 + 12) * n, (2 + 2) * n + 12 * n / dp, 2 * n + 14 * n / dp, 16 * n / dp]
        fits = [z for z, b in enumerate(sizes) if b <= cap]
        assert q.answer == (f"ZeRO-{fits[0]}" if fits else "none fits"), p


def test_tp_within_node_by_hand():
    nv = hardware.link("nvlink4")
    for q in _draws("layout.tp_within_node"):
        p = q.params
        s, n = p["bytes"], p["tp"]
        inside = 2 * (n - 1) * nv.latency_s + 2 * (n - 1) / n * s / nv.per_direction_bytes_per_s
        across = 2 * (n - 1) * 10e-6 + 2 * (n - 1) / n * s / p["beta_inter"]
        assert q.answer == pytest.approx(across / inside, rel=1e-9), p


def test_inference_optimal_shrink_by_brute_force():
    """Walk the iso-loss curve of the Chinchilla law on a fine grid of N and keep the least lifetime
    compute 6·N·D + 2·N·D_inference (Sardana et al. 2023, arXiv:2401.00448, eq. 2)."""
    from mlsys_nb import scaling

    law = scaling.law("chinchilla")
    for q in _draws("scaling.inference_optimal_shrink", seeds=range(9), n_min=6):
        c, mult = q.params["C"], q.params["inference_multiple"]
        G = (law.alpha * law.A / (law.beta * law.B)) ** (1 / (law.alpha + law.beta))
        n0 = G * (c / 6) ** (law.beta / (law.alpha + law.beta))
        d0 = c / (6 * n0)
        target = law.E + law.A / n0**law.alpha + law.B / d0**law.beta
        ns = n0 * np.logspace(-1.5, 0.2, 200001)
        gap = target - law.E - law.A / ns**law.alpha
        ok = gap > 0
        d = (law.B / gap[ok]) ** (1 / law.beta)
        cost = 6 * ns[ok] * d + 2 * ns[ok] * mult * d0
        assert q.answer == pytest.approx(n0 / ns[ok][np.argmin(cost)], rel=2e-3), q.params


CARDS_TRUE = {  # the corrected statement of each card, checked by a number computed here
    "cards.zero3_traffic": lambda: (2 + 1) / 2,  # ZeRO-3 = RS + 2 AG vs DDP's RS + AG: 1.5x, not 3x
    "cards.adam_bytes_per_param": lambda: 2 + 2 + 4 + 4 + 4,  # bf16 params/grads, fp32 m, v, master
    "cards.one_f_one_b_bubble": lambda: 0.0,  # same bubble as GPipe: the difference is memory
    "cards.sp_traffic": lambda: 0.0,  # RS + AG moves what one all-reduce moves
}


@pytest.mark.parametrize("name", sorted(f for f in quiz.families() if f.startswith("cards.")))
def test_card_key_is_the_truth_of_the_shown_statement(name):
    """A card shows either the misconception or its correction; the key is "true" exactly when the
    correction is shown, and the solution names the measured or computed number that decides it."""
    for seed in range(12):
        q = quiz.make(name, seed)
        assert q.answer == ("true" if q.params["shown"] == "correction" else "false"), (name, seed)
        assert q.solution and any(ch.isdigit() for ch in " ".join(q.solution)), (name, seed)


def test_card_numbers():
    from mlsys_nb import comm, pipeline as pl

    s, n = 1e9, 8
    ddp = comm.bytes_sent_per_rank("all_reduce", s, n)
    z3 = comm.bytes_sent_per_rank("reduce_scatter", s, n) + 2 * comm.bytes_sent_per_rank("all_gather", s, n)
    assert z3 / ddp == pytest.approx(CARDS_TRUE["cards.zero3_traffic"]())
    g = pl.simulate(pl.schedule("gpipe", 4, 8, None), F=1.0, B=1.0, W=1.0).bubble_fraction
    o = pl.simulate(pl.schedule("1f1b", 4, 8, None), F=1.0, B=1.0, W=1.0).bubble_fraction
    assert g - o == pytest.approx(CARDS_TRUE["cards.one_f_one_b_bubble"]())
    assert "16" in " ".join(quiz.make("cards.adam_bytes_per_param", 0).solution)
    # sp_traffic: reduce-scatter + all-gather move what one all-reduce moves
    rs_ag = comm.bytes_sent_per_rank("reduce_scatter", s, n) + comm.bytes_sent_per_rank("all_gather", s, n)
    assert rs_ag == pytest.approx(ddp)
    # ring_bytes_grow: the kit's per-rank ring bytes are 2(n-1)/n S: they approach 2S, never pass it
    sent = {k: comm.bytes_sent_per_rank("all_reduce", s, k) for k in (2, 3, 8, 64, 1024)}
    assert all(v == pytest.approx(2 * (k - 1) / k * s) and v < 2 * s for k, v in sent.items()), sent
    assert sent[1024] / sent[2] < 2  # 512x the ranks, under 2x the bytes: not proportional to n
    # decode_bound: batch-1 decode is memory-bound on every GPU of the bank
    assert all(_roofline("llama-2-7b", g, 1, 1, 1024)["bound"] == "memory" for g in ("H100-SXM", "L4"))
    # gqa_kv: the cache shrinks by n_heads / n_kv_heads (Llama 3 8B: 32 / 8)
    from mlsys_nb import inference

    cfg = _meta("llama-3-8b")["cfg"]
    gqa = inference.kv_bytes_per_token("llama-3-8b")
    mha = inference.kv_bytes_per_token(cfg.replace(n_kv_heads=cfg.n_heads))
    assert gqa == _kv_bytes_per_token(cfg) and mha / gqa == cfg.n_heads / cfg.n_kv_heads == 4
    assert cfg.head_dim == cfg.hidden // cfg.n_heads  # the heads are not smaller: there are fewer of them
    # twenty_tokens_per_param: under the approach-3 fit the optimal ratio moves with compute
    from mlsys_nb import flops, scaling

    law = scaling.law("chinchilla")
    assert law.tokens_per_parameter(1e25) > 2 * law.tokens_per_parameter(1e21)
    # mfu_recompute: recomputation adds executed FLOPs that MFU does not count
    m = _meta("llama-2-7b")["cfg"]
    assert flops.hardware_flops_per_token(m, 4096, recompute="full") > flops.flops_per_token(m, 4096)


# ---- the route catches a broken key --------------------------------------------------------------
def test_second_route_catches_a_broken_key(monkeypatch):
    """Break the roofline calculator's attention term (forget causality: every query sees every key)
    and the hand route of the prefill family disagrees."""
    from mlsys_nb.inference import roofline

    real = roofline.attention_flops

    def full_attention(model, new, context):
        return real(model, new, context) * 2 * (new * context + new * new) / (2 * new * context + new * (new + 1))

    monkeypatch.setattr(roofline, "attention_flops", full_attention)
    broken = [quiz.make("inference.prefill_time", s) for s in range(12)]
    misses = [
        q
        for q in broken
        if q.answer
        != pytest.approx(
            _roofline(q.params["preset"], q.params["gpu"], q.params["batch"], q.params["prompt_len"], 0)["time"],
            rel=1e-6,
        )
    ]
    assert misses, "a non-causal attention count went unnoticed"


# ---- inference premises are physical: they fit on the GPUs they name -------------------------------
ONE_GPU = (
    "inference.decode_step_time",
    "inference.prefill_time",
    "inference.decode_bound",
    "serving.decode_throughput",
    "serving.batching_speedup",
)


def _fits_by_hand(preset, gpu, batch, context, tp=1):
    """bf16 weights counted on the meta model / tp + the bf16 cache / min(tp, n_kv) <= 90 % of the GPU."""
    m = _meta(preset)
    cfg = m["cfg"]
    per_gpu = 2 * m["total"] / tp + batch * context * _kv_bytes_per_token(cfg) / min(tp, cfg.n_kv_heads)
    return per_gpu <= 0.9 * hardware.gpu(gpu).memory_bytes


@pytest.mark.parametrize("name", ONE_GPU)
def test_one_gpu_premises_fit_on_that_gpu(name):
    seen = set()
    for q in _draws(name, seeds=range(40)):
        p = q.params
        batch = p.get("batch", 1)
        context = p.get("context", p.get("prompt_len", 1024))
        assert _fits_by_hand(p["preset"], p["gpu"], batch, context), p
        seen.add(p["preset"])
    assert not {"llama-2-70b", "llama-3-70b", "llama-3.1-405b"} & seen  # 140 GB of bf16 weights fit no one GPU


def test_fits_tp_by_hand_and_the_shared_check_is_what_the_one_gpu_families_use(monkeypatch):
    answers = set()
    for q in _draws("inference.fits_tp", seeds=range(40)):
        p = q.params
        tp = next((t for t in (1, 2, 4, 8) if _fits_by_hand(p["preset"], p["gpu"], p["batch"], p["context"], t)), None)
        assert q.answer == ("does not fit on 8 GPUs" if tp is None else f"TP = {tp}"), p
        answers.add(q.answer)
    assert len(answers) >= 3, answers
    # break the one physical check: every premise is then accepted, and a 70B model shows up on one GPU
    from mlsys_nb.quiz.bank import inference as bank

    monkeypatch.setattr(bank, "fits_on_gpus", lambda *a, **k: True)
    drawn = {quiz.make("inference.decode_step_time", s).params["preset"] for s in range(60)}
    assert drawn & {"llama-2-70b", "llama-3-70b", "llama-3.1-405b"}


# ---- the families added for the interview notebook's sections ----------------------------------------
def _meta_parameters(cfg) -> int:
    """Parameters of ``Transformer(cfg)`` built on the meta device."""
    from mlsys_nb.models import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
    return sum(t.numel() for t in model.parameters())


@cache
def _meta_total(cfg, full: bool = False) -> int:
    """Parameters of the whole ``Transformer(cfg)`` on the meta device, by ``_by_layers`` (each config once)."""
    return _by_layers(cfg, _meta_parameters, full)


def test_counts_from_two_layers_equal_the_whole_model():
    """The premise of ``_by_layers``, on a dense preset's graph FLOPs and a MoE model's parameters, to the unit;
    a model with a different first layer (DeepSeek's dense-first layers) is refused, not extrapolated."""
    from mlsys_nb.memory import preset

    assert _counted_flops_per_token("gpt-2-small", 1024) == _counted_flops_per_token("gpt-2-small", 1024, full=True)
    cfg = preset("mixtral-8x7b").replace(n_experts=16, top_k=2)
    assert _meta_total(cfg) == _meta_total(cfg, full=True)
    with pytest.raises(AssertionError, match="same block"):
        _by_layers(preset("mixtral-8x7b").replace(n_layers=4, n_dense_layers=1), _meta_parameters)


def test_moe_params_on_the_real_model_and_published_mixtral():
    """Counted on the MoE Transformer (meta device): active = total − (E − k) unused experts per layer;
    Mixtral 8x7B itself: 46.7B total, 12.9B active (Jiang et al. 2024, arXiv:2401.04088, §2)."""
    from mlsys_nb.memory import param_count, preset

    pc = param_count(preset("mixtral-8x7b"))
    assert pc.total == pytest.approx(46.7e9, rel=2e-3) and pc.active == pytest.approx(12.9e9, rel=2e-3)
    asks = set()
    for q in _draws("expert_context.moe_params", seeds=range(16)):
        p = q.params
        cfg = preset("mixtral-8x7b").replace(n_experts=p["n_experts"], top_k=p["top_k"])
        total = _meta_total(cfg)
        one_expert = 3 * cfg.hidden * cfg.expert_ffn_hidden
        active = total - cfg.n_layers * (p["n_experts"] - p["top_k"]) * one_expert
        want = {"total parameters": total, "active parameters per token": active}.get(p["ask"], 2 * total)
        assert q.answer == want, p
        asks.add(p["ask"])
    assert len(asks) == 3


def test_gpus_for_target_by_hand_search():
    """Every batch 1..1024 (not only powers of two) on the hand roofline: the largest power of two
    meeting the per-user rate and fitting gives ceil(target / its tokens/s) GPUs."""
    for q in _draws("serving.gpus_for_target", seeds=range(12)):
        p = q.params
        ok = [
            b
            for b in range(1, 1025)
            if _fits_by_hand(p["preset"], p["gpu"], b, p["context"])
            and _roofline(p["preset"], p["gpu"], b, 1, p["context"])["time"] <= 1 / p["per_user"]
        ]
        b = 2 ** int(math.log2(max(ok)))
        t = _roofline(p["preset"], p["gpu"], b, 1, p["context"])["time"]
        assert q.answer == math.ceil(p["target"] * t / b), p


def test_async_rlhf_by_the_two_worker_timeline():
    """The closed forms (rl.placement) against the event timeline of a rollout worker and a trainer;
    the timeline of a serialised 'async' (gen waits for the latest weights) has the synchronous period."""
    from mlsys_nb.quiz.routes.rl import rlhf_timeline

    for q in _draws("rl.async_rlhf_speedup"):
        g, t, s = q.params["gen_s"], q.params["train_s"], q.params["sync_s"]
        ends = {lag: rlhf_timeline(g, t, s, lag=lag, steps=30) for lag in (1, 2)}
        period = {lag: e[-1] - e[-2] for lag, e in ends.items()}
        assert period[1] == pytest.approx(g + t + s) and period[2] == pytest.approx(max(g, t) + s)
        assert q.answer == pytest.approx(period[1] / period[2], rel=1e-9), q.params


# ---- a wrong key fails the worked solution ---------------------------------------------------------
def _break(monkeypatch, what):
    from mlsys_nb import memory
    from mlsys_nb.inference import kv_cache, roofline
    from mlsys_nb.rl import placement

    if what == "kv without V":
        real = kv_cache.kv_bytes_per_token
        monkeypatch.setattr(kv_cache, "kv_bytes_per_token", lambda m, d="bf16": 0.5 * real(m, d))
    elif what == "non-causal attention":
        real_a = roofline.attention_flops
        monkeypatch.setattr(roofline, "attention_flops", lambda m, new, ctx: 2 * real_a(m, new, ctx) + 1e12)
    elif what == "tp ignored":
        real_m = kv_cache.max_concurrent_sequences
        monkeypatch.setattr(kv_cache, "max_concurrent_sequences", lambda *a, tp=1, **k: real_m(*a, tp=1, **k))
        import mlsys_nb.inference as inf

        monkeypatch.setattr(inf, "max_concurrent_sequences", kv_cache.max_concurrent_sequences)
    elif what == "sync overlapped":
        monkeypatch.setattr(placement, "async_step_s", lambda g, t, s: max(g, t + s))
    elif what == "active = total":
        real_p = memory.param_count

        def same(cfg):
            pc = real_p(cfg)
            return dataclasses.replace(pc, active=pc.total)

        import dataclasses

        monkeypatch.setattr(memory, "param_count", same)


BROKEN = {
    "kv without V": "inference.kv_cache_bytes",
    "non-causal attention": "inference.prefill_time",
    "tp ignored": "inference.fits_tp",
    "sync overlapped": "rl.async_rlhf_speedup",
    "active = total": "expert_context.moe_params",
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_wrong_key_fails_the_worked_solution(monkeypatch, what):
    """Notebook 20's worked solutions answer by the second route: with the key's idea broken, the
    check of that answer fails for some seed (before: the key was fed back and always passed)."""
    from mlsys_nb.quiz import routes

    name = BROKEN[what]
    seeds = range(24)
    assert all(quiz.make(name, s).check(routes.worked_response(quiz.make(name, s))).ok for s in seeds)
    _break(monkeypatch, what)
    failed = [s for s in seeds if not quiz.make(name, s).check(routes.worked_response(quiz.make(name, s))).ok]
    assert failed, f"a key broken by {what!r} passed its worked solutions"


# ---- worksheets: adding a family keeps every other family's question --------------------------------
def _kept_in_order(old, new):
    """The entries of ``old`` still in ``new``, and whether ``new`` lists them in the same order."""
    kept = [x for x in old if x in set(new)]
    return kept, kept == [x for x in new if x in set(old)]


def test_adding_a_family_keeps_the_questions_of_the_families_that_stay(monkeypatch):
    from mlsys_nb.quiz import core

    for seed in (0, 7, "x"):
        before = core.worksheet(None, 4, seed=seed)
        with monkeypatch.context() as m:
            for name, like in (("comm.zz_new", "comm.busbw"), ("rl.zz_new", "rl.dpo_loss")):
                m.setitem(core.REGISTRY, name, dataclasses.replace(core.REGISTRY[like], name=name))
            after = core.worksheet(None, 4, seed=seed)
        for t in before.questions:
            old = [(q.family, q.text) for q in before.questions[t]]
            new = [(q.family, q.text) for q in after.questions[t]]
            kept, same_order = _kept_in_order(old, new)
            assert len(kept) >= len(old) - 1 and same_order, (seed, t, old, new)  # one slot at most moves


def test_the_old_worksheet_scheme_fails_the_same_check():
    """The replaced selection (shuffle the topic's sorted list, seed the i-th question by position)
    changes questions of families that stay when one is added; rendezvous order does not."""
    from mlsys_nb.quiz import core

    def old_scheme(names, seed, n=4, t="comm"):
        order = sorted(names)
        core.rng_for(f"worksheet:{t}", seed).shuffle(order)
        return [(order[i % len(order)], f"{seed}:{t}:{i}") for i in range(n)]

    def new_scheme(names, seed, n=4):
        return [(f, f"{seed}:0") for f in core.rendezvous(names, seed, "worksheet")[:n]]

    def moved(scheme, seed):
        names = core.families("comm")
        kept, same_order = _kept_in_order(scheme(names, seed), scheme([*names, "comm.zz_new"], seed))
        return len(kept) < 3 or not same_order

    assert any(moved(old_scheme, seed) for seed in range(10)), "the check would not catch the old scheme"
    assert not any(moved(new_scheme, seed) for seed in range(10))


# ---- precision: torch's real casts and finfo, bit patterns by hand -------------------------------
@pytest.mark.parametrize(
    "name",
    [
        "precision.format_max",
        "precision.rounding_error_bound",
        "precision.loss_scale_for_gradient",
        "precision.dynamic_scale_after_steps",
        "precision.state_bytes_saved",
        "precision.fp8_scale_from_amax",
        "precision.cast_error",
        "precision.block_format_bytes",
        "precision.mxfp4_stored_value",
        "profiling.linear_backward_flops",
        "profiling.overlap_fraction",
        "profiling.step_peak_from_events",
        "profiling.optimizer_state_appearance",
    ],
)
def test_precision_and_profiling_families_by_their_worked_routes(name):
    """Each family's worked response (quiz/routes/precision.py, profiling.py: by hand, never the key's
    calculator) passes the family's check."""
    from mlsys_nb.quiz import routes

    for q in _draws(name):
        assert q.check(routes.worked_response(q)).ok, (name, q.params, q.answer)


def test_precision_route_catches_a_wrong_exponent_bias(monkeypatch):
    """A key whose formats take the bias one too large fails the hand enumeration of bit patterns."""
    from mlsys_nb.precision import formats
    from mlsys_nb.quiz import routes
    from mlsys_nb.quiz.bank import precision as bank

    real = formats.make_format

    def wrong_bias(name, e, m, bias=None, special="ieee", torch_dtype=None):
        return real(name, e, m, 2 ** (e - 1), special, torch_dtype)

    monkeypatch.setattr(bank, "make_format", wrong_bias)
    qs = _draws("precision.format_max")
    assert not any(q.check(routes.worked_response(q)).ok for q in qs)


def test_precision_route_catches_an_mx_scale_that_forgets_the_element_emax(monkeypatch):
    """A key whose MXFP4 block scale is 2^floor(log2 amax) (no - emax: every element crushed below 1) fails the
    hand-scaled fp4 grid on many draws (those near 0 round to 0 either way)."""
    import math

    from mlsys_nb.quiz import routes
    from mlsys_nb.quiz.bank import precision as bank

    monkeypatch.setattr(bank, "block_scale", lambda amax, element="fp4_e2m1": 2.0 ** math.floor(math.log2(amax)))
    qs = _draws("precision.mxfp4_stored_value")
    assert sum(not q.check(routes.worked_response(q)).ok for q in qs) >= len(qs) // 3


def test_profiling_route_catches_an_overlap_key_that_counts_concurrent_spans_twice(monkeypatch):
    """A key that sums span lengths instead of merging them first fails the hand merge on some draws."""
    from mlsys_nb.quiz import routes
    from mlsys_nb.runtime import profiling

    def no_merge(comm, compute):
        inside = sum(profiling.intersection_length([iv], compute) for iv in comm)
        return inside / sum(b - a for a, b in comm)

    monkeypatch.setattr(profiling, "overlap_fraction", no_merge)
    qs = _draws("profiling.overlap_fraction", seeds=range(40))
    assert not all(q.check(routes.worked_response(q)).ok for q in qs)


# ---- checkpoint: a ternary search, sums term by term, bytes per state, the hardware table read directly ----
@pytest.mark.parametrize(
    "name",
    [
        "checkpoint.write_time",
        "checkpoint.optimal_interval",
        "checkpoint.lost_fraction",
        "checkpoint.job_mtbf",
        "checkpoint.restart_cost",
        "checkpoint.offload_traffic",
        "checkpoint.offload_break_even",
    ],
)
def test_checkpoint_families_by_their_worked_routes(name):
    """Each family's worked response (quiz/routes/checkpoint.py: never mlsys_nb.checkpoint) passes its check."""
    from mlsys_nb.quiz import routes

    for q in _draws(name):
        assert q.check(routes.worked_response(q)).ok, (name, q.params, q.answer)


def test_checkpoint_route_catches_an_interval_without_the_factor_2(monkeypatch):
    """A key with Young's interval as sqrt(C·M) fails the ternary search of the waste."""
    import math

    from mlsys_nb.quiz import routes
    from mlsys_nb.quiz.bank import checkpoint as bank

    monkeypatch.setattr(bank, "optimal_interval", lambda c, m: math.sqrt(c * m))
    qs = _draws("checkpoint.optimal_interval")
    assert not any(q.check(routes.worked_response(q)).ok for q in qs)


# ---- kernels: FLOPs and bytes by hand, Algorithm 1's loop walked in Python, exp-sums, counting up ----
@pytest.mark.parametrize(
    "name",
    [
        "kernels.op_intensity",
        "kernels.op_bound",
        "kernels.op_roofline_time",
        "kernels.fusion_speedup",
        "kernels.flash_block_sizes",
        "kernels.flash_hbm_bytes",
        "kernels.score_matrix_memory",
        "kernels.online_softmax_merge",
        "kernels.decode_splits",
    ],
)
def test_kernels_families_by_their_worked_routes(name):
    """Each family's worked response (quiz/routes/kernels.py: never mlsys_nb.kernels) passes its check."""
    from mlsys_nb.quiz import routes

    for q in _draws(name):
        assert q.check(routes.worked_response(q)).ok, (name, q.params, q.answer)


def test_kernels_route_catches_a_merge_without_the_rescale(monkeypatch):
    """A key whose merge adds the partials' outputs without rescaling fails the exp-sum route."""
    import torch

    import mlsys_nb.kernels as kernels
    from mlsys_nb.quiz import routes

    def no_rescale(out, lse, out_b, lse_b):
        return out + out_b, torch.logaddexp(lse, lse_b)

    monkeypatch.setattr(kernels, "merge_partials", no_rescale)
    qs = _draws("kernels.online_softmax_merge")
    assert not any(q.check(routes.worked_response(q)).ok for q in qs)


def test_kernels_route_catches_io_bytes_without_the_query_reloads(monkeypatch):
    """A key that counts Q, O, lse once (the FlashAttention-2 loop order's Q traffic) fails Algorithm 1's walk."""
    import mlsys_nb.kernels as kernels
    from mlsys_nb.quiz import routes

    def once(s, d, m, *, elem_bytes=4):
        return float(elem_bytes * (s * (d + 1) + 2 * s * d + s * (3 * d + 2)))

    monkeypatch.setattr(kernels, "flash_io_bytes", once)
    qs = _draws("kernels.flash_hbm_bytes")
    assert not any(q.check(routes.worked_response(q)).ok for q in qs)


def test_kernels_route_catches_a_split_key_that_only_fills_the_sms(monkeypatch):
    """A key with the simpler rule, the fewest splits that give every SM a block (``fill_splits``, the kit's old
    ``decode_splits``), fails flash-attn's rule worked from the question text wherever the two rules differ."""
    import mlsys_nb.kernels as kernels
    from mlsys_nb.quiz import routes

    flash_attn = kernels.decode_splits
    monkeypatch.setattr(kernels, "decode_splits", kernels.fill_splits)
    qs = _draws("kernels.decode_splits")
    differ = [q for q in qs if flash_attn(q.params["b"], q.params["h"], q.params["sms"]) != q.answer]
    assert len(differ) >= len(qs) // 2, "the draws should mostly tell the two rules apart"
    assert not any(q.check(routes.worked_response(q)).ok for q in differ)


# ---- quant: bits from the stored layout, the meta-built model's counts, shapes by hand -------------
@pytest.mark.parametrize("name", [f for f in quiz.core.families("quant")])
def test_quant_families_by_their_worked_routes(name):
    """Each family's worked response (quiz/routes/quant.py: the layout's bits and the model's shapes by hand,
    never ``mlsys_nb.quant``'s calculators) passes the family's check."""
    from mlsys_nb.quiz import routes

    for q in _draws(name):
        assert q.check(routes.worked_response(q)).ok, (name, q.params, q.answer)


def test_quant_route_catches_a_key_that_forgets_the_scales(monkeypatch):
    """A key counting only the code bits (no scales or zero points) fails the routes' layout count wherever the
    constants add more than the check's 2 % tolerance (NF4 g128 with double quantization adds 1.6 %)."""
    import mlsys_nb.quant as quant
    from mlsys_nb.quiz import routes

    def code(scheme):
        return 8.0 if scheme == "int8" else 4.0

    monkeypatch.setattr(quant, "bits_per_weight", lambda scheme, g=None, dq=False: code(scheme))
    qs = [q for q in _draws("quant.bits_per_weight") + _draws("quant.decode_speedup_bound") if q.params["g"] <= 64]
    assert len(qs) >= 8 and not any(q.check(routes.worked_response(q)).ok for q in qs)


def test_quant_route_catches_a_multi_lora_key_that_forgets_the_kv_cache(monkeypatch):
    """A key that leaves the KV cache out of the free memory fails the route (the meta-built model's parameters,
    the cache and the adapters' shapes by hand) wherever the cache takes more than 5 % of the memory left."""
    import mlsys_nb.inference as inference
    from mlsys_nb.quiz import routes

    qs = _draws("quant.multi_lora_adapters")
    monkeypatch.setattr(inference, "kv_cache_bytes", lambda model, tokens, dtype="bf16": 0)
    broken = [quiz.make("quant.multi_lora_adapters", q.seed) for q in qs]
    big = [b for q, b in zip(qs, broken) if b.answer > 1.05 * q.answer]
    assert len(big) >= 4 and not any(b.check(routes.worked_response(b)).ok for b in big)


def test_quant_route_catches_a_paged_optimizer_key_that_evicts_everything():
    """A key that pages out the whole AdamW state at a spike (not just what the spike displaces) fails the route."""
    import dataclasses

    from mlsys_nb.quant import finetune_bytes
    from mlsys_nb.quiz import routes

    for q in _draws("quant.paged_optimizer_eviction"):
        whole = finetune_bytes(q.params["model"], "qlora", r=q.params["r"])["optimizer"]
        bad = dataclasses.replace(q, answer=whole)
        assert q.check(routes.worked_response(q)).ok and not bad.check(routes.worked_response(bad)).ok, q.params
