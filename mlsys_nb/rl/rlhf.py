"""RLHF on a tiny language model, end to end on a CPU: SFT, a reward model, PPO with a KL penalty, GRPO, DPO.

The task (readable, so a learner can see what the models are after)
--------------------------------------------------------------------
A prompt (``PROMPTS``: ``"Q1:"`` ... ``"Q4:"``) is followed by a response of letters ``a``/``b`` and an
end-of-sequence token. The hidden **true reward** (``true_reward``) is a rule: +1 per ``a``, minus 2 per
character beyond ``MAX_LEN = 8`` (rambling costs). The demonstrations (``make_demos``) are random a/b strings
of 1-8 characters, so a fine-tuned (SFT) policy writes about 2.25 ``a`` on average and the best response is
``"aaaaaaaa"`` (true reward 8).

The reward model never sees the rule: it is trained (Bradley-Terry) on preference pairs of such strings,
labelled by the true reward (``make_preferences``). In those pairs the **spurious feature, length,** goes with
the label (a longer string has room for more ``a``: the chosen response is the longer one in about 3 of 4
pairs), and no string is longer than 8, so the reward model has no evidence of the rambling penalty. A policy
that optimises the reward model hard writes past 8 characters: the reward-model score goes up and the true
reward goes down (reward hacking; Gao et al., 2022, arXiv:2210.10760, Figure 1). A KL penalty to the SFT
policy keeps the policy near what the reward model was trained on.

The four models of PPO-RLHF (Ouyang et al., 2022, arXiv:2203.02155, §3.5; Stiennon et al., 2020,
arXiv:2009.01325, eq. 1): the **actor** (policy, trained, starts as the SFT model), the **critic** (value
model, trained, starts as the reward model), the **reference** (frozen SFT model) and the **reward model**
(frozen). Per-token reward of a response y_1..y_T (``shaped_rewards``):

    r_t = -kl_coef * (log pi(y_t) - log pi_ref(y_t))  + [t == T] * RM(x, y)

the KL term is the k1 estimator (the sampled log-ratio; its sum over t is an unbiased estimate of the
sequence KL(pi || pi_ref)). Advantages come from ``mlsys_nb.rl.gae`` (gamma = 1) and the clipped loss
from ``mlsys_nb.rl.ppo.ppo_loss``.

- ``grpo``: group-relative advantages (Shao et al., 2024, arXiv:2402.03300, §4.1, eq. 3): G samples per
  prompt, advantage (r - mean_group) / std_group on every token, no critic, the KL to the reference in the
  loss with the k3 estimator ``exp(q) - q - 1``, q = log pi_ref - log pi (ibid., eq. 4; Schulman, 2020,
  "Approximating KL divergence", joschu.net).
- ``dpo``: Direct Preference Optimisation (Rafailov et al., 2023, arXiv:2305.18290, eq. 7), offline from the
  same preference pairs, no reward model, no sampling.

Rollouts come from ``rollout``: one batched sampling loop over the kit's ``inference.KVCache`` (prefill the
prompts, then one token per step), returning the tokens and the sampler's log-probabilities;
``engine_rollout`` samples the same layout with the kit's serving engine (``LLM.generate``), which is what
the Ray actors of ``placement`` (notebook 19) use. ``ppo_update`` is one PPO iteration on a batch.

Compute is reported two ways: wall seconds (measured on this machine) and FLOPs (a model: 2 N FLOPs per
token for a forward pass, 6 N for forward + backward, N = parameters of the model that ran; Kaplan et al.,
2020, arXiv:2001.08361, §2.1).
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import random
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

import pandas as pd
import torch
import torch.nn.functional as F
from torch import nn

from ..config import ModelConfig, check_choice, check_int, check_number, check_probability
from ..inference.kv_cache import KVCache
from ..inference.tokenizer import ByteTokenizer
from ..runtime.timing import Laps
from .gae import gae
from .ppo import ppo_loss

PROMPTS = ("Q1:", "Q2:", "Q3:", "Q4:")
ALPHABET = "ab"
MAX_LEN = 8  # longest demonstration; the true reward charges 2 per character beyond it
MAX_NEW_TOKENS = 16  # room to ramble past MAX_LEN
TOKENIZER = ByteTokenizer(320)
EOS = TOKENIZER.eos_id
PROMPT_LEN = 3  # every prompt is 3 bytes: no padding on the prompt side


def true_reward(text: str) -> float:
    """The hidden rule: +1 per ``a``, -2 per character beyond ``MAX_LEN`` (8)."""
    return float(text.count("a") - 2 * max(0, len(text) - MAX_LEN))


def rlhf_config(seq_len: int = 32) -> ModelConfig:
    """``config.tiny_config`` at the ``tiny`` preset's shape (``data/models.yaml``: 2 layers, hidden 64,
    4 heads, 2 KV heads, SwiGLU width 176, byte vocabulary 320) with a short context: enough for a 3-byte
    prompt and a 16-token response."""
    from ..config import tiny_config as _tiny

    return _tiny(hidden=64, ffn_hidden=176, vocab_size=320, seq_len=seq_len, name="tiny-rlhf")


# ------------------------------------------------------------------ data
def _random_response(rng: random.Random) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, MAX_LEN)))


def make_demos(n: int, seed: int = 0) -> list[tuple[str, str]]:
    """``n`` demonstrations ``(prompt, response)``: random a/b strings of 1-8 characters."""
    check_int("n", n, 1)
    rng = random.Random(seed)
    return [(rng.choice(PROMPTS), _random_response(rng)) for _ in range(n)]


def make_preferences(n: int, seed: int = 0) -> list[tuple[str, str, str]]:
    """``n`` preference pairs ``(prompt, chosen, rejected)`` of random a/b strings (1-8 characters), labelled
    by ``true_reward`` (ties are redrawn). Length goes with the label (a spurious feature: see the module)."""
    check_int("n", n, 1)
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        p, y1, y2 = rng.choice(PROMPTS), _random_response(rng), _random_response(rng)
        r1, r2 = true_reward(y1), true_reward(y2)
        if r1 != r2:
            out.append((p, y1, y2) if r1 > r2 else (p, y2, y1))
    return out


def encode_batch(prompts, responses, *, eos: bool = True):
    """Token ids [B, 3 + T] (responses right-padded with EOS) and the response mask [B, T] (True on the
    response's tokens, its EOS included)."""
    ids = [TOKENIZER.encode(r) + ([EOS] if eos else []) for r in responses]
    t = max(len(x) for x in ids)
    rows, masks = [], []  # built as lists, then one tensor each (a tensor op per row costs more than the row)
    for p, x in zip(prompts, ids):
        pi = TOKENIZER.encode(p)
        if len(pi) != PROMPT_LEN:
            raise ValueError(f"prompt {p!r} is not {PROMPT_LEN} bytes")
        rows.append(pi + x + [EOS] * (t - len(x)))
        masks.append([True] * len(x) + [False] * (t - len(x)))
    return torch.tensor(rows, dtype=torch.long), torch.tensor(masks, dtype=torch.bool)


def decode_responses(tokens: torch.Tensor, mask: torch.Tensor) -> list[str]:
    """The response texts of a batch (prompt stripped, EOS and padding dropped)."""
    return [TOKENIZER.decode(row[PROMPT_LEN:][m].tolist()) for row, m in zip(tokens, mask)]


# ------------------------------------------------------------------ models
def hidden_states(model, tokens: torch.Tensor) -> torch.Tensor:
    """The transformer's final normalised hidden states [B, S, hidden] (its forward without the LM head)."""
    x = model.embed(tokens)
    for blk in model.blocks:
        x = blk(x, model.rope_cos, model.rope_sin)
    return model.norm(x)


class ScalarModel(nn.Module):
    """A transformer trunk with a scalar head: the reward model (score at the last response token) and the
    critic (a value at every position)."""

    def __init__(self, trunk: nn.Module):
        super().__init__()
        self.trunk = trunk
        self.head = nn.Linear(trunk.cfg.hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)
        self.register_buffer("offset", torch.zeros(()))  # score = (sum - offset) / scale: see ``normalize``
        self.register_buffer("scale", torch.ones(()))

    def values(self, tokens: torch.Tensor) -> torch.Tensor:
        """One scalar per position [B, S]."""
        return self.head(hidden_states(self.trunk, tokens)).squeeze(-1)

    def score(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Score [B] of each sequence: the sum of the scalars at its response tokens (EOS included). A summed
        score can count (``a`` by ``a``), and it keeps counting past any length it was trained on."""
        return ((self.values(tokens)[:, PROMPT_LEN:] * mask).sum(1) - self.offset) / self.scale

    @torch.no_grad()
    def normalize(self, policy, n: int = 256, seed: int = 0) -> ScalarModel:
        """Shift and scale the score so the policy's samples score mean 0, std 1. Ouyang et al., 2022, §3.5,
        shift their reward model so demonstrations score 0 on average; scaling too gives the KL coefficient a
        fixed meaning (reward in standard deviations of the SFT policy's scores per nat of KL)."""
        self.offset.zero_()
        self.scale.fill_(1.0)
        ro = rollout(
            policy, [PROMPTS[i % len(PROMPTS)] for i in range(n)], generator=torch.Generator().manual_seed(seed)
        )
        s = self.score(ro.tokens, ro.mask)
        self.offset.fill_(float(s.mean()))
        self.scale.fill_(float(s.std()) if float(s.std()) > 0 else 1.0)  # an untrained (zero) head scores 0
        return self


def new_policy(cfg: ModelConfig | None = None, seed: int = 0):
    """A random-weight ``mlsys_nb.models.Transformer`` (``rlhf_config()`` by default)."""
    from ..models.transformer import Transformer

    torch.manual_seed(seed)
    return Transformer(cfg or rlhf_config())


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def token_logprobs(model, tokens: torch.Tensor, *, entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probability [B, T] of each response token under ``model`` and the entropy [B, T] of its
    next-token distribution (one forward over prompt + response). ``entropy=False``: None instead of the
    entropy, for the callers that only need the log-probabilities (the entropy is three more passes over
    [B, T, vocab]; the log-probabilities are the same bits either way)."""
    logits = model(tokens)[:, PROMPT_LEN - 1 : -1].float()
    logp_all = logits.log_softmax(-1)
    logp = logp_all.gather(-1, tokens[:, PROMPT_LEN:, None]).squeeze(-1)
    if not entropy:
        return logp, None
    return logp, -(logp_all.exp() * logp_all).sum(-1)


# ------------------------------------------------------------------ SFT and the reward model
def sft(model, demos, *, steps: int = 300, batch: int = 64, lr: float = 3e-3, seed: int = 0) -> list[float]:
    """Supervised fine-tuning on ``(prompt, response)`` demonstrations: cross-entropy on the response tokens
    (and EOS) only. Trains ``model`` in place; returns the loss per step."""
    check_int("steps", steps, 1)
    check_int("batch", batch, 1)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    model.train()
    for _ in range(steps):
        b = [demos[rng.randrange(len(demos))] for _ in range(batch)]
        tokens, mask = encode_batch([p for p, _ in b], [r for _, r in b])
        logp, _ = token_logprobs(model, tokens, entropy=False)
        loss = -(logp * mask).sum() / mask.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def bradley_terry_loss(chosen: torch.Tensor, rejected: torch.Tensor) -> torch.Tensor:
    """-log sigmoid(r_chosen - r_rejected), averaged (Bradley & Terry, 1952; Ouyang et al., 2022, eq. 1)."""
    return -F.logsigmoid(chosen - rejected).mean()


def _pair_tensors(pairs):
    prompts = [p for p, _, _ in pairs]
    return encode_batch(prompts, [c for _, c, _ in pairs]), encode_batch(prompts, [r for _, _, r in pairs])


def preference_accuracy(rm: ScalarModel, pairs) -> float:
    """Fraction of pairs where the reward model scores the chosen response higher."""
    (tc, mc), (tr, mr) = _pair_tensors(pairs)
    with torch.no_grad():
        return float((rm.score(tc, mc) > rm.score(tr, mr)).float().mean())


def train_reward_model(
    train_pairs, *, init=None, steps: int = 300, batch: int = 64, lr: float = 3e-3, seed: int = 0
) -> tuple[ScalarModel, list[float]]:
    """A reward model: a copy of ``init`` (a Transformer; a fresh ``tiny`` one if None) with a scalar head,
    trained with the Bradley-Terry loss. Returns ``(rm, losses)``; ``rm`` is frozen (eval mode)."""
    check_int("steps", steps, 1)
    trunk = copy.deepcopy(init) if init is not None else new_policy(seed=seed)
    rm = ScalarModel(trunk)
    rng = random.Random(seed)
    opt = torch.optim.AdamW(rm.parameters(), lr=lr, weight_decay=0.0)
    losses = []
    for _ in range(steps):
        (tc, mc), (tr, mr) = _pair_tensors([train_pairs[rng.randrange(len(train_pairs))] for _ in range(batch)])
        loss = bradley_terry_loss(rm.score(tc, mc), rm.score(tr, mr))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rm.eval().requires_grad_(False)
    return rm, losses


# ------------------------------------------------------------------ the trained start, kept on disk
START_DEMOS, START_PAIRS, START_TRAIN_PAIRS, START_BATCH = 2000, 2400, 2000, 32  # notebook 18's SFT and RM data
START_KEEP = 8  # trained starts kept on disk (the newest)
# the sources the SFT policy and reward model's training runs (relative to the package): any edit is a new key
START_SOURCES = ("rl/rlhf.py", "models", "config.py", "inference/tokenizer.py")


def start_cache_dir() -> Path:
    """Where ``save_start`` keeps trained starts: ``$MLSYS_NB_CACHE/rlhf`` if set, else ``~/.cache/mlsys_nb/rlhf``."""
    root = os.environ.get("MLSYS_NB_CACHE") or Path.home() / ".cache" / "mlsys_nb"
    return Path(root) / "rlhf"


def start_key(*, seed: int, steps: int, demos, train_pairs, batch: int = START_BATCH) -> str:
    """The cache key of an SFT policy + reward model trained the way notebook 18 and ``placement.rlhf_init``
    train them (``new_policy(seed)``, ``sft(..., steps, batch, seed)``, ``train_reward_model(train_pairs,
    init=policy, steps, batch, seed)``, the optimisers' defaults): a SHA-256 over every input of that
    training, the data themselves, the model's config, torch's version, thread count and CPU kernels
    (``ATEN_CPU_CAPABILITY``: other kernels sum in another order and train another model), and the source
    of every module the training runs (``START_SOURCES``), so an edit anywhere there makes a new key."""
    h = hashlib.sha256()
    h.update(repr((seed, steps, batch, demos, train_pairs, rlhf_config(), torch.__version__)).encode())
    h.update(repr((torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())).encode())
    pkg = Path(__file__).resolve().parent.parent
    for rel in START_SOURCES:
        p = pkg / rel
        for f in sorted(p.rglob("*.py")) if p.is_dir() else [p]:
            h.update(str(f.relative_to(pkg)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()


def save_start(policy, reward_model: ScalarModel, *, seed: int, steps: int, demos, train_pairs, cache_dir=None):
    """Keep a trained SFT policy and reward model (before ``normalize``: offset 0, scale 1) on disk under
    ``start_key`` of the inputs that trained them, for ``load_start`` (notebook 19's ``rlhf_init`` starts
    from notebook 18's run instead of training the same models again). Written to a temporary file and
    renamed (a reader never sees half a file); only the ``START_KEEP`` newest starts stay (~1 MB each: every
    edit of the training's source makes new keys). Returns the path."""
    if float(reward_model.offset) != 0.0 or float(reward_model.scale) != 1.0:
        raise ValueError("reward_model: save it before normalize() (offset 0, scale 1): the start is unnormalised")
    key = start_key(seed=seed, steps=steps, demos=demos, train_pairs=train_pairs)
    d = Path(cache_dir) if cache_dir is not None else start_cache_dir()
    d.mkdir(parents=True, exist_ok=True)
    path = d / f"{key}.pt"
    fd, tmp = tempfile.mkstemp(dir=d, suffix=".tmp")
    os.close(fd)
    try:
        torch.save({"key": key, "policy": policy.state_dict(), "reward": reward_model.state_dict()}, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    for old in sorted(d.glob("*.pt"), key=_mtime, reverse=True)[START_KEEP:]:
        old.unlink(missing_ok=True)  # a reader that loses it trains instead
    return path


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:  # removed by another writer meanwhile
        return 0.0


def load_start(*, seed: int, steps: int, demos, train_pairs, cache_dir=None) -> dict | None:
    """The ``{"policy": state_dict, "reward": state_dict}`` that ``save_start`` kept for exactly these inputs,
    or None when there is none (or it cannot be read, or it names another key): then train."""
    key = start_key(seed=seed, steps=steps, demos=demos, train_pairs=train_pairs)
    path = (Path(cache_dir) if cache_dir is not None else start_cache_dir()) / f"{key}.pt"
    try:
        got = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # absent, half-written by an older writer, corrupt: train instead
        return None
    if not isinstance(got, dict) or got.get("key") != key:
        return None
    return {"policy": got["policy"], "reward": got["reward"]}


# ------------------------------------------------------------------ rollouts
@dataclass
class Rollouts:
    tokens: torch.Tensor  # [B, 3 + T] prompt + response (EOS-padded after the end)
    mask: torch.Tensor  # [B, T] True on response tokens (EOS included)
    logprobs: torch.Tensor  # [B, T] the sampler's log-probabilities of the sampled tokens (0 on padding)

    @property
    def texts(self) -> list[str]:
        return decode_responses(self.tokens, self.mask)


@torch.no_grad()
def rollout(
    policy,
    prompts,
    *,
    max_new_tokens: int = MAX_NEW_TOKENS,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
) -> Rollouts:
    """Sample one response per prompt with the kit's KV cache: prefill all prompts in one forward, then one
    token per step for every row (rows that emitted EOS keep going, masked). Returns ``Rollouts``."""
    check_int("max_new_tokens", max_new_tokens, 1)
    check_number("temperature", temperature, 0.0, lo_open=True)
    b = len(prompts)
    tokens = torch.full((b, PROMPT_LEN + max_new_tokens), EOS, dtype=torch.long)
    tokens[:, :PROMPT_LEN] = torch.tensor([TOKENIZER.encode(p) for p in prompts])
    logprobs = torch.zeros(b, max_new_tokens)
    mask = torch.zeros(b, max_new_tokens, dtype=torch.bool)
    alive = torch.ones(b, dtype=torch.bool)
    cache = KVCache(policy, b, PROMPT_LEN + max_new_tokens)
    logits = policy(tokens[:, :PROMPT_LEN], cache=cache)[:, -1]
    for t in range(max_new_tokens):
        logp = (logits.float() / temperature).log_softmax(-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(-1)
        mask[:, t] = alive
        nxt = torch.where(alive, nxt, EOS)
        logprobs[:, t] = torch.where(alive, logp.gather(-1, nxt[:, None]).squeeze(-1), 0.0)
        tokens[:, PROMPT_LEN + t] = nxt
        alive = alive & (nxt != EOS)
        if not alive.any() or t == max_new_tokens - 1:
            break
        logits = policy(nxt[:, None], cache=cache)[:, -1]
    return Rollouts(tokens, mask, logprobs)


def engine_rollout(llm, prompts, *, max_new_tokens: int = MAX_NEW_TOKENS, seed: int = 0) -> Rollouts:
    """``rollout`` through the kit's serving engine: ``llm`` is an ``inference.engine.LLM`` around the policy
    (continuous batching, paged KV cache; weights updated with ``llm.load_weights``). Temperature 1, one
    seeded generator per request (``seed + i``), the sampled tokens' log-probabilities from the engine
    (``logprobs=0``: at temperature 1 they are the sampling distribution's). Same ``Rollouts`` layout."""
    from ..inference import SamplingParams

    check_int("max_new_tokens", max_new_tokens, 1)
    b = len(prompts)
    params = [SamplingParams(temperature=1.0, max_tokens=max_new_tokens, seed=seed + i, logprobs=0) for i in range(b)]
    outs = llm.generate([TOKENIZER.encode(p) for p in prompts], params, use_tqdm=False)
    tokens = torch.full((b, PROMPT_LEN + max_new_tokens), EOS, dtype=torch.long)
    logprobs = torch.zeros(b, max_new_tokens)
    mask = torch.zeros(b, max_new_tokens, dtype=torch.bool)
    for i, (p, out) in enumerate(zip(prompts, outs)):
        c = out.outputs[0]
        ids = list(c.token_ids)[:max_new_tokens]
        tokens[i, :PROMPT_LEN] = torch.tensor(TOKENIZER.encode(p))
        tokens[i, PROMPT_LEN : PROMPT_LEN + len(ids)] = torch.tensor(ids, dtype=torch.long)
        mask[i, : len(ids)] = True
        logprobs[i, : len(ids)] = torch.tensor([lp[t].logprob for t, lp in zip(ids, c.logprobs)])
    return Rollouts(tokens, mask, logprobs)


# ------------------------------------------------------------------ KL, evaluation
def kl_estimate(logp: torch.Tensor, logp_ref: torch.Tensor, kind: str = "k1") -> torch.Tensor:
    """Per-sample estimate of KL(pi || pi_ref) from tokens sampled from pi (Schulman, 2020):
    k1 = log pi - log pi_ref (unbiased, can be negative); k3 = exp(q) - q - 1 with q = log pi_ref - log pi
    (unbiased, never negative, lower variance)."""
    check_choice("kind", kind, ("k1", "k3"))
    if kind == "k1":
        return logp - logp_ref
    q = logp_ref - logp
    return q.exp() - q - 1


@torch.no_grad()
def evaluate_rlhf(policy, reference, reward_model, *, n: int = 128, seed: int = 1234) -> dict:
    """Sample ``n`` responses (temperature 1) and report the mean true reward, reward-model score, response
    length and KL(policy || reference) per sequence (k1 summed over tokens)."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(n)]
    ro = rollout(policy, prompts, generator=gen)
    ref_logp, _ = token_logprobs(reference, ro.tokens, entropy=False)
    texts = ro.texts
    return {
        "true_reward": sum(map(true_reward, texts)) / n,
        "rm_score": float(reward_model.score(ro.tokens, ro.mask).mean()),
        "kl": float(((ro.logprobs - ref_logp) * ro.mask).sum(1).mean()),
        "length": sum(map(len, texts)) / n,
        "sample": texts[0],
    }


# ------------------------------------------------------------------ PPO
def shaped_rewards(
    rm_score: torch.Tensor, logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor, kl_coef: float
) -> torch.Tensor:
    """Per-token rewards [B, T]: -kl_coef * k1 on every response token, plus the reward-model score on the
    last one; 0 on padding."""
    check_number("kl_coef", kl_coef, 0.0)
    r = -kl_coef * kl_estimate(logp, logp_ref, "k1") * mask
    last = mask.sum(1) - 1
    r[torch.arange(r.shape[0]), last] += rm_score
    return r


@dataclass
class RLConfig:
    """Settings of ``ppo``/``grpo`` (the defaults are the ones the notebook and tests use)."""

    iterations: int = 30
    batch: int = 32  # responses per iteration (GRPO: prompts x group_size)
    epochs: int = 4  # passes over each batch
    minibatches: int = 2
    lr: float = 2e-3
    clip: float = 0.2
    kl_coef: float = 0.3
    gamma: float = 1.0
    lam: float = 0.95
    vf_coef: float = 0.5
    group_size: int = 8  # GRPO only
    eval_every: int = 5
    late_share: float = 0.25  # ... and every iteration of the run's last quarter (``late_mean`` averages those)
    decoupled: bool = False  # PPO's ratio against the trainer's weights, not the (stale) sampler's: ``ppo_update``

    def check(self):
        for k in ("iterations", "batch", "epochs", "minibatches", "eval_every"):
            check_int(k, getattr(self, k), 1)
        check_probability("late_share", self.late_share, hi_open=False)
        check_number("kl_coef", self.kl_coef, 0.0)
        check_number("lr", self.lr, 0.0, lo_open=True)
        check_probability("clip", self.clip, lo_open=True, hi_open=True)
        check_int("group_size", self.group_size, 2)
        return self


def late_start(last: int, late_share: float = 0.25) -> int:
    """The first iteration of the last ``late_share`` of a run of ``last`` iterations (steps):
    ``last - ceil(late_share * last) + 1``, at least 1 (e.g. 19 of 24: the 6 iterations 19..24)."""
    check_int("last", last, 1)
    check_probability("late_share", late_share, hi_open=False)
    return max(1, last - math.ceil(late_share * last) + 1)


def evaluation_due(it: int, last: int, every: int, late_share: float, late_every: int = 1) -> bool:
    """Whether the history evaluates after iteration (step) ``it`` of ``last``: every ``every``, at the end, and
    every ``late_every`` within the last ``late_share`` of the run (the iterations ``late_mean`` averages)."""
    late = it >= late_start(last, late_share) and (last - it) % late_every == 0
    return it % every == 0 or it == last or (late_share > 0 and late)


def late_mean(history: pd.DataFrame, late_share: float = 0.25) -> pd.Series:
    """The mean of the numeric columns over the evaluations in the last ``late_share`` of the run (iteration
    >= ``late_start``; the run's last iteration is the history's last row). One evaluation of a chaotic RL run
    is one draw: PPO's true reward here swings by 2 between neighbouring iterations (the policy's, not the
    evaluation's noise: 2048 samples swing alike), so a check reads the mean of the run's late evaluations."""
    last = int(history.iteration.iloc[-1])
    late = history[history.iteration >= late_start(last, late_share)]
    return late.select_dtypes("number").mean()


def _history_row(it, policy, reference, rm, clock, flops, seed):
    row = {"iteration": it, **evaluate_rlhf(policy, reference, rm, seed=seed)}
    row.update(wall_s=clock.elapsed(), flops=flops)
    return row


def ppo_update(actor, critic, reference, reward_model, opt, ro: Rollouts, cfg: RLConfig, gen=None) -> float:
    """One PPO-RLHF iteration on the rollouts ``ro``: reference log-probs, reward-model score, critic values,
    KL-shaped rewards, GAE advantages, then ``cfg.epochs`` passes of ``cfg.minibatches`` clipped updates of
    actor and critic. The ratio is taken against ``ro.logprobs``, the log-probabilities of the policy that
    *sampled* the batch: when rollouts come from weights a step old (one-step off-policy, ``placement``)
    that is the importance ratio against the stale behaviour policy, and clipping bounds its effect.

    ``cfg.decoupled``: the decoupled objective for stale rollouts (Hilton et al., 2022, arXiv:2110.00641, §3;
    AReaL, Fu et al., 2025, arXiv:2505.24298, eq. 5): the ratio is clipped against the *proximal* policy (the
    trainer's weights before this update, one more forward) and each token weighted by pi_prox / pi_behaviour
    (no gradient); on-policy the two coincide. The advantages are then normalised per minibatch before
    the weights. Returns the model FLOPs of the iteration (2N per token forward, 6N forward + backward)."""
    b = ro.tokens.shape[0]
    n_a, n_c = n_params(actor), n_params(critic)
    ntok = ro.tokens.numel()
    with torch.no_grad():
        ref_logp, _ = token_logprobs(reference, ro.tokens, entropy=False)
        score = reward_model.score(ro.tokens, ro.mask)
        values = critic.values(ro.tokens)[:, PROMPT_LEN - 1 : -1] * ro.mask  # V of the state before token t
    rewards = shaped_rewards(score, ro.logprobs, ref_logp, ro.mask, cfg.kl_coef)
    dones = torch.zeros_like(ro.mask)
    dones[torch.arange(b), ro.mask.sum(1) - 1] = True
    dones |= ~ro.mask
    adv, ret = gae(rewards.T, values.T, dones.T, torch.zeros(b), cfg.gamma, cfg.lam)
    adv, ret = adv.T, ret.T
    flops = 2 * (n_a + n_a + n_c + n_c) * ntok  # rollout + reference + reward + critic forwards
    old_logp = ro.logprobs
    if cfg.decoupled:
        with torch.no_grad():
            old_logp, _ = token_logprobs(actor, ro.tokens, entropy=False)  # the proximal policy (trainer weights)
        flops += 2 * n_a * ntok
    for _ in range(cfg.epochs):
        for idx in torch.randperm(b, generator=gen).chunk(cfg.minibatches):
            m = ro.mask[idx]
            new_logp, ent = token_logprobs(actor, ro.tokens[idx])
            v = critic.values(ro.tokens[idx])[:, PROMPT_LEN - 1 : -1]
            a = adv[idx][m]
            if cfg.decoupled:  # normalised here, then weighted by pi_prox / pi_behaviour
                a = (a - a.mean()) / (a.std() + 1e-8) * (old_logp[idx][m] - ro.logprobs[idx][m]).exp()
            loss, _ = ppo_loss(
                new_logp[m],
                old_logp[idx][m],
                a,
                v[m],
                ret[idx][m],
                ent[m],
                clip=cfg.clip,
                vf_coef=cfg.vf_coef,
                normalize=not cfg.decoupled,
            )
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(list(actor.parameters()) + list(critic.parameters()), 1.0)
            opt.step()
            flops += 6 * (n_a + n_c) * ro.tokens[idx].numel()
    return flops


def ppo(
    sft_model,
    reward_model: ScalarModel,
    cfg: RLConfig | None = None,
    *,
    seed: int = 0,
    progress: bool = True,
    **overrides,
):
    """PPO-RLHF with four models. Returns ``(actor, history)``; ``history`` is a DataFrame (iteration,
    true_reward, rm_score, kl, length, wall_s, flops) evaluated every ``cfg.eval_every`` iterations and every
    iteration of the last ``cfg.late_share`` of the run (``late_mean`` averages those)."""
    cfg = replace(cfg or RLConfig(), **overrides).check()
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    actor = copy.deepcopy(sft_model).train()
    reference = copy.deepcopy(sft_model).eval().requires_grad_(False)
    critic = copy.deepcopy(reward_model).requires_grad_(True).train()  # value model starts as the RM
    opt = torch.optim.Adam(list(actor.parameters()) + list(critic.parameters()), lr=cfg.lr)
    clock, flops, hist = Laps(), 0.0, []
    hist.append(_history_row(0, actor, reference, reward_model, clock, flops, seed + 10_000))
    for it in _progress(range(1, cfg.iterations + 1), progress, "PPO"):
        prompts = [PROMPTS[i % len(PROMPTS)] for i in range(cfg.batch)]
        ro = rollout(actor, prompts, generator=gen)
        flops += ppo_update(actor, critic, reference, reward_model, opt, ro, cfg, gen)
        if evaluation_due(it, cfg.iterations, cfg.eval_every, cfg.late_share):
            hist.append(_history_row(it, actor, reference, reward_model, clock, flops, seed + 10_000))
    return actor.eval(), pd.DataFrame(hist)


# ------------------------------------------------------------------ GRPO
def grpo_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantages: ``rewards`` [n_prompts, G] -> (r - group mean) / (group std + eps), the
    std with Bessel's correction (``torch.std``). G must be >= 2."""
    if rewards.dim() != 2 or rewards.shape[1] < 2:
        raise ValueError(f"rewards must be [n_prompts, group_size] with group_size >= 2, got {tuple(rewards.shape)}")
    return (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + eps)


def grpo(
    sft_model,
    reward_model: ScalarModel,
    cfg: RLConfig | None = None,
    *,
    seed: int = 0,
    progress: bool = True,
    **overrides,
):
    """GRPO: ``cfg.batch // cfg.group_size`` prompts x ``group_size`` samples, group-relative advantages on
    every token, the clipped loss, and ``kl_coef`` * k3 KL to the reference in the loss. No critic.
    Returns ``(policy, history)`` like ``ppo``."""
    cfg = replace(cfg or RLConfig(), **overrides).check()
    if cfg.batch % cfg.group_size:
        raise ValueError(f"batch={cfg.batch} must be a multiple of group_size={cfg.group_size}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    actor = copy.deepcopy(sft_model).train()
    reference = copy.deepcopy(sft_model).eval().requires_grad_(False)
    opt = torch.optim.Adam(actor.parameters(), lr=cfg.lr)
    n_a, n_r = n_params(actor), n_params(reward_model)
    n_groups = cfg.batch // cfg.group_size
    clock, flops, hist = Laps(), 0.0, []
    hist.append(_history_row(0, actor, reference, reward_model, clock, flops, seed + 10_000))
    for it in _progress(range(1, cfg.iterations + 1), progress, "GRPO"):
        prompts = [PROMPTS[(i // cfg.group_size) % len(PROMPTS)] for i in range(cfg.batch)]
        ro = rollout(actor, prompts, generator=gen)
        with torch.no_grad():
            ref_logp, _ = token_logprobs(reference, ro.tokens, entropy=False)
            score = reward_model.score(ro.tokens, ro.mask)
        adv = grpo_advantages(score.view(n_groups, cfg.group_size)).reshape(-1, 1).expand_as(ro.logprobs)
        flops += 2 * (n_a + n_a + n_r) * ro.tokens.numel()
        for _ in range(cfg.epochs):
            for idx in torch.randperm(cfg.batch, generator=gen).chunk(cfg.minibatches):
                m = ro.mask[idx]
                new_logp, ent = token_logprobs(actor, ro.tokens[idx])
                zeros = torch.zeros(int(m.sum()))
                pg, _ = ppo_loss(
                    new_logp[m],
                    ro.logprobs[idx][m],
                    adv[idx][m],
                    zeros,
                    zeros,
                    ent[m],
                    clip=cfg.clip,
                    vf_coef=0.0,
                    normalize=False,
                )
                kl = kl_estimate(new_logp[m], ref_logp[idx][m], "k3").mean()
                loss = pg + cfg.kl_coef * kl
                opt.zero_grad()
                loss.backward()
                nn.utils.clip_grad_norm_(actor.parameters(), 1.0)
                opt.step()
                flops += 6 * n_a * ro.tokens[idx].numel()
        if evaluation_due(it, cfg.iterations, cfg.eval_every, cfg.late_share):
            hist.append(_history_row(it, actor, reference, reward_model, clock, flops, seed + 10_000))
    return actor.eval(), pd.DataFrame(hist)


# ------------------------------------------------------------------ DPO
def dpo_loss(
    policy_chosen: torch.Tensor,
    policy_rejected: torch.Tensor,
    ref_chosen: torch.Tensor,
    ref_rejected: torch.Tensor,
    beta: float = 0.1,
) -> torch.Tensor:
    """DPO loss (Rafailov et al., 2023, eq. 7), inputs are sequence log-probabilities [B]:
    -log sigmoid(beta * ((pi_c - ref_c) - (pi_r - ref_r))), averaged."""
    check_number("beta", beta, 0.0, lo_open=True)
    return -F.logsigmoid(beta * ((policy_chosen - ref_chosen) - (policy_rejected - ref_rejected))).mean()


def sequence_logprob(model, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log pi(response | prompt) [B]: the sum of the response tokens' log-probabilities."""
    logp, _ = token_logprobs(model, tokens, entropy=False)
    return (logp * mask).sum(1)


@torch.no_grad()
def reference_pair_logprobs(reference, pairs, batch: int = 64) -> tuple[torch.Tensor, int]:
    """log pi_ref(chosen) and log pi_ref(rejected) of every pair, [len(pairs), 2] (``batch`` pairs per
    forward), and the number of tokens that ran. The reference is frozen, so DPO computes these once before
    its first step instead of two reference forwards per step (each pair is drawn ~3 times in a run)."""
    check_int("batch", batch, 1)
    out, tokens = [], 0
    for i in range(0, len(pairs), batch):
        (tc, mc), (tr, mr) = _pair_tensors(pairs[i : i + batch])
        out.append(torch.stack([sequence_logprob(reference, tc, mc), sequence_logprob(reference, tr, mr)], 1))
        tokens += tc.numel() + tr.numel()
    return torch.cat(out), tokens


def dpo(
    sft_model,
    pairs,
    reward_model: ScalarModel,
    *,
    beta: float = 0.1,
    steps: int = 200,
    batch: int = 64,
    lr: float = 1e-3,
    eval_every: int = 25,
    late_share: float = 0.25,
    late_every: int = 5,
    seed: int = 0,
    progress: bool = True,
):
    """Offline DPO from preference pairs, starting from (and regularised towards) the SFT model. The reward
    model is used only to report its score in the history, evaluated every ``eval_every`` steps and every
    ``late_every`` steps of the last ``late_share`` of the run (``late_mean``). The reference's log-probabilities
    of every pair are computed once, before the first step (``reference_pair_logprobs``); each step then runs
    the policy's forward and backward over its batch. Returns ``(policy, history)`` like ``ppo``."""
    check_number("beta", beta, 0.0, lo_open=True)
    check_int("steps", steps, 1)
    check_int("batch", batch, 1)
    check_int("eval_every", eval_every, 1)
    check_int("late_every", late_every, 1)
    check_probability("late_share", late_share, hi_open=False)
    torch.manual_seed(seed)
    rng = random.Random(seed)
    policy = copy.deepcopy(sft_model).train()
    reference = copy.deepcopy(sft_model).eval().requires_grad_(False)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    n_a = n_params(policy)
    clock, flops, hist = Laps(), 0.0, []
    hist.append(_history_row(0, policy, reference, reward_model, clock, flops, seed + 10_000))
    ref_logp, ref_tokens = reference_pair_logprobs(reference, pairs, batch)
    flops += 2 * n_a * ref_tokens
    for it in _progress(range(1, steps + 1), progress, "DPO"):
        idx = [rng.randrange(len(pairs)) for _ in range(batch)]
        (tc, mc), (tr, mr) = _pair_tensors([pairs[i] for i in idx])
        ref_c, ref_r = ref_logp[idx].unbind(1)
        loss = dpo_loss(sequence_logprob(policy, tc, mc), sequence_logprob(policy, tr, mr), ref_c, ref_r, beta)
        opt.zero_grad()
        loss.backward()
        opt.step()
        flops += 6 * n_a * (tc.numel() + tr.numel())
        if evaluation_due(it, steps, eval_every, late_share, late_every):
            hist.append(_history_row(it, policy, reference, reward_model, clock, flops, seed + 10_000))
    return policy.eval(), pd.DataFrame(hist)


def _progress(it, on: bool, desc: str):
    if not on:
        return it
    from tqdm.auto import tqdm

    return tqdm(it, desc=desc, leave=False)
