"""Families of the topic ``rl``: RL and RLHF (GAE, PPO's clipped objective, GRPO advantages, the DPO
loss, the k3 KL estimate, RLHF memory, weight sync, asynchronous RLHF).

Answer keys: ``mlsys_nb.rl`` (``gae``, ``ppo``, ``rlhf``, ``placement``), ``rl.sizing.rlhf_estimate``,
``comm.collective_time``.
"""

from __future__ import annotations

from ... import comm
from ..core import family
from ._util import gb, gbps, numeric_family, pick, picks, placement, rl_ppo, rl_sizing, rlhf


REF_RLHF = "docs/references.md#instructgpt (Ouyang et al. 2022, arXiv:2203.02155), #openrlhf"
SEC18 = "notebooks/18_rlhf.ipynb"
SEC_GAE = "notebooks/17_rl_fundamentals.ipynb, §3 Generalised advantage estimation"
REF_GAE = "docs/references.md#gae (Schulman et al. 2015, arXiv:1506.02438, eq. 16)"
SEC_RLHF_MEMORY = SEC18 + ", §8 The memory of RLHF at scale"
SEC_WEIGHT_SYNC = "notebooks/04_communication_cost.ipynb, §1 The α-β model (applied to RLHF weight sync)"
SEC_PPO = "notebooks/17_rl_fundamentals.ipynb, §5 PPO's clipped objective"
REF_PPO = "docs/references.md#ppo (Schulman et al. 2017, arXiv:1707.06347, eq. 7)"
SEC_GRPO = SEC18 + ", §5 GRPO: group-relative advantages, no critic"
REF_GRPO = "docs/references.md#grpo (Shao et al. 2024, arXiv:2402.03300, §4.1.2)"
SEC_DPO = SEC18 + ", §6 DPO: the same preferences, offline, no reward model"
REF_DPO = "docs/references.md#dpo (Rafailov et al. 2023, arXiv:2305.18290, eq. 7)"
SEC_KL = SEC18 + ", §3 PPO with a per-token KL penalty"
REF_KL = "docs/references.md#kl-approx (Schulman 2020)"
SEC_ASYNC = "notebooks/19_rlhf_systems.ipynb, §3 Placement on Ray: co-located, disaggregated, one step off-policy"
REF_ASYNC = "docs/references.md#openrlhf (Hu et al. 2024, arXiv:2405.11143; Sheng et al. 2024, arXiv:2409.19256)"


def _tensor(x):
    import torch

    return torch.tensor([x])


numeric_family(
    family("rl.rlhf_memory_per_gpu", difficulty=3, section=SEC_RLHF_MEMORY, reference=REF_RLHF),
    draw=lambda rng: picks(
        rng, actor=["llama-2-7b", "llama-3-8b", "llama-2-13b"], n_gpus=[8, 16, 32], rollout_batch=[64, 128, 256]
    ),
    calc=lambda p: rl_sizing.rlhf_estimate(
        p["actor"], n_gpus=p["n_gpus"], rollout_batch=p["rollout_batch"], prompt_len=512, response_len=512
    ),
    key=lambda r: r.per_gpu,
    unit="bytes",
    tolerance=0.03,
    text=lambda p: (
        f"PPO-RLHF of {p['actor']}, colocated on {p['n_gpus']} GPUs: actor and critic trained with ZeRO-3 "
        f"(bf16-mixed Adam, 16 B/param), reference and reward frozen bf16 (sharded), a rollout engine holding the "
        f"actor in bf16 and the KV cache of {p['rollout_batch']} sequences × 1024 tokens. Bytes per GPU?"
    ),
    hints=[
        "Four models: actor + critic 16 B/param / n each; reference + reward 2 B/param / n.",
        "Rollout: full bf16 actor weights (tp=1) + KV cache / n.",
    ],
    solution=lambda p, r: (
        [f"{row['part']}: {row['GB per GPU']:.4g} GB" for row in r.table()]
        + [f"Total {gb(r.per_gpu)} per GPU (rl.sizing.rlhf_estimate)."]
    ),
)


