"""A scaling ladder: tiny transformers trained on the synthetic Markov language under several
compute budgets, each run with fresh data (no token seen twice) and a cosine schedule matched to
its length, as in Chinchilla's iso-FLOP profiles.

``plan(budgets, sizes)`` turns FLOP budgets into runs: for every budget ``C`` and model shape the
run trains on ``D = C / flops_per_token(model)`` tokens (exact FLOPs, forward + backward, causal),
so C is real compute in FLOPs, not ``6ND``. ``run_ladder(...)`` trains them and returns a table
with ``N`` (all parameters), ``D``, ``C`` and the held-out loss on positions that see their full
context (whose floor is the language's entropy rate). ``fit_ladder(table)`` fits
``L = E + A/N^alpha + B/D^beta`` to it. ``seed_runs`` / ``seed_spread`` measure how much one run's loss
moves with the seed, and ``prediction_band`` says where a fresh run should land (notebook 11, section 7).
"""

from __future__ import annotations

import math


from ..config import ModelConfig
from .corpus import MarkovLanguage
from ..flops import flops_per_token, parameter_count
from ..runtime.timing import Timer

# (n_layers, hidden): head_dim 8, SwiGLU width ~8/3 h, all Llama-style
SIZES = [(1, 8), (2, 16), (2, 24), (2, 32), (2, 48), (3, 64)]
BUDGETS = [3e9, 1e10, 3e10, 1e11]
# CI / notebook quick mode: a few seconds of training in total (the stored full run is the evidence)
QUICK = dict(budgets=[3e8, 1e9], sizes=[(1, 8), (1, 12), (2, 16)], min_steps=10, max_steps=80)
LANGUAGE = dict(vocab=8, order=2, concentration=0.3, seed=0)
BATCH = 64  # sequences per step (tiny models are overhead-bound: a large batch is nearly free)


