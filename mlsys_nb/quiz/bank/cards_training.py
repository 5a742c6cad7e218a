"""Spot-the-error cards on training systems: each shows a wrong claim of the texts this curriculum was
built from (a tutorial, an interview-prep notebook, a book draft, a lecture), or its correction, and settles
it with the kit's calculator (``bank.cards.card``; the serving and RL cards are in ``cards_serving``)."""

from __future__ import annotations

from ... import comm, flops, hardware, memory
from ... import pipeline as pl
from ...config import TrainConfig
from ._util import pick, tensor_parallel, zero
from .cards import card, card_family
from .comm import SEC_COST
from .memory import SEC_MEM

SEC_LINKS = "notebooks/04_communication_cost.ipynb, §6 What changes on NVLink and InfiniBand"
SEC_PP = "notebooks/08_pipeline_parallelism.ipynb"
REF_LINKS = "docs/references.md#nvidia-datasheets, #interconnects"


@card_family("cards.allreduce_time", "comm", SEC_COST, "docs/references.md#patarasuk2009")
def _c_allreduce_time(rng):
    n = pick(rng, [4, 8])
    bw = hardware.link("nvlink4").per_direction_bytes_per_s
    t = comm.collective_time("all_reduce", 1e9, n, 0.0, bw)
    sent = comm.bytes_sent_per_rank("all_reduce", 1e9, n)
    return card(
        rng,
        f"A 1 GB all-reduce over {n} GPUs on {bw / 1e9:g} GB/s NVLink takes 1 GB ÷ {bw / 1e9:g} GB/s "
        f"= {1e9 / bw * 1e3:.2f} ms.",
        f"A 1 GB all-reduce over {n} GPUs on {bw / 1e9:g} GB/s NVLink takes at least {t * 1e3:.2f} ms.",
        [
            f"A ring all-reduce sends 2(n−1)/n of the buffer from each GPU: {sent / 1e9:.4g} GB at n = {n} "
            "(comm.bytes_sent_per_rank).",
            f"Bandwidth term {t * 1e3:.3g} ms (comm.collective_time with α = 0); dividing the message by the "
            "bandwidth forgets that each byte crosses a link about twice.",
        ],
        "How many bytes does each GPU send in a ring all-reduce?",
        params={"n": n},
    )


@card_family("cards.nvlink_h100", "comm", SEC_LINKS, REF_LINKS)
def _c_nvlink(rng):
    h100 = hardware.link(hardware.gpu("H100-SXM").nvlink)
    a100 = hardware.link(hardware.gpu("A100-80GB-SXM").nvlink)
    return card(
        rng,
        f"H100's NVLink 4 moves {a100.bidirectional_bytes_per_s / 1e9:g} GB/s (bidirectional).",
        f"H100's NVLink 4 moves {h100.bidirectional_bytes_per_s / 1e9:g} GB/s bidirectional, "
        f"{h100.per_direction_bytes_per_s / 1e9:g} GB/s per direction.",
        [
            f"data/hardware.yaml (datasheets): H100 {h100.name} {h100.per_direction_bytes_per_s / 1e9:g} GB/s per "
            f"direction, {h100.bidirectional_bytes_per_s / 1e9:g} both ways; A100 {a100.name} "
            f"{a100.per_direction_bytes_per_s / 1e9:g} / {a100.bidirectional_bytes_per_s / 1e9:g} GB/s.",
            "600 GB/s is A100's NVLink 3; a ring collective is bounded by the per-direction figure.",
        ],
        "Which GPU generation has 600 GB/s NVLink?",
    )


@card_family("cards.infiniband_bytes", "comm", SEC_LINKS, REF_LINKS)
def _c_ib(rng):
    ndr = hardware.link("infiniband-ndr")
    return card(
        rng,
        "An NDR InfiniBand port carries 400 GB/s.",
        f"An NDR InfiniBand port carries 400 Gb/s, i.e. {ndr.per_direction_bytes_per_s / 1e9:g} GB/s per direction.",
        [
            f"hardware.link('infiniband-ndr'): {ndr.per_direction_bytes_per_s / 1e9:g} GB/s per direction "
            f"(400 Gb/s ÷ 8 bits per byte); 100 GbE: "
            f"{hardware.link('ethernet-100g').per_direction_bytes_per_s / 1e9:g} GB/s.",
            "Network rates are quoted in bits per second; reading Gb as GB makes every network time 8× too short.",
        ],
        "Gb or GB?",
    )


