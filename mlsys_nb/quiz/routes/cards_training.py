"""Second routes of the training cards (``bank.cards_training``): the statement shown judged against a number
worked out here from the papers' and datasheets' own figures, or read off the real model on the meta device."""

from __future__ import annotations

from .cards import judge_card, claimed_number
from .model import cfg_of, model_counts, peak_bf16
from .registry import register_route

NVLINK4 = 18 * 25e9  # B/s per direction: 18 links × 25 GB/s (H100 datasheet: 900 GB/s both ways)
NDR = 400e9 / 8  # B/s per direction: 400 Gb/s per port


@register_route("cards.allreduce_time")
def _(p):
    ms = 2 * (p["n"] - 1) / p["n"] * 1e9 / NVLINK4 * 1e3  # ring: reduce-scatter + all-gather (Patarasuk 2009)
    return judge_card(lambda text: abs(claimed_number(text, r"(?:=|at least) ([\d.]+) ms") - ms) < 0.01 * ms)(p)


@register_route("cards.nvlink_h100")
@judge_card
def _(text):
    return claimed_number(text, r"moves (\d+) GB/s") == 2 * NVLINK4 / 1e9


@register_route("cards.infiniband_bytes")
@judge_card
def _(text):
    return claimed_number(text, r"(\d+) GB/s") == NDR / 1e9


@register_route("cards.zero2_states")
def _(p):
    n, dp = 70e9, p["dp"]
    gb = (2 * n + 2 * n / dp + 8 * n / dp) / 1e9  # bf16 params; grads and two fp32 moments sharded
    return judge_card(lambda text: abs(claimed_number(text, r"holds ([\d.]+) GB") - gb) < 0.01 * gb)(p)


@register_route("cards.gpipe_bubble")
def _(p):
    idle = 100 * (p["p"] - 1) / (p["m"] + p["p"] - 1)  # fill + drain: p − 1 slots of m + p − 1
    return judge_card(lambda text: abs(claimed_number(text, r"idle ([\d.]+)%") - idle) < 0.06)(p)


@register_route("cards.interleaved_memory")
def _(p):
    first_stage = p["p"] + (p["p"] - 1) / p["v"]  # micro-batches held (Narayanan et al. 2021, §2.2); 1F1B: p
    return judge_card(lambda text: ("at no cost" in text) == (first_stage <= p["p"] and p["v"] == 1))(p)


@register_route("cards.mixtral_params")
@judge_card
def _(text):
    m = model_counts("mixtral-8x7b")
    cfg = m["cfg"]
    active = m["total"] - m["n_moe"] * (cfg.n_experts - cfg.top_k) * m["expert"]
    total_b = claimed_number(text, r"has ([\d.]+)B parameters")
    active_b = claimed_number(text, r", ([\d.]+)B of them active")
    return abs(total_b * 1e9 - m["total"]) < 1e-3 * m["total"] and abs(active_b * 1e9 - active) < 5e-3 * active


@register_route("cards.all_to_all_bytes")
def _(p):
    n = p["n"]
    ratio = ((n - 1) / n) / (2 * (n - 1) / n)  # each byte straight to its owner vs ring RS + AG

    def judge(text):
        return ("as many bytes" in text) == (ratio == 1) and ("half the bytes" in text) == (ratio == 0.5)

    return judge_card(judge)(p)


@register_route("cards.recompute_cost")
@judge_card
def _(text):
    extra = 2 / (2 + 4)  # one more forward (2 FLOPs per parameter per token) on top of forward + backward (6)
    return ("33 % to 100 %" in text) == (extra >= 1.0)


@register_route("cards.memory_per_param")
@judge_card
def _(text):
    cfg = cfg_of("llama-2-7b")
    h, a = cfg.hidden, cfg.n_heads
    act = [s * h * (34 + 5 * a * s / h) for s in (1024, 8192)]  # bytes per layer (Korthikanti et al. 2022, §4)
    return ("whatever the batch and sequence length" in text) == (act[0] == act[1])


@register_route("cards.gpu_days")
def _(p):
    # C / (N·peak·MFU) seconds pass on the wall clock while all N GPUs run: GPU-time is N times that
    return judge_card(lambda text: ("is the number of GPU-days" in text) == (p["n"] == 1))(p)


@register_route("cards.nvswitch_nodes")
@judge_card
def _(text):
    return ("nodes at NVLink speed" in text) == (NDR >= NVLINK4)


@register_route("cards.gb_vs_gib")
def _(p):
    gib = 2 * p["n"] / 1024**3
    return judge_card(lambda text: abs(claimed_number(text, r"which is ([\d.]+) GiB") - gib) < 1e-3 * gib)(p)


@register_route("cards.zero2_traffic")
def _(p):
    n = p["n"]
    z2, ddp = (n - 1) / n + (n - 1) / n, 2 * (n - 1) / n  # RS of grads + AG of params vs ring all-reduce
    return judge_card(lambda text: ("about half the bytes" in text) == (abs(z2 / ddp - 0.5) < 0.1))(p)


@register_route("cards.tp_allreduces")
@judge_card
def _(text):
    per_layer = 2 * 2  # attention and MLP: g (all-reduce) in forward, f's conjugate in backward
    return ("one all-reduce per MLP per training step" in text) == (per_layer == 1)


@register_route("cards.dp_overlap_ratio")
def _(p):
    """(DP−1)/DP · B_g·peak/(2·tokens·β) by hand (H100 bf16 peak, 400 Gb/s): no parameter count in it."""
    dp, tokens = p["dp"], p["tokens"]
    # all-reduce 2(DP−1)/DP · 2N bytes over β; backward 4·N·tokens FLOPs over peak: N cancels (Playbook A3)
    ratio = (dp - 1) / dp * 2 * peak_bf16("H100-SXM") / (2 * tokens * NDR)

    def judge(text):
        if "grows with the parameter count" in text:
            return False  # no N left in the ratio
        return abs(claimed_number(text, r"it is ([\d.]+) for any model size") - ratio) < 0.01 * ratio

    return judge_card(judge)(p)
