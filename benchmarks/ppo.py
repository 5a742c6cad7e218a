"""PPO on CartPole-v1: mlsys_nb.rl.ppo.train_ppo vs stable-baselines3's PPO with rl-zoo's published settings.

    .venv/bin/python benchmarks/ppo.py [--seeds 10] [--quick]

Both train with the same hyper-parameters (rl-zoo, DLR-RM/rl-baselines3-zoo, CartPole-v1: 8 envs, n_steps 32,
batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, lr lin_1e-3, clip lin_0.2, 64-64 tanh actor and critic, one
torch thread) and the same stopping rule: a greedy evaluation over 100 episodes (``mlsys_nb.rl.evaluate_policy``,
same seeds) once the last 20 training episodes average >= 380, at most every 4096 steps; stop at a mean >= 475.
Per seed, the two run one after the other in this process (so load from other jobs falls on both alike).
Reported: env steps and wall time (training + evaluations, and training alone) to reach 475, medians and
ratios (ours / SB3; < 1 means ours is better). Then every trained policy of ours is evaluated again on 100
fresh seeds (1e7 + 1000 * seed + i), which is the check of "any seed reaches 475".
Full runs write data/measured/ppo.md, data/measured/ppo_cartpole.md and data/measured/ppo_cartpole.csv.
``--quick``: one seed, 256 steps each (one update: 8 envs x 32 steps), no evaluation, nothing written (used by tests).
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from mlsys_nb.rl import evaluate_policy, ppo, sb3_train
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.timing import Timer, median

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "data" / "measured"
QUICK_STEPS = 256  # one rollout and update of both implementations (8 envs x 32 steps), the fewest there are


def run(seeds: list[int], total_steps: int | None):
    import torch

    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # the first optimizer in a process imports torch._dynamo
    rows = []
    for seed in seeds:
        for name in ("mlsys_nb", "stable-baselines3"):
            with Timer() as t:
                if name == "mlsys_nb":
                    policy, curve = ppo.train_ppo("CartPole-v1", seed=seed, total_steps=total_steps, progress=False)
                else:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        _, curve = sb3_train("CartPole-v1", seed=seed, total_steps=total_steps or 100_000)
                    policy = None
            wall = t.seconds
            fresh = (
                float(evaluate_policy(policy, "CartPole-v1", 100, 10**7 + 1000 * seed).mean())
                if policy is not None and total_steps is None
                else float("nan")
            )
            rows.append(
                {
                    "seed": seed,
                    "method": name,
                    "reached_steps": curve.attrs["reached"],
                    "steps_run": int(curve.env_steps.iloc[-1]),
                    "wall_s": curve.wall_s.iloc[-1],
                    "train_s": curve.wall_s.iloc[-1] - curve.attrs["eval_s"],
                    "eval_s": curve.attrs["eval_s"],
                    "call_s": wall,
                    "passing_eval": curve.eval_return.max(),
                    "fresh_eval": fresh,
                }
            )
            print(
                f"seed {seed} {name:18s} reached {rows[-1]['reached_steps']} steps, {rows[-1]['wall_s']:.1f} s "
                f"(train {rows[-1]['train_s']:.1f} s)",
                flush=True,
            )
    return pd.DataFrame(rows)


def table(df: pd.DataFrame, quick: bool) -> str:
    col = "steps_run" if quick else "reached_steps"
    header = (
        f"| method | seeds | reached 475 | median env steps{' run' if quick else ' to 475'} | median wall s "
        "| median training s | steps ratio | wall ratio | training ratio |"
    )
    lines = [header, "|---|---|---|---|---|---|---|---|---|"]
    med = {}
    for name, g in df.groupby("method", sort=False):
        med[name] = (
            median(g[col].fillna(np.inf)),
            median(g.wall_s),
            median(g.train_s),
        )
    base = med["stable-baselines3"]
    for name, (s, w, t) in med.items():
        reached = int(df[df.method == name].reached_steps.notna().sum())
        lines.append(
            f"| {name} | {len(df[df.method == name])} | {reached} | {s:.0f} | {w:.2f} | {t:.2f} | "
            f"{s / base[0]:.2f} | {w / base[1]:.2f} | {t / base[2]:.2f} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    ap.add_argument("--quick", action="store_true", help="one seed, 256 steps (one update) each, write nothing")
    args = ap.parse_args()
    seeds = [0] if args.quick else list(range(args.seeds))
    start_machine = machine()
    df = run(seeds, QUICK_STEPS if args.quick else None)
    tab = table(df, args.quick)
    print(tab)
    print("ratio = mlsys_nb / stable-baselines3 (medians over seeds; < 1: ours needs fewer steps / less time)")
    if args.quick:
        return
    end_machine = machine()
    df = df.astype({"seed": int, "steps_run": int, "reached_steps": "Int64"})
    ours = df[df.method == "mlsys_nb"]
    OUT.mkdir(parents=True, exist_ok=True)
    ours.to_csv(OUT / "ppo_cartpole.csv", index=False, float_format="%.3f")
    (OUT / "ppo.md").write_text(
        "# PPO on CartPole-v1: mlsys_nb.rl.ppo vs stable-baselines3 (rl-zoo settings)\n\n"
        "Regenerate: `.venv/bin/python benchmarks/ppo.py` (both methods, seeds 0-9, one after the other per seed).\n"
        "Same hyper-parameters and stopping rule (greedy 100-episode evaluation >= 475, see the script's docstring).\n"
        "wall = training + evaluations; training = wall minus evaluation time.\n\n"
        f"- Machine at start: {start_machine}\n- Machine at end: {end_machine}\n\n" + tab + "\n\n"
        "Per seed:\n\n" + df.to_markdown(index=False, floatfmt=".2f") + "\n"
    )
    (OUT / "ppo_cartpole.md").write_text(
        "# PPO on CartPole-v1, seeds 0-9: every seed reaches 475\n\n"
        "`mlsys_nb.rl.ppo.train_ppo('CartPole-v1', seed=s)` with its defaults, one torch thread; it stops at the first\n"
        "greedy 100-episode evaluation with mean >= 475 (`passing_eval`). `fresh_eval`: the returned policy\n"
        "evaluated again, greedily, on 100 episodes with seeds never used in training (1e7 + 1000 s + i).\n"
        "Regenerate with `benchmarks/ppo.py` (also writes ppo_cartpole.csv).\n\n"
        f"- Machine at start: {start_machine}\n- Machine at end: {end_machine}\n\n"
        + ours[["seed", "reached_steps", "wall_s", "train_s", "passing_eval", "fresh_eval"]].to_markdown(
            index=False, floatfmt=".1f"
        )
        + "\n\n"
        f"All seeds >= 475 on fresh episodes: {bool((ours.fresh_eval >= 475).all())}; slowest seed "
        f"{ours.wall_s.max():.1f} s, most steps {int(ours.reached_steps.max())}.\n"
    )
    print(f"wrote {OUT / 'ppo.md'}, {OUT / 'ppo_cartpole.md'}, {OUT / 'ppo_cartpole.csv'}")


if __name__ == "__main__":
    main()