@card_family(
    "cards.zero2_states",
    "data_parallel",
    "notebooks/06_zero_and_fsdp.ipynb, §4 ZeRO-2: shard the gradients too",
    "docs/references.md#zero (arXiv:1910.02054, §5)",
)
def _c_zero2(rng):
    dp = pick(rng, [8, 16])
    s = memory.model_state_bytes(70e9, dp=dp, zero=2, precision="bf16-nomaster")
    wrong = s.params + s.optimizer
    return card(
        rng,
        f"With bf16 weights and gradients and Adam's two fp32 moments (no master copy), ZeRO-2 over {dp} GPUs "
        f"holds {wrong / 1e9:.4g} GB of model states per GPU for a 70B model.",
        f"With bf16 weights and gradients and Adam's two fp32 moments (no master copy), ZeRO-2 over {dp} GPUs "
        f"holds {s.total / 1e9:.4g} GB of model states per GPU for a 70B model.",
        [
            f"Params {s.params / 1e9:g} GB (replicated) + grads {s.grads / 1e9:g} GB + moments "
            f"{s.optimizer / 1e9:g} GB (both sharded over {dp}) = {s.total / 1e9:.4g} GB "
            "(memory.model_state_bytes, precision 'bf16-nomaster').",
            f"{wrong / 1e9:.4g} GB leaves the sharded gradients out: ZeRO-2 divides them, it does not remove them.",
        ],
        "Add every term; which ones does ZeRO-2 divide by the DP degree?",
        params={"dp": dp},
    )


@card_family(
    "cards.gpipe_bubble",
    "pipeline",
    SEC_PP + ", §1 Cutting a model into stages, and the bubble",
    "docs/references.md#gpipe (arXiv:1811.06965), #pipedream-flush",
)
def _c_gpipe(rng):
    p, m = pick(rng, [4, 8]), pick(rng, [8, 16])
    r = pl.simulate(pl.schedule("gpipe", p, m), F=1, B=2)
    wrong = (p - 1) * m / (p * m + p - 1)  # the tutorial script's expression
    return card(
        rng,
        f"GPipe with {p} stages and {m} micro-batches leaves each GPU idle {wrong:.1%} of the step.",
        f"GPipe with {p} stages and {m} micro-batches leaves each GPU idle {r.bubble_fraction:.1%} of the step.",
        [
            f"pipeline.simulate: bubble fraction {r.bubble_fraction:.4g} = (p − 1)/(m + p − 1); "
            f"as a share of the ideal time it is (p − 1)/m = {(p - 1) / m:.4g}.",
            "(1 − m)/(m + p − 1) is negative for m > 1; (p − 1)·m/(p·m + p − 1) is no bubble formula either.",
        ],
        "Count the idle slots of one GPU in the fill and the drain.",
        params={"p": p, "m": m},
    )


@card_family(
    "cards.interleaved_memory",
    "pipeline",
    SEC_PP + ", §5 Interleaving: v chunks per rank",
    "docs/references.md#megatron-ptdp (arXiv:2104.04473, §2.2)",
)
def _c_interleaved(rng):
    p, v = pick(rng, [4, 8]), pick(rng, [2, 4])
    m = 4 * p
    inter, one = pl.peak_in_flight("interleaved-1f1b", p, m, v)[0], pl.peak_in_flight("1f1b", p, m)[0]
    return card(
        rng,
        "Interleaved 1F1B shrinks the bubble at no cost in activation memory or in messages.",
        "Interleaved 1F1B shrinks the bubble but holds more activations on the first stage and sends v× the "
        "point-to-point messages.",
        [
            f"p = {p}, v = {v}, m = {m}: the first stage holds {inter:g} micro-batches of activations against "
            f"{one:g} for 1F1B (pipeline.peak_in_flight), a factor 1 + (p−1)/(p·v) = {inter / one:.4g}.",
            f"Each micro-batch crosses {v}× as many stage boundaries: {v}× the sends, each as large.",
        ],
        "Count the warm-up forwards of rank 0.",
        params={"p": p, "v": v},
    )


