"""Spot-the-error cards on inference, serving, RL and one GPU: each shows a wrong claim of the texts this
curriculum was built from, or its correction, and settles it with the kit's calculator or a recorded
measurement (``bank.cards.card``; the training cards are in ``cards_training``)."""

from __future__ import annotations

from ... import hardware, memory
from ._util import inference, pick, rl_sizing, speculative
from .cards import card, card_family
from .inference import SEC13
from .quant import SEC_SPEED

SEC_SIZES = SEC13 + ", §3 Sizing the cache of real models"
REF_KV = "docs/references.md#gqa (arXiv:2305.13245), #llama2"


@card_family(
    "cards.prefill_bound",
    "inference",
    SEC13 + ", §4 Prefill and decode on the roofline",
    "docs/references.md#roofline, #scaling-book",
)
def _c_prefill(rng):
    n = pick(rng, [64, 100, 200])
    c = inference.prefill_cost("llama-2-70b", "H100-SXM", n)
    t_flops, t_bytes = c.flops / c.peak_flops, c.bytes / c.bandwidth_bytes_per_s
    return card(
        rng,
        f"A {n}-token prefill of Llama-2-70B at batch 1 on an H100 is compute-bound: it takes its FLOPs ÷ peak.",
        f"A {n}-token prefill of Llama-2-70B at batch 1 on an H100 is memory-bound: reading the weights takes "
        "longer than the FLOPs.",
        [
            f"inference.prefill_cost: {c.intensity_flop_per_byte:.4g} FLOP/B against a ridge of "
            f"{c.ridge_flop_per_byte:.4g} → {c.bound}-bound; FLOPs {t_flops * 1e3:.3g} ms, weight reads "
            f"{t_bytes * 1e3:.3g} ms.",
            "A prefill turns compute-bound only beyond about the ridge point in tokens (batch × prompt).",
        ],
        "Each weight is read once and used once per prompt token.",
        params={"tokens": n},
    )


@card_family("cards.kv_per_token", "inference", SEC_SIZES, REF_KV)
def _c_kv_token(rng):
    kib = {m: inference.kv_bytes_per_token(m) / 1024 for m in ("llama-3-8b", "llama-2-70b", "llama-2-7b")}
    return card(
        rng,
        "One token of KV cache takes about 1 MB, whatever the model.",
        f"One token of KV cache takes 2 · layers · KV heads · head dim · bytes: {kib['llama-3-8b']:g} KiB for "
        "Llama-3-8B in bf16.",
        [
            "bf16, inference.kv_bytes_per_token: " + ", ".join(f"{m} {v:g} KiB" for m, v in kib.items()) + ".",
            "Layers, KV heads (GQA) and the cache dtype change it by an order of magnitude.",
        ],
        "Write the bytes per token of one layer's K and V.",
    )


@card_family("cards.kv_long_request", "inference", SEC_SIZES, REF_KV)
def _c_kv_request(rng):
    tokens = pick(rng, [32768, 16384])
    b = inference.kv_cache_bytes("llama-2-70b", tokens)
    return card(
        rng,
        f"One {tokens // 1024}K-token request to Llama-2-70B holds about {2 * tokens / 32768:g} GB of KV cache.",
        f"One {tokens // 1024}K-token request to Llama-2-70B holds about {b / 1e9:.3g} GB of KV cache (bf16).",
        [
            f"inference.kv_bytes_per_token('llama-2-70b') = {inference.kv_bytes_per_token('llama-2-70b'):,.0f} B "
            f"(GQA, 8 KV heads × 128, 80 layers); × {tokens} tokens = {b:,} B = {b / 2**30:g} GiB "
            "(inference.kv_cache_bytes).",
        ],
        "Bytes per token first, then times the tokens.",
        params={"tokens": tokens},
    )


