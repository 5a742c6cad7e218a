"""Second routes of the spot-the-error cards: judge the statement shown against a number computed here."""

from __future__ import annotations

import re

from .inference import roofline
from .model import cfg_of, model_counts
from .registry import register_route
from .scaling import optimum


def claimed_number(text, pattern) -> float | None:
    """The number a card's statement claims: group 1 of ``pattern`` in ``text`` (None if absent)."""
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def judge_card(fn):
    """A card's second route from ``fn(text) -> bool``: is the statement shown true?"""

    def judge(p):
        """The statement shown judged against a number computed here (never which one was drawn)."""
        return "true" if fn(p["_text"]) else "false"

    judge.__doc__ = fn.__doc__ or judge.__doc__  # what the route computes, for notebook 20's worked solutions
    return judge


@register_route("cards.zero3_traffic")
@judge_card
def _(text):
    n = 8
    ratio = (3 * (n - 1) / n) / (2 * (n - 1) / n)  # ZeRO-3: RS + 2 AG; DDP: RS + AG (ring)
    return abs(claimed_number(text, r"sends ([\d.]+)×") - ratio) < 1e-9


@register_route("cards.adam_bytes_per_param")
@judge_card
def _(text):
    return claimed_number(text, r"needs (\d+) bytes per parameter") == 2 + 2 + 4 + 4 + 4


@register_route("cards.one_f_one_b_bubble")
@judge_card
def _(text):
    p, m = 4, 8
    gpipe = one_f_one_b = (p - 1) / (m + p - 1)  # both ramp up and down once (Narayanan et al. 2021)
    claims_half = "halves" in text
    return claims_half == (one_f_one_b <= gpipe / 2 + 1e-12)


@register_route("cards.twenty_tokens_per_param")
@judge_card
def _(text):
    from ... import scaling

    law = scaling.law("epoch")
    lo, hi = (d / n for n, d in (optimum(law, 1e20), optimum(law, 1e26)))
    constant = abs(hi / lo - 1) < 0.05
    return ("at every budget" in text) == constant


@register_route("cards.sp_traffic")
@judge_card
def _(text):
    n, s = 4, 1.0
    adds = (n - 1) / n * s * 2 > 2 * (n - 1) / n * s  # RS + AG vs one ring all-reduce
    return ("adds communication" in text) == adds


@register_route("cards.decode_bound")
@judge_card
def _(text):
    bound = roofline("llama-3-8b", "H100-SXM", 1, 1, 1024)["bound"]
    return ("compute-bound" in text) == (bound == "compute")


@register_route("cards.ring_bytes_grow")
@judge_card
def _(text):
    grows = 2 * (1024 - 1) / 1024 > 2  # ring all-reduce bytes per rank 2(n−1)/n·S never exceed 2S
    return ("more bytes per rank as you add ranks" in text) == grows


@register_route("cards.mfu_recompute")
@judge_card
def _(text):
    # MFU counts the model's FLOPs (6 per parameter per token, whatever is executed); full recompute
    # executes the forward twice (8 per parameter): hardware FLOPs rise, the model's do not
    model_flops, executed = 6, 2 + 2 + 4
    return ("raises HFU, not MFU" in text) == (executed > model_flops)


@register_route("cards.gqa_kv")
@judge_card
def _(text):
    cfg = cfg_of("llama-2-70b")
    heads_smaller = cfg.head_dim < cfg.hidden // cfg.n_heads  # GQA keeps head_dim; it caches fewer heads
    return ("making each head smaller" in text) == heads_smaller


@register_route("cards.magnitude_pruning")
@judge_card
def _(text):
    """The recorded range read off data/measured/portability.md's notebook-25 table (the bank reads the CSV)."""
    from pathlib import Path

    md = (Path(__file__).resolve().parents[3] / "data" / "measured" / "portability.md").read_text()
    table = md.split("## Notebook 25", 1)[1]
    row = r"\| 50 % pruning: magnitude's loss increase / random's \|.*?\| ([\d.e+-]+) - ([\d.e+-]+) \|"
    worst = float(re.search(row, table).group(2))  # the column "values (min - max)"
    if "no better than random" in text:
        return worst > 0.5  # "about as much": a ratio near 1
    return worst < claimed_number(text, r"by less than (\d+)%") / 100


@register_route("cards.optimizer_state_units")
def _(p):
    """Three fp32 values (m, v, master) per weight: 12 bytes, by hand."""
    mb = 3 * 4 * p["h"] ** 2 / 1e6  # m, v and the master copy: three fp32 values per weight
    return judge_card(lambda text: abs(claimed_number(text, r"= ([\d.]+) MB") - mb) < 1e-3 * mb)(p)


@register_route("cards.zero_stage_named")
def _(p):
    """ZeRO-1 and ZeRO-3 model states by hand: 2 + 2 + 12/DP and 16/DP bytes per parameter."""
    n, dp = 70e9, p["dp"]
    zero1, zero3 = (2 * n + 2 * n + 12 * n / dp) / 1e9, 16 * n / dp / 1e9  # bf16 params, grads; fp32 master, m, v

    def judge(text):
        named = claimed_number(text, r"models ZeRO-(\d)")
        ok = named == 1 and abs(claimed_number(text, r"([\d.]+) GB per GPU") - zero1) < 0.01 * zero1
        z3 = claimed_number(text, r"too: ([\d.]+) GB")
        return ok and (z3 is None or abs(z3 - zero3) < 0.01 * zero3)

    return judge_card(judge)(p)


@register_route("cards.network_vs_nvme")
def _(p):
    """A NIC's Gb/s ÷ 8 against four PCIe lanes at 16 or 32 GT/s with 128b/130b coding."""
    nic = {"infiniband-ndr": 400e9, "infiniband-hdr": 200e9}[p["nic"]] / 8  # B/s per direction
    nvme = {gen: gt * 1e9 * 4 * 128 / 130 / 8 for gen, gt in ((4, 16), (5, 32))}  # 4 lanes, 128b/130b

    def judge(text):
        if "is the slowest level" in text:
            return nic < nvme[5]
        pcie4 = claimed_number(text, r"\(([\d.]+) GB/s on PCIe 4.0")
        return abs(claimed_number(text, r"moves ([\d.]+) GB/s") * 1e9 - nic) < 0.01 * nic and (
            abs(pcie4 * 1e9 - nvme[4]) < 0.03 * nvme[4]
        )

    return judge_card(judge)(p)


@register_route("cards.moe_tokens_rule")
@judge_card
def _(text):
    """Total and active parameters counted on the real Mixtral (meta device)."""
    m = model_counts("mixtral-8x7b")
    active = m["total"] - m["n_moe"] * (m["cfg"].n_experts - m["cfg"].top_k) * m["expert"]
    if "carries over to MoE" in text:
        return m["total"] == active  # only a dense model has one parameter count
    return abs(claimed_number(text, r"parameters, ([\d.]+)× apart") - m["total"] / active) < 0.01 * m["total"] / active