@card_family(
    "cards.mixtral_params",
    "expert_context",
    "notebooks/09_experts_and_context.ipynb, §7 What EP and CP divide in memory",
    "docs/references.md#mixtral (arXiv:2401.04088)",
)
def _c_mixtral(rng):
    pc = memory.param_count(memory.preset("mixtral-8x7b"))
    return card(
        rng,
        "Mixtral 8x7B has 61B parameters, 19B of them active per token.",
        f"Mixtral 8x7B has {pc.total / 1e9:.1f}B parameters, {pc.active / 1e9:.1f}B of them active per token.",
        [
            f"memory.param_count(preset('mixtral-8x7b')): total {pc.total:,}, active {pc.active:,}.",
            "Only the MLPs are replicated 8×: attention, norms and embeddings are shared, and 2 of 8 experts run.",
        ],
        "What does each of the 8 experts replace, and what do they share?",
    )


@card_family(
    "cards.all_to_all_bytes",
    "expert_context",
    "notebooks/09_experts_and_context.ipynb, §4 EP or TP for the experts? Bytes and memory per rank",
    "docs/references.md#gshard, #nccl-tests",
)
def _c_a2a(rng):
    n = pick(rng, [4, 8, 64])
    a2a, ar = comm.bytes_sent_per_rank("all_to_all", 1e9, n), comm.bytes_sent_per_rank("all_reduce", 1e9, n)
    return card(
        rng,
        f"An all-to-all over {n} ranks sends as many bytes per rank as a ring all-reduce of the same buffer.",
        f"An all-to-all over {n} ranks sends half the bytes per rank of a ring all-reduce of the same buffer.",
        [
            f"S = 1 GB, n = {n}: all-to-all {a2a / 1e9:.4g} GB ((n−1)/n·S, once), ring all-reduce "
            f"{ar / 1e9:.4g} GB (2(n−1)/n·S) (comm.bytes_sent_per_rank).",
        ],
        "Each byte of an all-to-all goes straight to its owner.",
        params={"n": n},
    )


@card_family(
    "cards.recompute_cost",
    "memory",
    SEC_MEM + ", §3 Recomputation: memory against extra FLOPs",
    "docs/references.md#activation-checkpointing, #megatron-sp (arXiv:2205.05198, §5)",
)
def _c_recompute(rng):
    cfg = memory.preset(pick(rng, ["llama-2-7b", "llama-3-8b"]))
    base = flops.flops_per_token(cfg, 4096)
    full, sel = (flops.hardware_flops_per_token(cfg, 4096, recompute=r) / base - 1 for r in ("full", "selective"))
    return card(
        rng,
        "Activation checkpointing costs 33 % to 100 % more compute per training step.",
        "Activation checkpointing costs at most about a third more compute per step (one extra forward); "
        "selective recomputation costs a few percent.",
        [
            f"{cfg.name} at 4096 tokens: full recomputation +{full:.1%}, selective +{sel:.2%} of the step's FLOPs "
            "(flops.hardware_flops_per_token over flops.flops_per_token).",
            "A step is forward (2) + backward (4); recomputing the forward adds at most 2 of 6.",
        ],
        "How many forwards does a step run with full recomputation?",
    )


@card_family(
    "cards.memory_per_param",
    "memory",
    SEC_MEM + ", §2 Activations, measured on a real transformer",
    "docs/references.md#megatron-sp (arXiv:2205.05198, §4), #zero",
)
def _c_mem(rng):
    cfg = memory.preset("llama-2-7b")
    a, b = (memory.estimate(cfg, TrainConfig(micro_batch=1, seq_len=s, recompute="none")) for s in (1024, 8192))
    per_param = (a.params + a.grads + a.optimizer + a.master) / a.n_params_total
    return card(
        rng,
        "Training memory is a fixed multiple of the parameter count (about 20 bytes per parameter), whatever "
        "the batch and sequence length.",
        "Model states are a fixed 16 bytes per parameter; activations grow with micro-batch and sequence length.",
        [
            f"llama-2-7b, micro-batch 1 (memory.estimate): states {per_param:.3g} "
            f"B/param; activations {a.activations / 1e9:.3g} GB at 1024 tokens, {b.activations / 1e9:.3g} GB at 8192.",
        ],
        "Change the sequence length: which term moves?",
    )


