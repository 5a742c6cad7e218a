"""Families of the topic ``rl``: RL and RLHF (GAE, PPO's clipped objective, GRPO advantages, the DPO
loss, the k3 KL estimate, RLHF memory, weight sync, asynchronous RLHF).

Answer keys: ``mlsys_nb.rl`` (``gae``, ``ppo``, ``rlhf``, ``placement``), ``rl.sizing.rlhf_estimate``,
``comm.collective_time``.
"""

from __future__ import annotations

from ... import comm
from ..core import family
from ._util import gb, gbps, pick

REF_RLHF = "docs/references.md#instructgpt (Ouyang et al. 2022, arXiv:2203.02155), #openrlhf"


@family(
    "rl.rlhf_memory_per_gpu",
    "rl",
    difficulty=3,
    section="notebooks/18_rlhf.ipynb, §8 The memory of RLHF at scale",
    reference=REF_RLHF,
)
def _rlhf(rng):
    from ...rl.sizing import rlhf_estimate  # imports torch (through inference): only when this family draws

    actor = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"])
    ng = pick(rng, [8, 16, 32])
    batch = pick(rng, [64, 128, 256])
    r = rlhf_estimate(actor, n_gpus=ng, rollout_batch=batch, prompt_len=512, response_len=512)
    return dict(
        text=f"PPO-RLHF of {actor}, colocated on {ng} GPUs: actor and critic trained with ZeRO-3 (bf16-mixed "
        f"Adam, 16 B/param), reference and reward frozen bf16 (sharded), a rollout engine holding the "
        f"actor in bf16 and the KV cache of {batch} sequences × 1024 tokens. Bytes per GPU?",
        params={"actor": actor, "n_gpus": ng, "rollout_batch": batch},
        answer=r.per_gpu,
        unit="bytes",
        tolerance=0.03,
        hints=[
            "Four models: actor + critic 16 B/param / n each; reference + reward 2 B/param / n.",
            "Rollout: full bf16 actor weights (tp=1) + KV cache / n.",
        ],
        solution=[f"{row['part']}: {row['GB per GPU']:.4g} GB" for row in r.table()]
        + [f"Total {gb(r.per_gpu)} per GPU (rl.sizing.rlhf_estimate)."],
    )


@family(
    "rl.weight_sync_time",
    "rl",
    difficulty=2,
    section="notebooks/04_communication_cost.ipynb, §1 The α-β model (applied to RLHF weight sync)",
    reference=REF_RLHF,
)
def _sync(rng):
    n = pick(rng, [7e9, 13e9, 70e9])
    ranks = pick(rng, [4, 8, 16])
    beta = pick(rng, [25e9, 50e9, 450e9])
    alpha = 10e-6
    nbytes = 2 * n
    t = comm.collective_time("broadcast", nbytes, ranks, alpha, beta, "pipelined_chain")
    return dict(
        text=f"After each PPO step the trainer broadcasts the updated bf16 actor ({n:.3g} params) to {ranks} "
        f"rollout ranks as a pipelined chain (α = 10 us, β = {gbps(beta)}). Seconds?",
        params={"n_params": n, "n": ranks, "beta": beta, "alpha": alpha},
        answer=t,
        unit="seconds",
        hints=["Bytes = 2N.", "A pipelined chain: (n−1)α + S/β."],
        solution=[f"S = {nbytes:.4g} B; T = {t:.4g} s (comm.collective_time broadcast, pipelined_chain)."],
    )