numeric_family(
    family("rl.weight_sync_time", difficulty=2, section=SEC_WEIGHT_SYNC, reference=REF_RLHF),
    draw=lambda rng: picks(rng, n_params=[7e9, 13e9, 70e9], n=[4, 8, 16], beta=[25e9, 50e9, 450e9], alpha=10e-6),
    calc=lambda p: comm.collective_time(
        "broadcast", 2 * p["n_params"], p["n"], p["alpha"], p["beta"], "pipelined_chain"
    ),
    unit="seconds",
    fields=lambda p, result: {"beta_gbps": gbps(p["beta"]), "grad_bytes": 2 * p["n_params"]},
    text=(
        "After each PPO step the trainer broadcasts the updated bf16 actor ({n_params:.3g} params) to {n} "
        "rollout ranks as a pipelined chain (α = 10 us, β = {beta_gbps}). Seconds?"
    ),
    hints=["Bytes = 2N.", "A pipelined chain: (n−1)α + S/β."],
    solution=["S = {grad_bytes:.4g} B; T = {result:.4g} s (comm.collective_time broadcast, pipelined_chain)."],
)


@family("rl.gae_advantage", difficulty=2, section=SEC_GAE, reference=REF_GAE)
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


def _ppo_objective(p) -> float:
    """The clipped surrogate of one sample (``rl.ppo.ppo_loss``'s policy part, negated)."""
    import math

    t = _tensor
    _, parts = rl_ppo.ppo_loss(
        t(math.log(p["ratio"])), t(0.0), t(p["advantage"]), t(0.0), t(0.0), t(0.0), clip=p["clip"], normalize=False
    )
    return -float(parts["policy"])


def _clipped(p) -> float:
    return min(max(p["ratio"], 1 - p["clip"]), 1 + p["clip"]) * p["advantage"]


numeric_family(
    family("rl.ppo_clipped_objective", difficulty=2, section=SEC_PPO, reference=REF_PPO),
    draw=lambda rng: picks(
        rng, ratio=[0.5, 0.7, 0.9, 1.1, 1.3, 1.6], advantage=[-2.0, -1.0, 1.0, 2.0], clip=[0.1, 0.2]
    ),
    calc=_ppo_objective,
    unit="ratio",
    tolerance=0.005,
    fields=lambda p, result: {"ra": p["ratio"] * p["advantage"], "clipped": _clipped(p)},
    text=(
        "PPO with clip ε = {clip}: probability ratio r = {ratio}, advantage A = {advantage}. The clipped "
        "surrogate objective (to maximise) for this sample?"
    ),
    hints=["L = min(r·A, clip(r, 1−ε, 1+ε)·A).", "For A < 0 the min picks the more negative value."],
    solution=[
        "r·A = {ra:.4g}; clip(r)·A = {clipped:.4g}.",
        "min = {result:.4g} (rl.ppo.ppo_loss, policy part negated).",
    ],
)


def _group(rng) -> dict:
    """A group of rewards, not all equal, and a response whose reward is not the group's mean."""
    for _ in range(20):
        g = pick(rng, [3, 4, 5])
        r = [float(pick(rng, [0, 0.5, 1, 2])) for _ in range(g)]
        i = rng.randrange(g)
        if len(set(r)) > 1 and r[i] != sum(r) / g:
            break
    return {"rewards": r, "index": i}


def _grpo_advantage(p) -> float:
    import torch

    return float(rlhf.grpo_advantages(torch.tensor([p["rewards"]]))[0, p["index"]])


numeric_family(
    family("rl.grpo_advantage", difficulty=2, section=SEC_GRPO, reference=REF_GRPO),
    draw=_group,
    calc=_grpo_advantage,
    unit="ratio",
    tolerance=0.01,
    fields=lambda p, result: {
        "g": len(p["rewards"]),
        "response": p["index"] + 1,
        "mean": sum(p["rewards"]) / len(p["rewards"]),
    },
    text=(
        "GRPO samples a group of {g} responses to one prompt with rewards {rewards}. The advantage of "
        "response {response} (group-normalised, sample standard deviation with Bessel's correction)?"
    ),
    hints=["A_i = (r_i − mean) / std of the group.", "std with n − 1 in the denominator."],
    solution=["mean = {mean:.4g}; A = {result:.4g} (rl.rlhf.grpo_advantages)."],
    diagnostics=lambda p, a: [
        ((len(p["rewards"]) / (len(p["rewards"]) - 1)) ** 0.5, "use the sample std (n − 1), as torch.std does")
    ],
)