@card_family(
    "cards.gpu_days",
    "compute",
    "notebooks/11_compute_and_scaling_laws.ipynb, §4 Training time and cost",
    "docs/references.md#palm (Appendix B), #chinchilla",
)
def _c_gpu_days(rng):
    n = pick(rng, [512, 1024, 2048])
    est = flops.training_time("llama-2-70b", 2e12, gpu="H100-SXM", n_gpus=n, mfu=0.4)
    return card(
        rng,
        "FLOPs ÷ (GPUs × peak FLOP/s × MFU × 86,400 s) is the number of GPU-days of a run.",
        "FLOPs ÷ (GPUs × peak FLOP/s × MFU × 86,400 s) is the run's wall-clock days; GPU-days are that times "
        "the number of GPUs.",
        [
            f"llama-2-70b on 2T tokens, {n} H100 at 40 % MFU: {est.days:.4g} days of wall clock, "
            f"{est.gpu_hours / 24:.4g} GPU-days (flops.training_time: .days, .gpu_hours).",
        ],
        "Double the GPUs: which of the two numbers stays the same?",
        params={"n": n},
    )


@card_family(
    "cards.nvswitch_nodes",
    "layout",
    "notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node",
    "docs/references.md#nvidia-datasheets, #interconnects, #megatron-ptdp",
)
def _c_nvswitch(rng):
    from ...planner.context import plan_context
    from ...planner.traffic import group_link

    ctx = plan_context("llama-3-8b", gpus=16, gpu="H100-SXM", global_batch_tokens=8192 * 16, seq_len=8192)
    inside, across = group_link(ctx, 1, 8)[0], group_link(ctx, 1, 16)[0]
    bw = {k: hardware.link(k).per_direction_bytes_per_s / 1e9 for k in (inside, across)}
    return card(
        rng,
        "NVSwitch connects the GPUs of different nodes, so a TP group can span two 8-GPU nodes at NVLink speed.",
        "NVSwitch connects the GPUs inside a node; a group that spans two nodes talks over InfiniBand or RoCE.",
        [
            f"planner.traffic.group_link on 8-GPU nodes: TP 8 uses {inside} ({bw[inside]:g} GB/s per direction), "
            f"TP 16 uses {across} ({bw[across]:g} GB/s per NIC).",
            "Only rack-scale systems (NVL72) extend NVLink past one chassis.",
        ],
        "What cable leaves an 8-GPU node?",
    )


@card_family(
    "cards.gb_vs_gib",
    "memory",
    SEC_MEM + ", §1 Model states: parameters, gradients, optimizer, master weights",
    "docs/references.md#playbook, #playbook-memory-widget",
)
def _c_gib(rng):
    n = pick(rng, [70e9, 8e9])
    b = memory.model_state_bytes(n).params
    return card(
        rng,
        f"{n / 1e9:g}B parameters in bf16 take {b / 1e9:g} GB, which is {b / 1e9 * 0.95:.3g} GiB.",
        f"{n / 1e9:g}B parameters in bf16 take {b / 1e9:g} GB, which is {b / memory.GiB:.4g} GiB.",
        [
            f"memory.model_state_bytes({n:.3g}).params = {b:.4g} B; ÷ memory.GiB (2^30) = {b / memory.GiB:.4g} GiB "
            f"(GiB is {memory.GiB / 1e9:.4g} GB, so the GiB figure is {1e9 / memory.GiB:.1%} of the GB one).",
            'Plots and widgets that divide by 1024³ and print "GB" show GiB.',
        ],
        "2^30 = 1.074e9.",
        params={"n": n},
    )


