"""RLHF systems on this machine: the three weight-sync paths and co-located / split / one-step off-policy
placement on Ray actors, measured beside their models.

    .venv/bin/python benchmarks/rlhf_systems.py [--quick]

1. Weight sync (``mlsys_nb.rl.weight_sync.measure_weight_sync``): 1 trainer + 2 rollout ranks, toy transformers of
   growing width; per path (file, bucketed broadcast, shared memory) the median seconds per sync, the
   bytes the broadcast's root put on the wire (kernel TCP counters) and a rollout received, bit-equality
   after every sync, and the alpha-beta model of the broadcast fitted to the measured times (gloo's
   binomial tree).
2. Placement (``mlsys_nb.rl.placement.run(task="rlhf")``): notebook 18's task (SFT policy and reward model
   trained once, PPO with the KL penalty, rollouts from the serving engine), co-located, split
   synchronous and split one-step off-policy, on a local Ray cluster of 2 CPUs. Per layout the median
   phase seconds measured inside the actors, the measured step beside the closed form (gen + sync +
   train, or max(gen, train) + sync), samples per second, and the true reward of every batch.

Full runs write data/measured/rlhf_systems.md. ``--quick``: one width (16), 2 ranks, one repeat, SFT and reward model
1 step each, 2 placement steps of 8 responses, nothing written, and by default the placement on in-process workers (``backend="local"``: no Ray cluster to
start; ``--backend ray`` to smoke-test Ray). ``--backend``: ``ray`` (default of full runs) or ``local``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
OUT = ROOT / "data" / "measured"

from mlsys_nb.runtime.machine import summary as machine  # noqa: E402


def weight_sync(quick: bool) -> tuple[pd.DataFrame, str]:
    from mlsys_nb.comm.cost import fit_alpha_beta
    from mlsys_nb.rl import weight_sync as ws

    hiddens = (16,) if quick else (64, 128, 256, 512)  # quick: the smallest width, 1 trainer + 1 rollout rank
    rows = ws.measure_weight_sync(hiddens, n_rollouts=1 if quick else 2, repeats=1 if quick else 5, timeout=300)
    df = pd.DataFrame(rows)
    df["MB"] = df.model_bytes / 1e6
    df["ms"] = df.seconds * 1e3
    b = df[df.path == "broadcast"]
    note = "one size: no fit"
    if len(b) >= 2:
        fit = fit_alpha_beta(b.model_bytes.values, b.seconds.values, op="broadcast", n=3, algorithm="binomial_tree")
        note = (
            f"alpha-beta model of the broadcast (gloo binomial tree, 3 ranks) fitted to the measured times: "
            f"alpha = {fit.alpha_s * 1e6:.0f} us, beta = {fit.beta_bytes_per_s / 1e9:.2f} GB/s, max relative "
            f"error {fit.max_rel_error:.0%}"
        )
    return df, note


def placement(quick: bool, seed: int = 0, backend: str = "ray") -> tuple[pd.DataFrame, dict]:
    from mlsys_nb.rl import placement as pl

    steps = 2 if quick else 20  # quick: 2 steps, the fewest in which async overlaps generation with training
    batch = 8 if quick else 32  # quick: a smoke test of every layout's code path, not a measurement
    runs = {}
    ray = backend == "ray"
    with pl.ray_session(num_cpus=2, object_store_mb=200) if ray else contextlib.nullcontext():
        # Ray's actors start up while the driver trains init; local workers are made by run()
        workers = [pl.actor_class().remote() for _ in range(2)] if ray else None
        init = pl.rlhf_init(seed=seed, steps=1 if quick else 150)
        for mode in ("colocated", "sync", "async"):
            runs[mode] = pl.run(
                mode,
                steps,
                task="rlhf",
                init=init,
                batch=batch,
                seed=seed,
                workers=workers,
                timeout_s=300,
                backend=backend,
            )
            print(f"seed {seed} {mode}: true reward per batch {np.round(runs[mode].rewards, 2).tolist()}", flush=True)
    table = pd.DataFrame(
        {
            m: {
                **r.medians(),
                "closed form s": r.model_step_s(),
                "measured / closed form": r.medians()["step_s"] / r.model_step_s(),
                "samples/s": r.throughput,
                "mean true reward": float(np.mean(r.rewards)),
                "last-5 true reward": float(np.mean(r.rewards[-5:])),
            }
            for m, r in runs.items()
        }
    ).T
    return table, runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seeds", type=int, default=3, help="seeds of the placement runs (quick: 1)")
    ap.add_argument(
        "--backend", choices=("ray", "local"), help="placement workers (default: local if --quick, else ray)"
    )
    args = ap.parse_args()
    backend = args.backend or ("local" if args.quick else "ray")
    start = machine()
    sync_df, note = weight_sync(args.quick)
    pd.options.display.float_format = "{:,.4g}".format
    per_path = sync_df.pivot(index="MB", columns="path", values="ms").rename(columns=lambda c: c + " ms")
    print(per_path.to_string())
    print(note)
    assert sync_df.equal.all(), "a rollout differed from the trainer after a sync"
    table, runs = placement(args.quick, backend=backend)
    print(table.to_string())
    if args.quick:
        return
    per_seed = [{"seed": 0, **{m: r.rewards for m, r in runs.items()}}]
    for seed in range(1, args.seeds):
        per_seed.append({"seed": seed, **{m: r.rewards for m, r in placement(False, seed, backend)[1].items()}})
    seeds = pd.DataFrame(
        [
            {
                "seed": row["seed"],
                **{f"{m} mean": float(np.mean(row[m])) for m in ("sync", "async")},
                **{f"{m} last-5": float(np.mean(row[m][-5:])) for m in ("sync", "async")},
                "sync = colocated": row["sync"] == row["colocated"],
            }
            for row in per_seed
        ]
    )
    print(seeds.to_string(index=False))
    where = "Ray" if backend == "ray" else "in-process workers (backend local)"
    bc = sync_df[sync_df.path == "broadcast"][["MB", "wire_sent", "rollout_wire_received"]]
    text = [
        "# RLHF systems: weight sync and placement, measured",
        "",
        "`benchmarks/rlhf_systems.py` (see its docstring). Times are measured on this shared 2-core machine "
        "(noisy); the alpha-beta line and the closed forms are models.",
        "",
        f"- Machine at start: {start}",
        f"- Machine at end: {machine()}",
        "",
        "## Weight sync, 1 trainer + 2 rollout ranks (milliseconds per sync, medians)",
        "",
        per_path.to_markdown(floatfmt=".4g"),
        "",
        f"Every rollout bit-equal to the trainer after every sync: {bool(sync_df.equal.all())}. {note}.",
        "",
        "Broadcast bytes on the wire (kernel TCP counters): the root sends the model to each child of gloo's "
        "binomial tree, each rollout receives it once.",
        "",
        bc.to_markdown(index=False, floatfmt=".4g"),
        "",
        f"## Placement on {where}: notebook 18's task, PPO, 32 responses per step, 20 steps",
        "",
        table.to_markdown(floatfmt=".4g"),
        "",
        "True reward of each batch (the weight version that sampled it in brackets):",
        "",
    ]
    for m, r in runs.items():
        text.append(f"- {m}: " + ", ".join(f"{x:.2f} [{v}]" for x, v in zip(r.rewards, r.versions)))
    text += [
        "",
        "Co-located and split synchronous runs are on-policy and sample the same batches (equal rewards step "
        "for step); the async run trains on batches sampled by weights one step old.",
        "",
        f"## Staleness and the true reward over {args.seeds} seeds (20 steps each)",
        "",
        "Mean true reward of the 20 batches and of the last 5, on-policy (sync) vs one step stale (async):",
        "",
        seeds.to_markdown(index=False, floatfmt=".3g"),
    ]
    (OUT / "rlhf_systems.md").write_text("\n".join(text) + "\n")
    print(f"wrote {OUT / 'rlhf_systems.md'}")


if __name__ == "__main__":
    main()