def model_config(n_layers: int, hidden: int, *, vocab: int, seq_len: int) -> ModelConfig:
    heads = max(1, hidden // 8)
    return ModelConfig(
        n_layers=n_layers,
        hidden=hidden,
        n_heads=heads,
        n_kv_heads=heads,
        vocab_size=vocab,
        seq_len=seq_len,
        name=f"L{n_layers}-h{hidden}",
    )


def plan(
    budgets=BUDGETS,
    sizes=SIZES,
    *,
    seq_len: int = 32,
    batch: int = BATCH,
    vocab: int = 8,
    min_steps: int = 20,
    max_steps: int = 800,
):
    """Runs for each (budget, size): tokens ``D = C / FLOPs-per-token``; runs with fewer than
    ``min_steps`` or more than ``max_steps`` optimizer steps (batch x seq_len tokens each) are
    dropped (too short to learn anything / too long for this machine)."""
    import pandas as pd

    rows = []
    for c in budgets:
        for n_layers, hidden in sizes:
            cfg = model_config(n_layers, hidden, vocab=vocab, seq_len=seq_len)
            fpt = flops_per_token(cfg, seq_len, backward=True, causal=True)
            steps = int(c / fpt // (batch * seq_len))
            if not (min_steps <= steps <= max_steps):
                continue
            rows.append(
                {
                    "C (FLOPs)": float(c),
                    "n_layers": n_layers,
                    "hidden": hidden,
                    "N (params)": parameter_count(cfg),
                    "FLOPs/token": fpt,
                    "steps": steps,
                    "D (tokens)": steps * batch * seq_len,
                }
            )
    return pd.DataFrame(rows)


def lr_for(hidden: int) -> float:
    """Peak AdamW learning rate: ~1/width, clipped (tuned by hand on this language)."""
    return float(min(2e-2, max(3e-3, 0.25 / hidden)))


def train_run(
    cfg: ModelConfig, steps: int, lang: MarkovLanguage, *, batch: int, seed: int, eval_tokens, lr_scale: float = 1.0
) -> dict:
    """Train ``cfg`` for ``steps`` steps on fresh samples of ``lang``; return held-out loss. ``lr_scale``
    multiplies the peak learning rate ``lr_for(hidden)`` (1: the ladder's; others: a mis-tuned run)."""
    import torch
    import torch.nn.functional as F

    from .transformer import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg)
    lr = lr_for(cfg.hidden) * lr_scale
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warm = max(1, steps // 20)

    def lr_factor(i):  # linear warm-up, then cosine decay to 10%
        if i < warm:
            return (i + 1) / warm
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (i - warm) / max(1, steps - warm)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    s = cfg.seq_len
    with Timer() as train:
        model.train()
        for i in range(steps):
            x = torch.from_numpy(lang.sample(batch, s + 1, seed=seed * 1_000_003 + i))
            loss = model(x[:, :-1], x[:, 1:])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
    train_s = train.seconds
    model.eval()
    with torch.no_grad():
        x = torch.from_numpy(eval_tokens)
        logits = model(x[:, :-1])
        k = lang.order  # targets at positions >= order see their full context
        ev = F.cross_entropy(logits[:, k - 1 :].reshape(-1, cfg.vocab_size), x[:, k:].reshape(-1)).item()
    return {"loss": ev, "train_loss_last": float(loss.item()), "seconds": train_s, "lr": lr}


def train_rows(
    rows,
    *,
    seq_len: int = 32,
    batch: int = BATCH,
    seed: int = 0,
    language: dict | None = None,
    eval_seqs: int = 512,
    threads: int | None = 1,
    progress: bool = False,
    lr_scale: float = 1.0,
):
    """Train the runs in ``rows`` (a slice of ``plan(...)``) and return the table with ``loss``
    (held-out, positions with full context), ``train_loss_last``, ``seconds`` and ``lr`` added, and
    attrs ``entropy_rate`` (nats/token, the true irreducible loss), ``eval_true_loss`` (the true
    model's loss on the same held-out tokens) and ``unigram_entropy``. Every run and the held-out
    set are seeded, so a slice trained on another process gives the same numbers. ``lr_scale``: see
    ``train_run`` (a mutation for tests)."""
    import torch

    lang = MarkovLanguage(**(language or LANGUAGE))
    eval_tokens = lang.sample(eval_seqs, seq_len + 1, seed=10_000_019)
    old_threads = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    results = []
    try:
        it = list(rows.itertuples(index=False))
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="ladder runs")
        for r in it:
            cfg = model_config(r.n_layers, r.hidden, vocab=lang.vocab, seq_len=seq_len)
            results.append(
                train_run(cfg, r.steps, lang, batch=batch, seed=seed + 1, eval_tokens=eval_tokens, lr_scale=lr_scale)
            )
    finally:
        torch.set_num_threads(old_threads)
    table = rows.copy()
    for k in ("loss", "train_loss_last", "seconds", "lr"):
        table[k] = [o[k] for o in results]
    table.attrs.update(
        entropy_rate=lang.entropy_rate, eval_true_loss=lang.true_loss(eval_tokens), unigram_entropy=lang.unigram_entropy
    )
    return table


def run_ladder(
    budgets=BUDGETS, sizes=SIZES, *, min_steps: int = 20, max_steps: int = 800, progress: bool = True, **train
):
    """Plan and train a whole ladder in this process: ``plan`` the runs, then ``train_rows`` them (``train``: its
    keywords, ``seq_len`` and ``batch`` passed to both); ``run_ladder(**QUICK)`` is the seconds-long version."""
    vocab = MarkovLanguage(**(train.get("language") or LANGUAGE)).vocab
    shape = {k: train[k] for k in ("seq_len", "batch") if k in train}  # the runs' shape: planned as trained
    runs = plan(budgets, sizes, vocab=vocab, min_steps=min_steps, max_steps=max_steps, **shape)
    return train_rows(runs, progress=progress, **train)


def load_measured(path=None):
    """The stored full ladder (``data/measured/scaling_ladder.csv``) with the language's attrs."""
    import pandas as pd

    from ..config import DATA_DIR

    table = pd.read_csv(path or DATA_DIR / "measured" / "scaling_ladder.csv")
    lang = MarkovLanguage(**LANGUAGE)
    table.attrs.update(entropy_rate=lang.entropy_rate, unigram_entropy=lang.unigram_entropy)
    return table


def fit_ladder(table, **kw):
    """Fit the Chinchilla form to a ladder table (columns ``N (params)``, ``D (tokens)``, ``loss``)."""
    from ..scaling import fit

    return fit(
        table["N (params)"].to_numpy(float),
        table["D (tokens)"].to_numpy(float),
        table["loss"].to_numpy(float),
        name="ladder fit",
        **kw,
    )


def iso_flop_optima(table):
    """Per budget, the run with the lowest loss (Chinchilla's approach 2 without the parabola)."""
    idx = table.groupby("C (FLOPs)")["loss"].idxmin()
    return table.loc[idx, ["C (FLOPs)", "N (params)", "D (tokens)", "loss"]].reset_index(drop=True)


# ---- the spread of one run's loss across seeds, and the prediction band of a fresh run --------------------------
SEED_SIZES = SIZES[:2]  # the runs notebook 11 re-trains: the two smallest budgets and shapes
SEED_BUDGETS = BUDGETS[:2]


def seed_runs(seeds, budgets=SEED_BUDGETS, sizes=SEED_SIZES, **kw):
    """The same runs trained at each of ``seeds`` (``train_rows(..., seed=s)``), one table with a ``seed``
    column: what ``data/measured/scaling_ladder_seeds.csv`` holds (``seed_runs(range(1, 13))`` and
    ``seed_runs(range(101, 113))`` on the CPU, one thread)."""
    import pandas as pd

    rows = plan(budgets, sizes)
    out = []
    for s in seeds:
        t = train_rows(rows, seed=int(s), **kw)
        t["seed"] = int(s)
        out.append(t)
    return pd.concat(out, ignore_index=True)


def load_seed_runs(path=None):
    """The stored seed runs (``seed_runs``): ``data/measured/scaling_ladder_seeds.csv``."""
    import pandas as pd

    from ..config import DATA_DIR

    return pd.read_csv(path or DATA_DIR / "measured" / "scaling_ladder_seeds.csv")


def seed_spread(runs):
    """Per run (budget, shape): the sample standard deviation across seeds of ``log(loss)`` (``log_sd``) and the
    number of seeds ``n``: the part of one run's loss that changes with the seed (initial weights, data order)."""
    import numpy as np

    g = runs.assign(log_loss=np.log(runs["loss"])).groupby(["C (FLOPs)", "N (params)"])["log_loss"]
    return g.agg(log_sd=lambda v: float(np.std(v, ddof=1)), n="count")


def band_z(k: int, n: int, alpha: float = 0.05) -> float:
    """Half-width of the prediction band, in standard deviations of ``log(loss)`` estimated from ``n`` seeds, so
    that ``k`` fresh runs checked together all fall inside with probability ``1 - alpha`` (Sidak: each run at
    ``(1 - alpha)^(1/k)``; Student's t with ``n - 1`` degrees of freedom, times ``sqrt(1 + 1/n)`` for a new
    draw against an estimated spread)."""
    from scipy.stats import t

    from ..config import check_int, check_number

    check_int("k (runs checked together)", k, 1)
    check_int("n (seeds behind the spread)", n, 2)
    check_number("alpha", alpha, 0, 1, lo_open=True, hi_open=True)
    per_run = 1 - (1 - alpha) ** (1 / k)
    return float(t.ppf(1 - per_run / 2, n - 1) * math.sqrt(1 + 1 / n))


def fit_misfit(fit, table, n_params: int = 5) -> float:
    """How far the stored runs sit from ``fit``'s curve: the root mean square of ``log(loss / fit)`` over the
    ``table``'s runs with ``n_params`` (the law's 5) degrees of freedom taken off, as a standard deviation."""
    import numpy as np

    N, D = table["N (params)"].to_numpy(float), table["D (tokens)"].to_numpy(float)
    resid = np.log(table["loss"].to_numpy(float)) - np.log(fit.loss(N, D))
    if len(resid) <= n_params:
        raise ValueError(f"{len(resid)} runs: the misfit needs more runs than the law's {n_params} parameters")
    return float(np.sqrt((resid**2).sum() / (len(resid) - n_params)))


def prediction_band(fit, N, D, log_sd, z: float, misfit: float):
    """Where a fresh run at ``(N, D)`` should land: ``fit``'s curve times ``exp(±z·sqrt(log_sd² + misfit²))``:
    the run's seed-to-seed spread (``seed_spread``) and the curve's own misfit (``fit_misfit``), in log-loss, at
    ``z`` of them (``band_z``). Arrays in; ``(centre, half_width_in_log, lo, hi)`` arrays out.

    Not the bootstrap range of the fitted curves: with the 10 resamples of a quick run its 2.5-97.5 % range is the
    extreme resamples' fits, and one degenerate resample stretched it to 1e24 at one seed."""
    import numpy as np

    N, D, log_sd = (np.asarray(a, dtype=float) for a in (N, D, log_sd))
    centre = np.asarray(fit.loss(N, D), dtype=float)
    half = z * np.sqrt(log_sd**2 + float(misfit) ** 2)
    return centre, half, centre * np.exp(-half), centre * np.exp(half)