@card_family(
    "cards.seventy_b_one_gpu",
    "inference",
    SEC_SIZES,
    "docs/references.md#llama2, #nvidia-datasheets",
)
def _c_70b(rng):
    w = inference.weight_bytes("llama-2-70b")
    g = hardware.gpu("H100-SXM")
    return card(
        rng,
        "Llama-2-70B in bf16 can be served from one 80 GB H100.",
        "Llama-2-70B in bf16 does not fit on one 80 GB H100: serving it needs at least 2 GPUs (TP ≥ 2).",
        [
            f"inference.weight_bytes: {w / 1e9:.4g} GB of bf16 weights; the H100 holds {g.fit_memory_label} "
            f"(hardware.gpu('H100-SXM').fits: {g.fits(w)}), before any KV cache.",
        ],
        "2 bytes per parameter.",
    )


@card_family(
    "cards.speculative_tokens",
    "serving",
    "notebooks/16_speculative_and_structured_decoding.ipynb, "
    "§3 Acceptance rate, tokens per forward, speed-up and the best k",
    "docs/references.md#speculative-leviathan (arXiv:2211.17192, Eq. 1)",
)
def _c_spec(rng):
    alpha, k = pick(rng, [0.8, 0.7]), pick(rng, [5, 6])
    right, wrong = speculative.expected_tokens_per_step(alpha, k), speculative.expected_tokens_per_step(alpha, k - 1)
    return card(
        rng,
        f"With acceptance rate {alpha} and {k} drafted tokens, speculative decoding yields {wrong:.3g} tokens "
        "per target forward.",
        f"With acceptance rate {alpha} and {k} drafted tokens, speculative decoding yields {right:.4g} tokens "
        "per target forward.",
        [
            f"(1 − α^(k+1))/(1 − α) = {right:.4g} at α = {alpha}, k = {k} "
            f"(inference.speculative.expected_tokens_per_step); {wrong:.4g} is the value for k = {k - 1}.",
        ],
        "The sum runs over α^0 … α^k: k + 1 terms (the bonus token counts).",
        params={"alpha": alpha, "k": k},
    )


@card_family(
    "cards.async_rlhf",
    "rl",
    "notebooks/19_rlhf_systems.ipynb, §3 Placement on Ray: co-located, disaggregated, one step off-policy",
    "docs/references.md#openrlhf, #ray",
)
def _c_async(rng):
    gen, train, sync = pick(rng, [8.0, 10.0]), pick(rng, [1.0, 2.0]), 0.5
    s, a = rl_sizing.sync_step_s(gen, train, sync), rl_sizing.async_step_s(gen, train, sync)
    e = rl_sizing.sync_step_s(5.0, 5.0, sync) / rl_sizing.async_step_s(5.0, 5.0, sync)
    return card(
        rng,
        f"Running generation one step ahead of training (asynchronous RLHF) makes a step 1.5–2× faster; here "
        f"generation takes {gen:g} s, training {train:g} s, the weight sync {sync:g} s.",
        f"Asynchronous RLHF speeds a step up by (gen + train + sync)/(max(gen, train) + sync), at most 2×; here "
        f"generation takes {gen:g} s, training {train:g} s, the weight sync {sync:g} s: {s / a:.3g}×.",
        [
            f"rl.sizing: synchronous {s:g} s, asynchronous {a:g} s per step → {s / a:.3g}×; with gen = train = 5 s "
            f"it would be {e:.3g}×.",
            "Async RLHF trains one step off-policy: it needs staleness control or importance correction.",
        ],
        "Which phase does the overlap hide, and how long is the other?",
        params={"gen_s": gen, "train_s": train, "sync_s": sync},
    )


@card_family(
    "cards.rlhf_adam_states",
    "rl",
    "notebooks/18_rlhf.ipynb, §8 The memory of RLHF at scale",
    "docs/references.md#zero (arXiv:1910.02054, §3.1), #instructgpt",
)
def _c_rlhf_adam(rng):
    tp = pick(rng, [8, 4])
    one = memory.model_state_bytes(70e9 / tp)
    moments, masters = 2 * one.optimizer, 2 * one.master
    return card(
        rng,
        f"A 70B actor and a 70B critic, each split over TP {tp}, hold {moments / 2e9:.4g} GB of Adam states per GPU.",
        f"A 70B actor and a 70B critic, each split over TP {tp}, hold {moments / 1e9:.4g} GB of Adam moments per "
        f"GPU, {(moments + masters) / 1e9:.4g} GB with the fp32 master weights.",
        [
            f"Per model {70 / tp:g}B parameters per GPU: moments {one.optimizer / 1e9:g} GB, master "
            f"{one.master / 1e9:g} GB (memory.model_state_bytes); two trained models double both.",
            "Counting one model's moments forgets the critic, which is trained with Adam too.",
        ],
        "Two trained models, each with two fp32 moments.",
        params={"tp": tp},
    )


