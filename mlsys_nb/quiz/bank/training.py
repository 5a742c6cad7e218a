"""Families of the topic ``training``: the rest of the training loop (notebook 25). Perplexity from a loss and
bits per token from a perplexity, the LSH candidate probability and the band/row threshold of MinHash
deduplication, the share of a templated SFT record the loss mask trains on, the fill of greedily packed rows, and
the temperature-scaled distillation loss.

Answer keys: ``mlsys_nb.training`` (``perplexity``, ``bits_per_token``, ``lsh_probability``, ``format_chat``,
``pack``, ``distill_loss``), the functions notebook 25 runs.
"""

from __future__ import annotations

import math

from ...training import bits_per_token, distill_loss, format_chat, lsh_probability, pack, perplexity
from ..core import family
from ._util import numeric_family, pick, picks

NB = "notebooks/25_data_evaluation_and_compression.ipynb"
SEC_SFT = f"{NB}, §1 Supervised fine-tuning data: a chat template and a loss mask"
SEC_PACK = f"{NB}, §2 Packing documents into rows, without attention across them"
SEC_DEDUP = f"{NB}, §3 Deduplication: exact copies by hash, near copies by MinHash and LSH"
SEC_EVAL = f"{NB}, §4 Evaluation: perplexity, bits per token, and the bounds a number must respect"
SEC_COMPRESS = f"{NB}, §6 Compression: pruning and distillation"
REF_DEDUP = "docs/references.md#broder1997, #lee2021dedup (Lee et al. 2021, arXiv:2107.06499)"
REF_NATS = "docs/references.md#kaplan (losses in nats per token)"
REF_SFT = "docs/references.md#instructgpt (Ouyang et al. 2022, arXiv:2203.02155)"
REF_PACKING = "docs/references.md#krell2021 (arXiv:2107.02027)"
REF_DISTILL = "docs/references.md#hinton2015 (Hinton, Vinyals & Dean 2015, arXiv:1503.02531, §2)"
BANDS = [(4, 32), (8, 16), (16, 8), (5, 20), (10, 10)]  # (rows, bands) of a MinHash signature


numeric_family(
    family("training.perplexity", section=SEC_EVAL, reference="docs/references.md#kaplan (losses in nats per token)"),
    draw=lambda rng: picks(rng, loss=[1.2, 1.9, 2.3, 2.7, 3.1, 3.5, 4.2]),
    calc=lambda p: perplexity(p["loss"]),
    unit="ratio",
    text="A language model's mean held-out cross-entropy is {loss:g} nats per token. What is its perplexity?",
    hints=["Perplexity is e to the loss in nats: the number of equally likely tokens the model is as unsure as."],
    solution=["e^{loss:g} = {result:.4g} (training.perplexity)."],
    diagnostics=lambda p, ppl: [(2 ** p["loss"] / ppl, "the loss is in nats: raise e, not 2, to it")],
)


numeric_family(
    family("training.bits_per_token", section=SEC_EVAL, reference=REF_NATS),
    draw=lambda rng: picks(rng, ppl=[6.0, 12.0, 20.0, 45.0, 100.0, 300.0]),
    calc=lambda p: bits_per_token(math.log(p["ppl"])),
    unit="count",
    fields=lambda p, result: {"nats": math.log(p["ppl"])},
    text="A language model's held-out perplexity is {ppl:g}. How many bits per token is its loss?",
    hints=["The loss in nats is ln(perplexity); a bit is ln 2 nats."],
    solution=[
        "Loss = ln {ppl:g} = {nats:.4g} nats/token.",
        "{nats:.4g} / ln 2 = {result:.4g} bits/token = log2 {ppl:g} (training.bits_per_token).",
    ],
    diagnostics=[(math.log(2), "that is the loss in nats: divide by ln 2 for bits")],
)


def _bands(rng) -> dict:
    rows, bands = pick(rng, BANDS)
    return {"rows": rows, "bands": bands}


def lsh_threshold(rows: int, bands: int) -> float:
    """The Jaccard similarity where the LSH S-curve ``training.lsh_probability`` rises: J^rows = 1 / bands,
    i.e. ``(1 / bands) ** (1 / rows)`` (the module docstring of ``training.dedup``)."""
    return (1 / bands) ** (1 / rows)


