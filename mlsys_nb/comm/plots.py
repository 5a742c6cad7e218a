"""Pictures for collectives and their cost: who holds what, and time/bandwidth vs message size.

- :func:`draw_collective` / :func:`draw_collectives`: before/after per rank for the eight
  collectives, drawn from ``mlsys_nb.comm.collectives.collective_semantics`` (one colour per source
  rank; a reduced block shows one stripe per contributing rank; hatched = undefined).
- :func:`draw_ring_schedule`: which chunk each rank sends at each step of ring all-reduce.
- :func:`plot_times`, :func:`plot_busbw`: a ``mlsys_nb.comm.sweep`` DataFrame, log-log time vs
  size and busbw vs size (optionally against a memcpy ceiling).
- :func:`plot_fit`: measured times, the fitted α-β model and the held-out points.
- :func:`plot_algorithms`: α-β model time of several all-reduce algorithms vs size.
Every function returns the matplotlib ``Figure``.
"""

from __future__ import annotations

import numpy as np

from ..plots import PALETTE, label, new_figure, style

LETTERS = "abcdefghijklmnop"


def _block_label(block) -> str:
    if block is None:
        return "?"
    chunks = {c for _, c in block}
    if len(block) == 1:
        ((s, c),) = block
        return f"${LETTERS[c]}_{s}$"
    c = LETTERS[next(iter(chunks))] if len(chunks) == 1 else "x"
    return rf"$\Sigma {c}$"


def _draw_blocks(ax, per_rank, n_slots, title):
    from matplotlib.patches import Rectangle

    n = len(per_rank)
    for r, blocks in enumerate(per_rank):
        y = n - 1 - r
        for x, block in enumerate(blocks):
            if block is None:
                ax.add_patch(
                    Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, facecolor="#dddddd", edgecolor="#888888", hatch="//")
                )
            else:
                srcs = sorted({s for s, _ in block})
                w = 0.9 / len(srcs)
                for i, s in enumerate(srcs):
                    ax.add_patch(
                        Rectangle(
                            (x + 0.05 + i * w, y + 0.1),
                            w,
                            0.8,
                            facecolor=PALETTE[s % len(PALETTE)],
                            edgecolor="none",
                            alpha=0.85,
                        )
                    )
                ax.add_patch(Rectangle((x + 0.05, y + 0.1), 0.9, 0.8, fill=False, edgecolor="#333333"))
            ax.text(
                x + 0.5,
                y + 0.5,
                _block_label(block),
                ha="center",
                va="center",
                fontsize=9,
                color="black",
                bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.7),
            )
    ax.set_xlim(0, max(n_slots, 1))
    ax.set_ylim(0, n)
    ax.set_yticks([n - 1 - r + 0.5 for r in range(n)])
    ax.set_yticklabels([f"rank {r}" for r in range(n)])
    ax.set_xticks([x + 0.5 for x in range(n_slots)])
    ax.set_xticklabels([str(x) for x in range(n_slots)])
    ax.set_xlabel("buffer slot (chunk index)")
    ax.grid(False)
    ax.set_title(title)


def draw_collective(op: str, n: int = 4, root: int = 0, axes=None):
    """Before | after panels for one collective on ``n`` ranks. Block ``a_2`` = chunk a of rank 2's
    input; ``Σa`` = chunk a summed over the ranks whose colours it shows; hatched ``?`` =
    undefined content. Returns the Figure."""
    from .collectives import collective_semantics

    before, after = collective_semantics(op, n, root)
    if axes is None:
        fig, axes = new_figure(1, 2, figsize=(9, 0.45 * n + 1.2))
    fig = axes[0].figure
    slots = max(max(len(b) for b in before), max(len(a) for a in after))
    with style():
        rooted = op in ("broadcast", "scatter", "gather", "reduce")
        _draw_blocks(axes[0], before, slots, f"{op}" + (f" (root {root})" if rooted else "") + ": before")
        _draw_blocks(axes[1], after, slots, f"{op}: after")
    return fig


def draw_collectives(n: int = 4, ops=None, root: int = 0):
    """:func:`draw_collective` for every op (default: the eight of ``SEMANTICS_OPS``), one row each."""
    from .collectives import SEMANTICS_OPS

    ops = list(ops or SEMANTICS_OPS)
    fig, axes = new_figure(len(ops), 2, figsize=(9, len(ops) * (0.42 * n + 1.0)), squeeze=False)
    for i, op in enumerate(ops):
        draw_collective(op, n, root, axes=axes[i])
    return fig


def draw_ring_schedule(n: int = 4):
    """Ring all-reduce: the chunk each rank sends to its right neighbour at each of the ``2(n-1)``
    steps (reduce-scatter phase, then all-gather phase). Returns the Figure."""
    from matplotlib.patches import Rectangle

    fig, ax = new_figure(figsize=(max(7.0, 1.5 + 0.6 * 2 * (n - 1)), 0.45 * n + 1.6))
    with style():
        steps = 2 * (n - 1)
        for t in range(steps):
            for r in range(n):
                c = (r - t - 1) % n
                ax.add_patch(
                    Rectangle(
                        (t + 0.05, n - 1 - r + 0.1),
                        0.9,
                        0.8,
                        facecolor=PALETTE[c % len(PALETTE)],
                        alpha=0.35 if t < n - 1 else 0.8,
                        edgecolor="#333333",
                    )
                )
                ax.text(t + 0.5, n - 1 - r + 0.5, LETTERS[c], ha="center", va="center", fontsize=9)
        ax.axvline(n - 1, color="black", lw=1.5)
        ax.set_xlim(0, steps)
        ax.set_ylim(0, n)
        ax.set_xticks([t + 0.5 for t in range(steps)])
        ax.set_xticklabels([str(t) for t in range(steps)])
        ax.set_yticks([n - 1 - r + 0.5 for r in range(n)])
        ax.set_yticklabels([f"rank {r}" for r in range(n)])
        ax.grid(False)
        label(
            ax,
            "step (index): reduce-scatter | all-gather",
            "sender (rank)",
            f"ring all-reduce, n={n}: chunk each rank sends to its right neighbour",
        )
    return fig