@card_family(
    "cards.zero2_traffic",
    "data_parallel",
    "notebooks/06_zero_and_fsdp.ipynb, §4 ZeRO-2: shard the gradients too",
    "docs/references.md#zero (arXiv:1910.02054, §7.2.1)",
)
def _c_zero2_traffic(rng):
    n = pick(rng, [8, 64])
    z2, ddp = zero.zero_bytes_per_step(70e9, n, 2), zero.zero_bytes_per_step(70e9, n, 0)
    return card(
        rng,
        "ZeRO-2 sends about half the bytes of DDP per step: it only reduce-scatters the gradients.",
        "ZeRO-2 sends the same bytes as DDP per step: a reduce-scatter of the gradients, then an all-gather of "
        "the updated parameters.",
        [
            f"70B in bf16 over {n} ranks: ZeRO-2 {z2 / 1e9:.4g} GB, DDP {ddp / 1e9:.4g} GB per rank and step "
            "(parallel.zero.zero_bytes_per_step).",
            "Each rank updates only its shard, so the others need the new values: the all-gather is half the cost.",
        ],
        "After the step, who holds the updated parameters?",
        params={"n": n},
    )


@card_family(
    "cards.tp_allreduces",
    "tensor",
    "notebooks/07_tensor_parallelism.ipynb, §3 The Megatron MLP and attention",
    "docs/references.md#megatron (arXiv:1909.08053, §3)",
)
def _c_tp(rng):
    tp = pick(rng, [2, 4, 8])
    b, s, h = 1, 4096, 8192
    fwd = tensor_parallel.tp_bytes_per_layer(b, s, h, tp, False) / comm.bytes_sent_per_rank(
        "all_reduce", 2 * b * s * h, tp
    )
    return card(
        rng,
        "Megatron tensor parallelism needs one all-reduce per MLP per training step.",
        "Megatron tensor parallelism all-reduces twice per layer in forward (after attention and after the MLP) "
        "and twice in backward: 4 per layer per step.",
        [
            f"tp = {tp}: one layer's forward sends {fwd:g} all-reduces' worth of [b, s, h] "
            "(parallel.tensor.tp_bytes_per_layer ÷ comm.bytes_sent_per_rank).",
            "Backward runs the conjugate operator f at each block's input: 2 more all-reduces of the input gradients.",
        ],
        "Count g in forward and f in backward for attention and for the MLP.",
        params={"tp": tp},
    )


@card_family(
    "cards.dp_overlap_ratio",
    "data_parallel",
    "notebooks/05_data_parallelism.ipynb, §4 Overlap: communicate while backward is still computing",
    "docs/references.md#playbook, #patarasuk2009",
)
def _c_dp_overlap(rng):
    dp, tokens = pick(rng, [8, 64]), pick(rng, [4096, 16384])
    peak, bw = hardware.gpu("H100-SXM").peak("bf16"), hardware.link("infiniband-ndr").per_direction_bytes_per_s
    ratio = {}
    for name in ("llama-3-8b", "llama-2-70b"):
        n = memory.param_count(memory.preset(name)).total
        ratio[name] = comm.collective_time("all_reduce", 2 * n, dp, 0.0, bw) / (4 * n * tokens / peak)
    r = ratio["llama-2-70b"]
    return card(
        rng,
        f"DDP's gradient all-reduce time over the backward time is num_params/(2·tokens) · (DP−1)/DP · peak/β: "
        f"with {tokens} tokens per rank and DP {dp} it grows with the parameter count.",
        f"DDP's gradient all-reduce time over the backward time is (DP−1)/DP · B_g·peak/(2·tokens·β): with "
        f"{tokens} tokens per rank and DP {dp}, bf16 gradients, H100 and 400 Gb/s, it is {r:.3g} for any model size.",
        [
            f"comm.collective_time(all_reduce of 2N bytes) ÷ backward 4·N·tokens/peak (memory.param_count): "
            f"llama-3-8b {ratio['llama-3-8b']:.4g}, llama-2-70b {r:.4g}: N cancels.",
            "A formula that keeps N compares one bucket's all-reduce with the whole backward.",
        ],
        "Both times are proportional to the parameter count.",
        params={"dp": dp, "tokens": tokens},
    )