@family(
    "rl.gae_advantage",
    "rl",
    difficulty=2,
    section="notebooks/17_rl_fundamentals.ipynb, §3 Generalised advantage estimation",
    reference="docs/references.md#gae (Schulman et al. 2015, arXiv:1506.02438, eq. 16)",
)
def _gae(rng):
    import numpy as np

    from ...rl.gae import gae

    T = 3
    r = np.array([pick(rng, [0.0, 1.0, 2.0]) for _ in range(T)])
    v = np.array([pick(rng, [0.0, 0.5, 1.0]) for _ in range(T)])
    last = pick(rng, [0.0, 1.0])
    gamma, lam = pick(rng, [0.9, 0.99]), pick(rng, [0.9, 0.95, 1.0])
    adv, _ = gae(r, v, np.zeros(T), np.array(last), gamma=gamma, lam=lam)
    if abs(float(adv[0])) < 1e-3:  # a zero key cannot be checked relatively: add a reward at t = 0
        r[0] += 1.0
        adv, _ = gae(r, v, np.zeros(T), np.array(last), gamma=gamma, lam=lam)
    a0 = float(adv[0])
    return dict(
        text=f"Rewards {r.tolist()}, values {v.tolist()}, value after the last step {last}, no episode end, "
        f"γ = {gamma}, λ = {lam}: the GAE advantage at t = 0?",
        params={"rewards": r.tolist(), "values": v.tolist(), "last_value": last, "gamma": gamma, "lam": lam},
        answer=a0,
        unit="ratio",
        tolerance=0.01,
        hints=["δ_t = r_t + γ V_{t+1} − V_t.", "A_0 = δ_0 + γλ δ_1 + (γλ)² δ_2."],
        solution=[f"A = {[round(float(a), 4) for a in adv]} (rl.gae.gae); A_0 = {a0:.4g}."],
    )


@family(
    "rl.ppo_clipped_objective",
    "rl",
    difficulty=2,
    section="notebooks/17_rl_fundamentals.ipynb, §5 PPO's clipped objective",
    reference="docs/references.md#ppo (Schulman et al. 2017, arXiv:1707.06347, eq. 7)",
)
def _ppo(rng):
    import math

    import torch

    from ...rl.ppo import ppo_loss

    ratio = pick(rng, [0.5, 0.7, 0.9, 1.1, 1.3, 1.6])
    adv = pick(rng, [-2.0, -1.0, 1.0, 2.0])
    eps = pick(rng, [0.1, 0.2])
    t = lambda x: torch.tensor([x])  # noqa: E731
    _, parts = ppo_loss(t(math.log(ratio)), t(0.0), t(adv), t(0.0), t(0.0), t(0.0), clip=eps, normalize=False)
    obj = -float(parts["policy"])
    return dict(
        text=f"PPO with clip ε = {eps}: probability ratio r = {ratio}, advantage A = {adv}. The clipped "
        f"surrogate objective (to maximise) for this sample?",
        params={"ratio": ratio, "advantage": adv, "clip": eps},
        answer=obj,
        unit="ratio",
        tolerance=0.005,
        hints=["L = min(r·A, clip(r, 1−ε, 1+ε)·A).", "For A < 0 the min picks the more negative value."],
        solution=[
            f"r·A = {ratio * adv:.4g}; clip(r)·A = {min(max(ratio, 1 - eps), 1 + eps) * adv:.4g}.",
            f"min = {obj:.4g} (rl.ppo.ppo_loss, policy part negated).",
        ],
    )


SEC18 = "notebooks/18_rlhf.ipynb"


@family(
    "rl.grpo_advantage",
    "rl",
    difficulty=2,
    section=SEC18 + ", §5 GRPO: group-relative advantages, no critic",
    reference="docs/references.md#grpo (Shao et al. 2024, arXiv:2402.03300, §4.1.2)",
)
def _grpo(rng):
    import torch

    from ...rl.rlhf import grpo_advantages

    for _ in range(20):
        g = pick(rng, [3, 4, 5])
        r = [float(pick(rng, [0, 0.5, 1, 2])) for _ in range(g)]
        i = rng.randrange(g)
        if len(set(r)) > 1 and r[i] != sum(r) / g:
            break
    a = float(grpo_advantages(torch.tensor([r]))[0, i])
    return dict(
        text=f"GRPO samples a group of {g} responses to one prompt with rewards {r}. The advantage of response "
        f"{i + 1} (group-normalised, sample standard deviation with Bessel's correction)?",
        params={"rewards": r, "index": i},
        answer=a,
        unit="ratio",
        tolerance=0.01,
        hints=["A_i = (r_i − mean) / std of the group.", "std with n − 1 in the denominator."],
        solution=[f"mean = {sum(r) / g:.4g}; A = {a:.4g} (rl.rlhf.grpo_advantages)."],
        diagnostics=[((g / (g - 1)) ** 0.5, "use the sample std (n − 1), as torch.std does")],
    )


