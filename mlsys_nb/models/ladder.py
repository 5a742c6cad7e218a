"""A scaling ladder: tiny transformers trained on the synthetic Markov language under several
compute budgets, each run with fresh data (no token seen twice) and a cosine schedule matched to
its length, as in Chinchilla's iso-FLOP profiles.

``plan(budgets, sizes)`` turns FLOP budgets into runs: for every budget ``C`` and model shape the
run trains on ``D = C / flops_per_token(model)`` tokens (exact FLOPs, forward + backward, causal),
so C is real compute in FLOPs, not ``6ND``. ``run_ladder(...)`` trains them and returns a table
with ``N`` (all parameters), ``D``, ``C`` and the held-out loss on positions that see their full
context (whose floor is the language's entropy rate). ``fit_ladder(table)`` fits
``L = E + A/N^alpha + B/D^beta`` to it.
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


def train_run(cfg: ModelConfig, steps: int, lang: MarkovLanguage, *, batch: int, seed: int, eval_tokens) -> dict:
    """Train ``cfg`` for ``steps`` steps on fresh samples of ``lang``; return held-out loss."""
    import torch
    import torch.nn.functional as F

    from .transformer import Transformer

    torch.manual_seed(seed)
    model = Transformer(cfg)
    lr = lr_for(cfg.hidden)
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
):
    """Train the runs in ``rows`` (a slice of ``plan(...)``) and return the table with ``loss``
    (held-out, positions with full context), ``train_loss_last``, ``seconds`` and ``lr`` added, and
    attrs ``entropy_rate`` (nats/token, the true irreducible loss), ``eval_true_loss`` (the true
    model's loss on the same held-out tokens) and ``unigram_entropy``. Every run and the held-out
    set are seeded, so a slice trained on another process gives the same numbers."""
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
            results.append(train_run(cfg, r.steps, lang, batch=batch, seed=seed + 1, eval_tokens=eval_tokens))
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
    budgets=BUDGETS,
    sizes=SIZES,
    *,
    seq_len: int = 32,
    batch: int = BATCH,
    seed: int = 0,
    language: dict | None = None,
    eval_seqs: int = 512,
    threads: int | None = 1,
    min_steps: int = 20,
    max_steps: int = 800,
    progress: bool = True,
):
    """Plan and train a whole ladder in this process (see ``plan`` and ``train_rows``);
    ``run_ladder(**QUICK)`` is the seconds-long version."""
    lang = MarkovLanguage(**(language or LANGUAGE))
    runs = plan(
        budgets, sizes, seq_len=seq_len, batch=batch, vocab=lang.vocab, min_steps=min_steps, max_steps=max_steps
    )
    return train_rows(
        runs,
        seq_len=seq_len,
        batch=batch,
        seed=seed,
        language=language,
        eval_seqs=eval_seqs,
        threads=threads,
        progress=progress,
    )


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