def _series(df):
    keys = [k for k in ("op", "impl", "backend", "world_size") if k in df.columns]
    for key, g in df.groupby(keys):
        yield dict(zip(keys, key if isinstance(key, tuple) else (key,))), g.sort_values("bytes")


def _name(meta):
    return f"{meta.get('op', '')} {meta.get('impl', '')} n={meta.get('world_size', '')}".strip()


def plot_times(df, ax=None, title: str | None = "time per collective"):
    """Median time vs message size (log-log), quartile error bars, one line per series."""
    fig, ax = new_figure() if ax is None else (ax.figure, ax)
    with style():
        for i, (meta, g) in enumerate(_series(df)):
            yerr = np.vstack([g["median_s"] - g["q25_s"], g["q75_s"] - g["median_s"]])
            ax.errorbar(
                g["bytes"],
                g["median_s"],
                yerr=yerr,
                marker="o",
                ms=4,
                capsize=2,
                color=PALETTE[i % len(PALETTE)],
                label=_name(meta),
            )
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label(ax, "message size S (bytes, nccl-tests convention)", "time (s)", title)
        ax.legend()
    return fig


def plot_busbw(df, memcpy_bytes_per_s: float | None = None, ax=None, title: str | None = "bus bandwidth"):
    """busbw (GB/s = 1e9 B/s) vs message size; a dashed line at the memcpy ceiling if given."""
    fig, ax = new_figure() if ax is None else (ax.figure, ax)
    with style():
        for i, (meta, g) in enumerate(_series(df)):
            ax.plot(
                g["bytes"], g["busbw_Bps"] / 1e9, marker="o", ms=4, color=PALETTE[i % len(PALETTE)], label=_name(meta)
            )
        if memcpy_bytes_per_s:
            ax.axhline(memcpy_bytes_per_s / 1e9, ls="--", color="black", label="memcpy (same run)")
        ax.set_xscale("log", base=2)
        label(ax, "message size S (bytes, nccl-tests convention)", "busbw (GB/s)", title)
        ax.legend()
    return fig


def plot_fit(fit, train_bytes, train_s, test_bytes, test_s, ax=None):
    """Measured points (fitted ones filled, held-out ones open) and the fitted α-β line."""
    fig, ax = new_figure() if ax is None else (ax.figure, ax)
    with style():
        xs = np.logspace(
            np.log2(min(min(train_bytes), min(test_bytes))),
            np.log2(max(max(train_bytes), max(test_bytes))),
            100,
            base=2,
        )
        ax.plot(
            xs,
            fit.predict(xs),
            color=PALETTE[0],
            label=f"model: α = {fit.alpha_s * 1e6:.1f} µs, β = {fit.beta_bytes_per_s / 1e9:.2f} GB/s",
        )
        ax.plot(train_bytes, train_s, "o", color=PALETTE[1], label="measured, used for the fit")
        ax.plot(test_bytes, test_s, "s", mfc="none", color=PALETTE[3], ms=7, label="measured, held out")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label(ax, "message size S (bytes)", "time (s)", f"α-β fit ({fit.op}, {fit.algorithm} model, n={fit.n})")
        ax.legend()
    return fig


def plot_algorithms(
    model,
    n: int,
    sizes=None,
    algorithms=("ring", "tree", "recursive_doubling"),
    op: str = "all_reduce",
    ax=None,
    title: str | None = None,
):
    """α-β model time of each algorithm vs size for ``model`` (an ``AlphaBeta``) on ``n`` ranks;
    the ring/tree crossover (if any) is marked."""
    from .cost import crossover_bytes

    sizes = np.logspace(3, 31, 120, base=2) if sizes is None else np.asarray(sizes, dtype=float)
    fig, ax = new_figure() if ax is None else (ax.figure, ax)
    with style():
        for i, a in enumerate(algorithms):
            ax.plot(sizes, model.time(op, sizes, n, a), color=PALETTE[i % len(PALETTE)], label=a)
        s = crossover_bytes(n, model.alpha_s, model.beta_bytes_per_s, op, "ring", "tree")
        if s is not None and "ring" in algorithms and "tree" in algorithms:
            ax.axvline(s, ls=":", color="black", label=f"ring = tree at {s / 1e6:.3g} MB")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        label(
            ax,
            "message size S (bytes)",
            "model time (s)",
            title
            or f"{op} on {n} ranks: α = {model.alpha_s * 1e6:.3g} µs, β = {model.beta_bytes_per_s / 1e9:.3g} GB/s",
        )
        ax.legend()
    return fig
