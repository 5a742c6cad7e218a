"""Second routes of the serving, RL and GPU cards (``bank.cards_serving``): the statement shown judged against a
hand roofline, hand KV-cache sizes on the real model (meta device), the two-worker RLHF timeline, plain-Python
sums, or the GPU record's Markdown table read here."""

from __future__ import annotations

import re
from pathlib import Path

from .cards import judge_card, claimed_number
from .inference import roofline, sequences_that_fit
from .model import cfg_of, kv_per_token, model_counts
from .registry import register_route
from .rl import rlhf_timeline


@register_route("cards.prefill_bound")
def _(p):
    bound = roofline("llama-2-70b", "H100-SXM", 1, p["tokens"], 0)["bound"]
    return judge_card(lambda text: ("is compute-bound" in text) == (bound == "compute"))(p)


@register_route("cards.kv_per_token")
@judge_card
def _(text):
    kib = kv_per_token(cfg_of("llama-3-8b")) / 1024
    if "whatever the model" in text:
        sizes = [kv_per_token(cfg_of(m)) for m in ("llama-3-8b", "llama-2-70b", "llama-2-7b")]
        return all(abs(s - 1e6) < 0.2e6 for s in sizes)
    return claimed_number(text, r"(\d+) KiB for Llama-3-8B") == kib


@register_route("cards.kv_long_request")
def _(p):
    gb = kv_per_token(cfg_of("llama-2-70b")) * p["tokens"] / 1e9
    return judge_card(lambda text: abs(claimed_number(text, r"about ([\d.]+) GB") - gb) < 0.02 * gb)(p)


@register_route("cards.seventy_b_one_gpu")
@judge_card
def _(text):
    fits = 2 * model_counts("llama-2-70b")["total"] <= 80e9  # bf16 weights alone against 80 GB
    return ("can be served from one" in text) == fits


@register_route("cards.speculative_tokens")
def _(p):
    tokens = sum(p["alpha"] ** i for i in range(p["k"] + 1))  # α^0 … α^k (Leviathan et al. 2023, Eq. 1)
    return judge_card(lambda text: abs(claimed_number(text, r"yields ([\d.]+) tokens") - tokens) < 2e-3 * tokens)(p)


@register_route("cards.async_rlhf")
def _(p):
    def period(lag):
        ends = rlhf_timeline(p["gen_s"], p["train_s"], p["sync_s"], lag=lag)
        return (ends[-1] - ends[len(ends) // 2]) / (len(ends) - 1 - len(ends) // 2)

    speedup = period(1) / period(2)

    def judge(text):
        if "1.5–2× faster" in text:
            return 1.5 <= speedup <= 2
        return abs(claimed_number(text, r": ([\d.]+)×\.") - speedup) < 0.01 * speedup

    return judge_card(judge)(p)


@register_route("cards.rlhf_adam_states")
def _(p):
    gb = 2 * 70e9 / p["tp"] * (4 + 4) / 1e9  # actor and critic, each with fp32 m and v
    return judge_card(lambda text: abs(claimed_number(text, r"hold ([\d.]+) GB of Adam") - gb) < 0.01 * gb)(p)


@register_route("cards.gae_weight")
def _(p):
    w = (0.99 * 0.95) ** p["t"]
    return judge_card(lambda text: abs(claimed_number(text, r"has weight (\d+\.\d+)") - w) < 1e-3)(p)


def recorded_launch_us() -> float:
    """The kernel launch cost (µs) as the GPU record's Markdown table prints it (data/measured/gpu-*.md)."""
    root = Path(__file__).resolve().parents[3] / "data" / "measured"
    for md in sorted(root.glob("gpu-*.md")):
        m = re.search(r"\| launch cost per tiny kernel[^|]*\| ([\d.]+) \| us \|", md.read_text())
        if m:
            return float(m.group(1))
    raise FileNotFoundError("no GPU record with the kernel launch cost in data/measured")


@register_route("cards.kernel_launch")
@judge_card
def _(text):
    us = recorded_launch_us()
    return abs(claimed_number(text, r"about ([\d.]+) µs") - us) < 0.1 * us


@register_route("cards.fp8_kv_capacity")
def _(p):
    cfg = cfg_of(p["model"])
    L, H, d, b = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, 16
    bf16 = 2 * L * H * d * b * 2
    fp8 = L * H * (b * d + 4 * d) + L * H * b * (d + 4)  # K: codes + fp32 scale per channel; V: + per token
    ratio = bf16 / fp8

    def judge(text):
        if "exactly twice" in text:
            return ratio == 2
        return abs(claimed_number(text, r"about ([\d.]+)× the tokens") - ratio) < 0.01

    return judge_card(judge)(p)


@register_route("cards.kv_requests_fit")
def _(p):
    n = int(480e9 // (kv_per_token(cfg_of("llama-2-70b")) * p["ctx"]))
    return judge_card(lambda text: claimed_number(text, r"holds (\d+) requests") == n)(p)


@register_route("cards.serving_gpus_batching")
def _(p):
    """The hand roofline of serving.gpus_for_target (real model, meta device), batch doubled while it keeps the rate."""
    from .registry import ROUTES

    gpus = ROUTES["serving.gpus_for_target"](p)  # the hand roofline, batch doubled while it meets 50 tokens/s
    return judge_card(lambda text: claimed_number(text, r"takes (\d+) GPUs") == gpus)(p)


@register_route("cards.rollout_one_gpu")
def _(p):
    """Weights counted on the real model (meta device) + a hand KV-cache size, TP 1, 2, 4, 8 in turn."""
    tp = next(t for t in (1, 2, 4, 8) if sequences_that_fit("llama-2-70b", "H100-SXM", 150, t) >= p["batch"])

    def judge(text):
        if "on one 80 GB H100" in text:
            return tp == 1
        return claimed_number(text, r"\(TP (\d+)\)") == tp

    return judge_card(judge)(p)