numeric_family(
    family("rl.dpo_loss", difficulty=2, section=SEC_DPO, reference=REF_DPO),
    draw=lambda rng: picks(
        rng,
        pc=[-10.0, -12.0, -15.0],
        pr=[-11.0, -14.0, -18.0],
        rc=[-12.0, -13.0],
        rr=[-12.0, -13.0],
        beta=[0.1, 0.5, 1.0],
    ),
    calc=lambda p: float(
        rlhf.dpo_loss(_tensor(p["pc"]), _tensor(p["pr"]), _tensor(p["rc"]), _tensor(p["rr"]), beta=p["beta"])
    ),
    unit="nats/token",
    tolerance=0.01,
    fields=lambda p, result: {"margin": p["beta"] * (p["pc"] - p["rc"] - (p["pr"] - p["rr"]))},
    text=(
        "DPO with β = {beta}: sequence log-probs under the policy, chosen {pc}, rejected {pr}; under the "
        "reference, chosen {rc}, rejected {rr}. The loss for this pair (nats)?"
    ),
    hints=["margin = β·((π_c − ref_c) − (π_r − ref_r)).", "loss = −log σ(margin) = log(1 + e^(−margin))."],
    solution=["margin = {margin:.4g}; loss = {result:.4g} (rl.rlhf.dpo_loss)."],
)


numeric_family(
    family("rl.kl_k3_estimate", section=SEC_KL, reference=REF_KL),
    draw=lambda rng: picks(rng, logp=[-1.0, -2.0, -0.5], logp_ref=[-1.5, -2.5, -0.2, -3.0]),
    calc=lambda p: float(rlhf.kl_estimate(_tensor(p["logp"]), _tensor(p["logp_ref"]), kind="k3")[0]),
    unit="nats/token",
    tolerance=0.01,
    fields=lambda p, result: {"q": p["logp_ref"] - p["logp"]},
    text=(
        "A sampled token has log π = {logp} under the policy and log π_ref = {logp_ref} under the reference. "
        "Schulman's k3 estimate of KL(π‖π_ref) for this sample?"
    ),
    hints=["q = log π_ref − log π.", "k3 = e^q − q − 1 (never negative)."],
    solution=["q = {q:.4g}; k3 = {result:.4g} (rl.rlhf.kl_estimate(kind='k3'))."],
    diagnostics=lambda p, v: [(abs(p["logp"] - p["logp_ref"]) / v if v else 1e9, "that is |k1|; k3 = e^q − q − 1")],
)


def _step_times(p) -> tuple[float, float]:
    """(synchronous, one-step asynchronous) seconds per step (``rl.placement``)."""
    g, t, s = p["gen_s"], p["train_s"], p["sync_s"]
    return placement.sync_step_s(g, t, s), placement.async_step_s(g, t, s)


numeric_family(
    family("rl.async_rlhf_speedup", difficulty=2, section=SEC_ASYNC, reference=REF_ASYNC),
    draw=lambda rng: picks(
        rng, gen_s=[20.0, 40.0, 60.0, 90.0], train_s=[15.0, 30.0, 45.0, 80.0], sync_s=[0.5, 2.0, 5.0, 10.0]
    ),
    calc=_step_times,
    key=lambda ab: ab[0] / ab[1],
    unit="ratio",
    fields=lambda p, result: {"ratio": result[0] / result[1]},
    text=(
        "Disaggregated PPO-RLHF: rollout GPUs generate a batch in {gen_s:g} s, trainer GPUs train on it in "
        "{train_s:g} s, and pushing the new weights to the rollout engines takes {sync_s:g} s (nothing else "
        "runs meanwhile). Going from synchronous (generate, train, sync in turn) to one-step off-policy "
        "asynchronous (generation of step t+1 overlaps training of step t): speed-up in steps per hour "
        "(model)?"
    ),
    hints=["Synchronous step: gen + train + sync.", "Asynchronous: max(gen, train) + sync (the sync cannot hide)."],
    solution=[
        "sync {result[0]:g} s, async {result[1]:g} s per step (rl.placement.sync_step_s, async_step_s).",
        "Speed-up {ratio:.4g}×; the price is data one policy version old.",
    ],
    diagnostics=lambda p, ab: [
        (
            (p["gen_s"] + p["train_s"] + p["sync_s"]) / (max(p["gen_s"], p["train_s"])) / (ab[0] / ab[1]),
            "the weight sync cannot overlap: add it to both",
        )
    ],
)
