"""RLHF on the tiny task of mlsys_nb.rl.rlhf: PPO (beta = 0.3 and 0), GRPO and DPO over several seeds.

    .venv/bin/python benchmarks/rlhf.py [--seeds 5] [--quick]

Per seed: SFT (150 steps) and a reward model (150 Bradley-Terry steps, normalised on SFT samples), then the
four runs with the settings notebook 18 uses (30 RL iterations of 32 responses; DPO 100 steps of 64 pairs), one
torch thread. Reported per run: the mean true reward, reward-model score, KL(policy || reference) (k1 summed
over the response) and length of 128 fresh samples before and after, wall seconds (measured, including the
evaluations) and training FLOPs (a model: 2N per token per forward, 6N per forward + backward). The table
shows the margins of the thresholds notebook 18 and tests/test_rlhf.py assert, and the compute of GRPO and DPO
relative to PPO (ratio < 1: cheaper).
Full runs write data/measured/rlhf.md. ``--quick``: one seed, 1 SFT / RM step, 1 iteration / 1 DPO step, nothing written.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from mlsys_nb.runtime.machine import summary as machine

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "measured"


def run(seeds: list[int], quick: bool) -> pd.DataFrame:
    import torch

    from mlsys_nb.rl import rlhf as R

    torch.set_num_threads(1)
    # quick: one step of each (a smoke test of every code path; the evaluations before and after still run)
    steps, iters, dpo_steps = (1, 1, 1) if quick else (150, 30, 100)
    rows = []
    for seed in seeds:
        pol = R.new_policy(seed=seed)
        R.sft(pol, R.make_demos(2000, seed), steps=steps, batch=32, seed=seed)
        pairs = R.make_preferences(2400, seed + 1)
        rm, _ = R.train_reward_model(pairs[:2000], init=pol, steps=steps, batch=32, seed=seed)
        rm.normalize(pol, seed=seed)
        acc = R.preference_accuracy(rm, pairs[2000:])
        common = {"seed": seed, "progress": False}
        runs = [
            ("PPO beta=0.3", R.ppo, (pol, rm), {"kl_coef": 0.3, "iterations": iters}),
            ("PPO beta=0", R.ppo, (pol, rm), {"kl_coef": 0.0, "iterations": iters}),
            ("GRPO beta=0.3", R.grpo, (pol, rm), {"kl_coef": 0.3, "iterations": iters}),
            ("DPO beta=0.1", R.dpo, (pol, pairs[:2000], rm), {"beta": 0.1, "steps": dpo_steps}),
        ]
        for name, fn, args, kw in runs:
            _, h = fn(*args, **kw, **common)
            a, b = h.iloc[0], h.iloc[-1]
            rows.append(
                {
                    "seed": seed,
                    "method": name,
                    "rm_accuracy": acc,
                    "true_before": a.true_reward,
                    "true_after": b.true_reward,
                    "rm_after": b.rm_score,
                    "kl_after": b.kl,
                    "length_after": b.length,
                    "wall_s": b.wall_s,
                    "flops": b.flops,
                }
            )
            print(
                f"seed {seed} {name:14s} true {a.true_reward:.2f} -> {b.true_reward:.2f}, RM {b.rm_score:.2f}, "
                f"KL {b.kl:.1f}, {b.wall_s:.1f} s",
                flush=True,
            )
    return pd.DataFrame(rows)


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    g = df.groupby("method", sort=False)
    out = g[["true_before", "true_after", "rm_after", "kl_after", "length_after", "wall_s", "flops"]].median()
    out["min true gain"] = g.apply(lambda d: (d.true_after - d.true_before).min())
    out["max KL"] = g.kl_after.max()
    out["wall / PPO"] = out.wall_s / out.loc["PPO beta=0.3", "wall_s"]
    out["FLOPs / PPO"] = out.flops / out.loc["PPO beta=0.3", "flops"]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    seeds = [0] if args.quick else list(range(args.seeds))
    start = machine()
    df = run(seeds, args.quick)
    table = summarise(df)
    pd.options.display.float_format = "{:,.3g}".format
    print(table.to_string())
    if args.quick:
        return
    ppo, ppo0 = df[df.method == "PPO beta=0.3"].set_index("seed"), df[df.method == "PPO beta=0"].set_index("seed")
    hacked = ((ppo0.rm_after > ppo.rm_after) & (ppo0.true_after < ppo.true_after - 2)).all()
    text = [
        f"# RLHF on the tiny task: PPO, PPO without KL, GRPO, DPO over seeds 0-{len(seeds) - 1}",
        "",
        "`benchmarks/rlhf.py` (settings of notebook 18, one torch thread). Medians over seeds; `min true gain` "
        "is the smallest true-reward gain of any seed, `max KL` the largest final KL (nats). Wall seconds are "
        "measured on this shared machine (noisy); FLOPs are a model (2N per token forward, 6N forward + "
        "backward).",
        "",
        f"- Machine at start: {start}",
        f"- Machine at end: {machine()}",
        "",
        table.to_markdown(floatfmt=".3g"),
        "",
        "Per seed:",
        "",
        df.to_markdown(index=False, floatfmt=".3g"),
        "",
        f"Reward hacking at beta = 0 in every seed (RM score above the beta = 0.3 run, true reward more than "
        f"2 below it): {bool(hacked)}.",
    ]
    (OUT / "rlhf.md").write_text("\n".join(text) + "\n")
    print(f"wrote {OUT / 'rlhf.md'}")


if __name__ == "__main__":
    main()