@card_family(
    "cards.gae_weight",
    "rl",
    "notebooks/17_rl_fundamentals.ipynb, §3 Generalised advantage estimation",
    "docs/references.md#gae (arXiv:1506.02438, Eq. 16)",
)
def _c_gae(rng):
    import torch

    from ...rl.gae import gae

    t = 10
    r = torch.zeros(t + 1, dtype=torch.float64)
    r[t] = 1.0  # one TD error of 1 at step t, none elsewhere
    adv, _ = gae(r, torch.zeros_like(r), torch.zeros_like(r), torch.tensor(0.0, dtype=torch.float64), 0.99, 0.95)
    w = float(adv[0])
    return card(
        rng,
        f"In GAE with γ = 0.99 and λ = 0.95, the TD error {t} steps ahead has weight 0.53.",
        f"In GAE with γ = 0.99 and λ = 0.95, the TD error {t} steps ahead has weight {w:.4f}.",
        [f"rl.gae on a rollout whose only TD error is 1 at step {t}: advantage at step 0 = (γλ)^{t} = {w:.4f}."],
        "(γλ) to the power of the distance: 0.9405^10.",
        params={"t": t},
    )


@card_family(
    "cards.kernel_launch",
    "kernels",
    "notebooks/21_inside_one_gpu.ipynb, §2 Arithmetic intensity and the roofline",
    "docs/references.md#nvidia-datasheets, #pytorch-profiler",
)
def _c_launch(rng):
    from ...runtime.gpu_record import lookup

    row = lookup("test_kernel_launch_latency", "launch cost per tiny kernel")[0]
    return card(
        rng,
        "Launching a CUDA kernel costs about 50 µs on the host.",
        f"Launching a CUDA kernel costs about {row['value']:.0f} µs on the host.",
        [
            f"Measured on {row['device']} ({row['date']}): {row['value']:.3g} {row['unit']} per launch, "
            f"{row['note']} (data/measured, runtime.gpu_record.lookup('test_kernel_launch_latency')).",
            "50 µs is about 5× the measured cost; CUDA graphs remove most of what remains.",
        ],
        "What did the GPU pack measure?",
    )


@card_family(
    "cards.fp8_kv_capacity",
    "quant",
    SEC_SPEED,
    "docs/references.md#kivi (arXiv:2402.02750), #fp8",
)
def _c_fp8_kv(rng):
    from ...inference import kv_cache

    model = pick(rng, ["llama-2-7b", "llama-3-8b"])
    bf16, fp8 = kv_cache.kv_block_bytes(model, 16, "bf16"), kv_cache.kv_block_bytes(model, 16, "fp8")
    return card(
        rng,
        "Storing the KV cache in FP8 instead of bf16 fits exactly twice the tokens in the same memory.",
        f"Storing the KV cache in FP8 with per-channel K and per-token V scales fits about {bf16 / fp8:.2f}× the "
        "tokens of bf16 in the same memory, not 2×.",
        [
            f"{model}, blocks of 16 tokens (inference.kv_cache.kv_block_bytes): bf16 {bf16:,} B, fp8 with fp32 scales "
            f"{fp8:,} B → {bf16 / fp8:.3g}× (the fp32 residual of blocks not yet full costs more).",
            "Exactly 2× holds only with one scale per tensor; finer scales cost bytes: say which scheme.",
        ],
        "Count the scales' bytes.",
        params={"model": model},
    )