@family(
    "rl.dpo_loss",
    "rl",
    difficulty=2,
    section=SEC18 + ", §6 DPO: the same preferences, offline, no reward model",
    reference="docs/references.md#dpo (Rafailov et al. 2023, arXiv:2305.18290, eq. 7)",
)
def _dpo(rng):
    import torch

    from ...rl.rlhf import dpo_loss

    pc, pr = pick(rng, [-10.0, -12.0, -15.0]), pick(rng, [-11.0, -14.0, -18.0])
    rc, rr = pick(rng, [-12.0, -13.0]), pick(rng, [-12.0, -13.0])
    beta = pick(rng, [0.1, 0.5, 1.0])
    t = lambda x: torch.tensor([x])  # noqa: E731
    v = float(dpo_loss(t(pc), t(pr), t(rc), t(rr), beta=beta))
    return dict(
        text=f"DPO with β = {beta}: sequence log-probs under the policy, chosen {pc}, rejected {pr}; under the "
        f"reference, chosen {rc}, rejected {rr}. The loss for this pair (nats)?",
        params={"pc": pc, "pr": pr, "rc": rc, "rr": rr, "beta": beta},
        answer=v,
        unit="nats/token",
        tolerance=0.01,
        hints=["margin = β·((π_c − ref_c) − (π_r − ref_r)).", "loss = −log σ(margin) = log(1 + e^(−margin))."],
        solution=[f"margin = {beta * ((pc - rc) - (pr - rr)):.4g}; loss = {v:.4g} (rl.rlhf.dpo_loss)."],
    )


@family(
    "rl.kl_k3_estimate",
    "rl",
    section=SEC18 + ", §3 PPO with a per-token KL penalty",
    reference="docs/references.md#kl-approx (Schulman 2020)",
)
def _k3(rng):
    import torch

    from ...rl.rlhf import kl_estimate

    lp, lr = pick(rng, [-1.0, -2.0, -0.5]), pick(rng, [-1.5, -2.5, -0.2, -3.0])
    v = float(kl_estimate(torch.tensor([lp]), torch.tensor([lr]), kind="k3")[0])
    return dict(
        text=f"A sampled token has log π = {lp} under the policy and log π_ref = {lr} under the reference. "
        f"Schulman's k3 estimate of KL(π‖π_ref) for this sample?",
        params={"logp": lp, "logp_ref": lr},
        answer=v,
        unit="nats/token",
        tolerance=0.01,
        hints=["q = log π_ref − log π.", "k3 = e^q − q − 1 (never negative)."],
        solution=[f"q = {lr - lp:.4g}; k3 = {v:.4g} (rl.rlhf.kl_estimate(kind='k3'))."],
        diagnostics=[(abs(lp - lr) / v if v else 1e9, "that is |k1|; k3 = e^q − q − 1")],
    )


@family(
    "rl.async_rlhf_speedup",
    "rl",
    difficulty=2,
    section="notebooks/19_rlhf_systems.ipynb, §3 Placement on Ray: co-located, disaggregated, one step off-policy",
    reference="docs/references.md#openrlhf (Hu et al. 2024, arXiv:2405.11143; Sheng et al. 2024, arXiv:2409.19256)",
)
def _async_rlhf(rng):
    from ...rl.placement import async_step_s, sync_step_s

    g = pick(rng, [20.0, 40.0, 60.0, 90.0])
    t = pick(rng, [15.0, 30.0, 45.0, 80.0])
    s = pick(rng, [0.5, 2.0, 5.0, 10.0])
    a, b = sync_step_s(g, t, s), async_step_s(g, t, s)
    return dict(
        text=f"Disaggregated PPO-RLHF: rollout GPUs generate a batch in {g:g} s, trainer GPUs train on it in {t:g} s, "
        f"and pushing the new weights to the rollout engines takes {s:g} s (nothing else runs meanwhile). "
        f"Going from synchronous (generate, train, sync in turn) to one-step off-policy asynchronous "
        f"(generation of step t+1 overlaps training of step t): speed-up in steps per hour (model)?",
        params={"gen_s": g, "train_s": t, "sync_s": s},
        answer=a / b,
        unit="ratio",
        hints=["Synchronous step: gen + train + sync.", "Asynchronous: max(gen, train) + sync (the sync cannot hide)."],
        solution=[
            f"sync {a:g} s, async {b:g} s per step (rl.placement.sync_step_s, async_step_s).",
            f"Speed-up {a / b:.4g}×; the price is data one policy version old.",
        ],
        diagnostics=[((g + t + s) / (max(g, t)) / (a / b), "the weight sync cannot overlap: add it to both")],
    )