def _near_threshold(rng) -> dict:
    """A split of the signature and a similarity near its threshold (where the answer is neither 0 nor 1)."""
    p = _bands(rng)
    offset = pick(rng, [-0.15, -0.1, -0.05, 0.0, 0.05, 0.1])
    return {"j": round(lsh_threshold(p["rows"], p["bands"]) + offset, 2), **p}


numeric_family(
    family("training.lsh_probability", difficulty=2, section=SEC_DEDUP, reference=REF_DEDUP),
    draw=_near_threshold,
    calc=lambda p: float(lsh_probability(p["j"], p["rows"], p["bands"])),
    unit="fraction",
    fields=lambda p, result: {"k": p["rows"] * p["bands"], "one_band": p["j"] ** p["rows"]},
    text=(
        "MinHash signatures of {k} values are cut into {bands} bands of {rows} rows; two documents become "
        "candidates when they agree on every row of at least one band. Two documents have Jaccard similarity "
        "{j:g}. What is the probability that they become candidates?"
    ),
    hints=[
        "Each MinHash row agrees with probability J; a band of r rows agrees with probability J^r.",
        "The pair is missed only if every one of the b bands disagrees.",
    ],
    solution=[
        "One band agrees with probability J^r = {j:g}^{rows} = {one_band:.4g}.",
        "1 − (1 − J^r)^b = 1 − (1 − {one_band:.4g})^{bands} = {result:.4g} (training.lsh_probability).",
    ],
    diagnostics=lambda p, prob: [
        (p["j"] ** p["rows"] / prob, "that is one band: the pair has b chances"),
        ((1 - (1 - p["j"] ** p["bands"]) ** p["rows"]) / prob, "rows and bands swapped"),
    ],
)


numeric_family(
    family("training.lsh_threshold", difficulty=2, section=SEC_DEDUP, reference=REF_DEDUP),
    draw=_bands,
    calc=lambda p: lsh_threshold(p["rows"], p["bands"]),
    unit="fraction",
    fields=lambda p, result: {
        "k": p["rows"] * p["bands"],
        "at": float(lsh_probability(result, p["rows"], p["bands"])),
    },
    text=(
        "MinHash signatures of {k} values are cut into {bands} bands of {rows} rows for LSH. Near which Jaccard "
        "similarity does the probability that a pair becomes a candidate rise steeply (the S-curve's threshold)?"
    ),
    hints=["The curve 1 − (1 − J^r)^b turns where one band's chance J^r is about 1/b."],
    solution=[
        "J^{rows} = 1/{bands}: J = (1/{bands})^(1/{rows}) = {result:.4g}.",
        "There a pair becomes a candidate with probability {at:.3g} ≈ 1 − 1/e (training.lsh_probability).",
    ],
    diagnostics=lambda p, t: [((1 / p["rows"]) ** (1 / p["bands"]) / t, "rows and bands swapped")],
)


def _chat(p) -> dict:
    """A chat record of ASCII text of the drawn lengths (one byte, one token each)."""
    msgs = [{"role": "system", "content": "s" * p["system"]}] if p["system"] else []
    msgs += [{"role": "user", "content": "q" * p["prompt"]}, {"role": "assistant", "content": "a" * p["reply"]}]
    return {"messages": msgs}


def _response_share(p) -> float:
    ids, mask = format_chat(_chat(p))
    return sum(mask) / len(ids)


def _trained_tokens(p) -> int:
    """Tokens the loss mask of ``training.format_chat`` trains on."""
    return sum(format_chat(_chat(p))[1])


def _with_system(p) -> str:
    return f"a system message of {p['system']} characters, " if p["system"] else "no system message, "


numeric_family(
    family("training.response_share", section=SEC_SFT, reference=REF_SFT),
    draw=lambda rng: picks(rng, system=[0, 30, 80], prompt=[20, 45, 120], reply=[10, 60, 200]),
    calc=_response_share,
    unit="fraction",
    fields=lambda p, result: {
        "sys": _with_system(p),
        "n_tokens": round(_trained_tokens(p) / result),
        "trained": _trained_tokens(p),
    },
    text=(
        "An SFT record is rendered as <|role|>content<|end|> per message, each marker one token and the text one "
        "token per byte. It has {sys}a prompt of {prompt} and a reply of {reply} ASCII characters. The loss mask "
        "trains on the reply and the <|end|> that closes it. What fraction of the record's tokens does it train on?"
    ),
    hints=["Count the markers: each message adds a role token and an <|end|>.", "Only the assistant's tokens count."],
    solution=[
        "Tokens: every message's characters plus 2 markers each = {n_tokens}.",
        "Trained: the reply's {reply} bytes + its <|end|> = {trained}; {trained}/{n_tokens} = {result:.4g} "
        "(training.format_chat).",
    ],
    diagnostics=lambda p, share: [
        (p["reply"] / (p["system"] + p["prompt"] + p["reply"]) / share, "the template's markers are tokens too")
    ],
)