@card_family("cards.kv_requests_fit", "inference", SEC_SIZES, REF_KV)
def _c_requests(rng):
    ctx = pick(rng, [4096, 8192, 32768])
    per_request = inference.kv_cache_bytes("llama-2-70b", ctx)
    n = int(480e9 // per_request)
    claimed = {4096: 375, 8192: 187, 32768: 46}[ctx]  # the tutorial's figures
    return card(
        rng,
        f"With 480 GB free for the KV cache, Llama-2-70B holds {claimed} requests of {ctx // 1024}K tokens.",
        f"With 480 GB free for the KV cache, Llama-2-70B holds {n} requests of {ctx // 1024}K tokens.",
        [
            f"inference.kv_cache_bytes('llama-2-70b', {ctx}) = {per_request:,} B per request; "
            f"480e9 B ÷ that = {480e9 / per_request:.4g} → {n} whole requests ({int(480 * 2**30 // per_request)} "
            "if the 480 were GiB).",
        ],
        "Bytes per token × tokens per request, then divide.",
        params={"ctx": ctx},
    )


@card_family(
    "cards.serving_gpus_batching",
    "serving",
    SEC13 + ", §4 Prefill and decode on the roofline",
    "docs/references.md#roofline, #vllm",
)
def _c_serving_gpus(rng):
    import math

    from .serving import gpus_for_decode_target

    model, rps = "llama-3-8b", pick(rng, [2000, 10000, 50000])
    one = inference.decode_cost(model, "H100-SXM", 150, batch=1).time_s
    n, batch, step = gpus_for_decode_target(model, "H100-SXM", 150, rps * 50, 50)
    w70 = inference.weight_bytes("llama-2-70b")
    return card(
        rng,
        f"Decoding {rps} requests/s of 50 new tokens each (100-token prompts) with {model} on H100s takes "
        f"{math.ceil(rps * 50 * one)} GPUs: a GPU decodes one request at a time, {1 / one:.3g} tokens/s.",
        f"Decoding {rps} requests/s of 50 new tokens each (100-token prompts) with {model} on H100s takes {n} "
        f"GPUs: each decodes a batch of up to {batch} requests, every one still at 50 tokens/s or more.",
        [
            f"Roofline at context 150: batch 1 step {one * 1e3:.3g} ms; batch {batch} step {step * 1e3:.3g} ms, "
            f"{batch / step:,.0f} tokens/s per GPU → ceil({rps * 50:,} / that) = {n} "
            "(inference.decode_cost, inference.max_concurrent_sequences; decode only, prefill is extra).",
            f"A batch-1 rate per GPU for Llama-2-70B prices hardware it does not fit: {w70 / 1e9:.4g} GB of bf16 "
            "weights against 80 GB (inference.weight_bytes).",
        ],
        "A decode step reads the weights once for the whole batch.",
        params={"preset": model, "gpu": "H100-SXM", "context": 150, "per_user": 50, "target": rps * 50},
    )


@card_family(
    "cards.rollout_one_gpu",
    "rl",
    "notebooks/18_rlhf.ipynb, §8 The memory of RLHF at scale",
    "docs/references.md#llama2, #gqa (arXiv:2305.13245)",
)
def _c_rollout_gpu(rng):
    batch = pick(rng, [64, 512])
    fits = {t: inference.max_concurrent_sequences("llama-2-70b", "H100-SXM", 150, tp=t) for t in (1, 2, 4, 8)}
    tp = min(t for t, n in fits.items() if n >= batch)
    w, kv = inference.weight_bytes("llama-2-70b"), inference.kv_cache_bytes("llama-2-70b", 150 * batch)
    return card(
        rng,
        f"The rollouts of an RLHF step, {batch} responses of a 70B policy (Llama-2-70B, 100-token prompts, 50 new "
        "tokens), can be generated and timed on one 80 GB H100.",
        f"The rollouts of an RLHF step, {batch} responses of a 70B policy (Llama-2-70B, 100-token prompts, 50 new "
        f"tokens), need at least {tp} H100s of 80 GB (TP {tp}) for the bf16 weights and the KV cache.",
        [
            f"inference.weight_bytes: {w / 1e9:.4g} GB of weights; inference.kv_cache_bytes: {kv / 1e9:.3g} GB of "
            f"cache for {batch} × 150 tokens; inference.max_concurrent_sequences fits {batch} first at tp = {tp}.",
            "Time the generation on the GPUs that hold it: its share of the cluster, not one device.",
        ],
        "Weights alone: 2 bytes per parameter.",
        params={"batch": batch},
    )