def _documents(rng) -> dict:
    seq_len = pick(rng, [512, 1024, 2048])
    shares = [pick(rng, [0.1, 0.2, 0.3, 0.45, 0.6, 0.75]) for _ in range(6)]
    return {"seq_len": seq_len, "lengths": [int(s * seq_len) for s in shares]}


def _packed_fill(p) -> float:
    return pack([[1] * n for n in p["lengths"]], p["seq_len"])["fill"]


def _one_per_row_fill(p) -> float:
    """The fill if each document were padded to a row of its own."""
    return sum(p["lengths"]) / (len(p["lengths"]) * p["seq_len"])


numeric_family(
    family("training.packing_fill", difficulty=2, section=SEC_PACK, reference=REF_PACKING),
    draw=_documents,
    calc=_packed_fill,
    unit="fraction",
    fields=lambda p, result: {
        "docs": ", ".join(map(str, p["lengths"])),
        "total": sum(p["lengths"]),
        "rows": round(sum(p["lengths"]) / (result * p["seq_len"])),
        "padded": _one_per_row_fill(p),
    },
    text=(
        "Documents of {docs} tokens, in this order, are packed greedily into rows of {seq_len} tokens: a document "
        "goes into the current row if it fits, else it starts a new row; none is split, and the rest of a row is "
        "padding. What fraction of the positions hold a token?"
    ),
    hints=["Walk the documents in order, keeping the current row's length.", "Fill = tokens / (rows × seq_len)."],
    solution=[
        "Greedy rows: {rows} rows of {seq_len} for {total} tokens.",
        "{total} / ({rows}·{seq_len}) = {result:.4g} (training.pack); padding each document to its own row "
        "would fill only {padded:.3g}.",
    ],
    diagnostics=lambda p, fill: [(_one_per_row_fill(p) / fill, "that is one document per padded row")],
)

LOGITS = [(2.0, 1.0, 0.0), (3.0, 0.0, -1.0), (0.5, 2.5, 1.0), (1.0, -1.0, 2.0)]  # teacher/student logit vectors


def _logit_pair(rng) -> dict:
    teacher = pick(rng, LOGITS)
    student = pick(rng, [v for v in LOGITS if v != teacher])
    return {"teacher": list(teacher), "student": list(student), "T": pick(rng, [1.0, 2.0, 4.0])}


def _distill(p) -> float:
    import torch

    s, t = (torch.tensor([p[k]], dtype=torch.float64) for k in ("student", "teacher"))
    return float(distill_loss(s, t, p["T"]))


numeric_family(
    family("training.distill_loss", difficulty=3, section=SEC_COMPRESS, reference=REF_DISTILL),
    draw=_logit_pair,
    calc=_distill,
    unit="nats/token",
    fields=lambda p, result: {
        "t": ", ".join(f"{x:g}" for x in p["teacher"]),
        "s": ", ".join(f"{x:g}" for x in p["student"]),
        "T2": p["T"] ** 2,
        "kl": result / p["T"] ** 2,
    },
    text=(
        "Over a 3-token vocabulary the teacher's logits are ({t}) and the student's ({s}). At temperature "
        "T = {T:g}, what is the distillation loss T²·KL(softmax(teacher/T) ‖ softmax(student/T)), in nats?"
    ),
    hints=[
        "Divide both logit vectors by T, softmax each, then KL(p ‖ q) = Σ p·(ln p − ln q).",
        "Multiply by T²: it keeps the gradient's scale as T changes.",
    ],
    solution=[
        "KL(softmax(teacher/{T:g}) ‖ softmax(student/{T:g})) = {kl:.4g} nats.",
        "× T² = {T2:g}: {result:.4g} nats (training.distill_loss).",
    ],
    diagnostics=lambda p, loss: [(1 / p["T"] ** 2, "the T² factor")] if p["T"] != 1 else [],
)
