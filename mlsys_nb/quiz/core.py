"""Questions, the family registry, seeded drawing and worksheets.

A *family* is a function ``f(rng) -> Question`` registered with ``@family(name, topic, ...)``;
``rng`` is a ``random.Random`` seeded from ``sha256(f"{name}|{seed}")`` (never Python's salted
``hash()``), so the same family and seed give the same question in any process.
"""

from __future__ import annotations

import hashlib
import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field

from ..config import check_choice, check_int
from .units import UNITS, UnitError, fmt, readings

TOPICS = {  # topic -> (title, notebook that teaches it)
    "comm": ("Collectives and the α-β model", "notebooks/03_collectives.ipynb, 04_communication_cost.ipynb"),
    "data_parallel": ("DDP and ZeRO", "notebooks/05_data_parallelism.ipynb, 06_zero_and_fsdp.ipynb"),
    "profiling": ("Profiling: traces, overlap, memory over time", "notebooks/05b_profiling.ipynb"),
    "tensor": ("Tensor and sequence parallelism", "notebooks/07_tensor_parallelism.ipynb"),
    "pipeline": ("Pipeline parallelism", "notebooks/08_pipeline_parallelism.ipynb"),
    "expert_context": ("Expert and context parallelism", "notebooks/09_experts_and_context.ipynb"),
    "memory": ("Training memory", "notebooks/10_training_memory.ipynb"),
    "compute": ("FLOPs, MFU, time and cost", "notebooks/11_compute_and_scaling_laws.ipynb"),
    "scaling": ("Scaling laws", "notebooks/11_compute_and_scaling_laws.ipynb"),
    "inference": ("Inference: KV cache and roofline", "notebooks/13_inference_anatomy.ipynb"),
    "serving": (
        "Serving: paging, prefixes, batching, speculation",
        "notebooks/14_kv_cache_management.ipynb, 15_batching_and_scheduling.ipynb",
    ),
    "rl": ("RL and RLHF", "notebooks/17_rl_fundamentals.ipynb, 18_rlhf.ipynb"),
    "layout": ("Choosing a parallel layout", "notebooks/10_training_memory.ipynb"),
    "kernels": ("Inside one GPU: roofline, fusion, FlashAttention", "notebooks/21_inside_one_gpu.ipynb"),
    "precision": ("Number formats and mixed precision", "notebooks/22_number_formats_and_mixed_precision.ipynb"),
    "quant": ("Quantization, LoRA and QLoRA", "notebooks/23_quantization_and_lora.ipynb"),
    "checkpoint": ("Checkpoints, failures and offload", "notebooks/24_checkpoints_and_failures.ipynb"),
    "training": ("Data, evaluation and compression", "notebooks/25_data_evaluation_and_compression.ipynb"),
}


@dataclass(frozen=True)
class CheckResult:
    ok: bool
    value: float | str | None  # the response read in the question's unit (None if unreadable)
    feedback: str

    def __bool__(self) -> bool:
        return self.ok


@dataclass
class Question:
    """One question. ``answer`` is in ``unit`` (base SI unless the family says otherwise) or a
    choice string; ``tolerance`` is relative (2 % by default: a GB/GiB mix-up, 7.4 %, fails)."""

    family: str
    topic: str
    text: str
    params: dict
    answer: float | str
    unit: str
    solution: list[str]
    hints: list[str]
    tolerance: float = 0.02
    choices: tuple[str, ...] | None = None
    difficulty: int = 1
    seed: object = None
    section: str = ""  # the notebook section that teaches it
    reference: str = ""  # docs/references.md entry and/or paper
    diagnostics: tuple[tuple[float, str], ...] = ()  # (factor response/answer, hint)

    @property
    def is_choice(self) -> bool:
        return self.choices is not None

    def answer_text(self) -> str:
        return self.answer if self.is_choice else fmt(self.answer, self.unit)

    def answer_response(self) -> str:
        """The key written as a learner would type it, with a unit (``"17.18 GB"``, ``"3.4 ms"``,
        ``"12.5%"``): what worked solutions fill in, read back through ``check``'s parser."""
        if self.is_choice:
            return self.answer
        v = float(self.answer)
        if self.unit == "bytes":
            return f"{v / 1e9:.7g} GB"
        if self.unit == "seconds":
            return f"{v * 1e3:.7g} ms"
        if self.unit == "fraction":
            return f"{v * 100:.7g}%"
        if self.unit == "days":
            return f"{v:.7g} days"
        if self.unit == "USD":
            return f"${v:,.2f}"
        return f"{v:.7g}"

    def solution_text(self) -> str:
        lines = [f"{i}. {s}" for i, s in enumerate(self.solution, 1)]
        lines.append(f"Answer: {self.answer_text()}")
        lines.append(f"See {self.section}; {self.reference}")
        return "\n".join(lines)

    def check(self, response) -> CheckResult:
        """Is ``response`` right? Accepts text with a unit (``"3.2 GB"``) or a number in ``unit``;
        a choice question accepts the option text or its letter (a, b, c, ...)."""
        if self.is_choice:
            return self._check_choice(response)
        try:
            values = readings(response, self.unit)
        except UnitError as e:
            return CheckResult(False, None, str(e))
        ans = float(self.answer)
        for value in values:  # an ambiguous "10 B" in a count question: billions, or bytes counted
            if _close(value, ans, self.tolerance):
                return CheckResult(True, value, f"correct: {fmt(ans, self.unit)}")
        value = values[0]
        ratio = value / ans if ans else math.inf
        for factor, hint in (*self.diagnostics, *_GENERIC):
            if _close(ratio, factor, self.tolerance):
                return CheckResult(False, value, f"not quite: {hint}")
        rel = (value - ans) / ans if ans else math.inf
        return CheckResult(
            False,
            value,
            f"not quite: {'too high' if rel > 0 else 'too low'} ({ratio:.3g}x the expected value); try a hint",
        )

    def _check_choice(self, response) -> CheckResult:
        r = str(response).strip().lower().rstrip(").")
        options = [c.lower() for c in self.choices]
        if len(r) == 1 and "a" <= r <= chr(ord("a") + len(options) - 1):
            r = options[ord(r) - ord("a")]
        if r not in options:
            return CheckResult(False, None, f"{response!r} is not one of the options: {', '.join(self.choices)}")
        picked = self.choices[options.index(r)]
        if picked == self.answer:
            return CheckResult(True, picked, "correct")
        return CheckResult(False, picked, "not quite: " + (self.hints[0] if self.hints else "look again"))


_GENERIC = (
    (2**30 / 1e9, "you are 7.4% high: GB (1e9 B) vs GiB (2^30 B)?"),
    (1e9 / 2**30, "you are 7.4% low: did you divide by 2^30 (GiB) where GB (1e9) was asked, or the reverse?"),
    (1000.0, "a factor 1000 high: a unit prefix slip (ms vs s, MB vs GB)?"),
    (1e-3, "a factor 1000 low: a unit prefix slip (ms vs s, MB vs GB)?"),
    (100.0, "a factor 100: a percentage given without the % sign?"),
    (2.0, "off by a factor 2"),
    (0.5, "off by a factor 2 (too low)"),
)


def _close(a: float, b: float, rel: float) -> bool:
    if b == 0:
        return abs(a) <= 1e-12
    return abs(a - b) <= rel * abs(b)


# ---- registry -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    name: str
    topic: str
    fn: Callable
    difficulty: int = 1
    section: str = ""
    reference: str = ""
    kind: str = "number"  # "number", "choice" or "card" (spot the error)


REGISTRY: dict[str, Family] = {}


def family(
    name: str,
    topic: str | None = None,
    *,
    difficulty: int = 1,
    section: str = "",
    reference: str = "",
    kind: str = "number",
):
    """Register ``fn(rng) -> dict`` as question family ``name`` (a decorator, ``@family(...)``; the bank's
    ``numeric_family``/``ratio_family`` take it as their first argument). The dict holds Question fields
    (text, params, answer, unit, solution, hints, optional choices/tolerance/diagnostics). The topic is
    the name of the module that defines ``fn`` (``quiz/bank/<topic>.py``) unless ``topic`` names one."""
    if topic is not None:
        check_choice("topic", topic, TOPICS)

    def deco(fn):
        t = topic if topic is not None else fn.__module__.rpartition(".")[2]
        check_choice(f"the topic of family {name} (its module's name)", t, TOPICS)
        if name in REGISTRY:
            raise ValueError(f"family {name!r} registered twice")
        REGISTRY[name] = Family(name, t, fn, difficulty, section, reference, kind)
        return fn

    deco.name = name  # read by the bank's builders: numeric_family(family(name, ...), draw=..., ...)
    return deco


def _load():
    import importlib

    importlib.import_module(__name__.rsplit(".", 1)[0] + ".bank")  # registers every family


def families(topic: str | None = None) -> list[str]:
    """Sorted family names (of one topic if given)."""
    _load()
    if topic is not None:
        check_choice("topic", topic, TOPICS)
    return sorted(n for n, f in REGISTRY.items() if topic is None or f.topic == topic)


def topics() -> list[str]:
    return list(TOPICS)


def family_info(name: str) -> Family:
    _load()
    check_choice("family", name, sorted(REGISTRY))
    return REGISTRY[name]


def rng_for(name: str, seed) -> random.Random:
    """``random.Random`` seeded from sha256 of ``name|seed``: stable across processes."""
    digest = hashlib.sha256(f"{name}|{seed}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def make(name: str, seed) -> Question:
    """The question of family ``name`` for ``seed``."""
    fam = family_info(name)
    d = dict(fam.fn(rng_for(name, seed)))
    if d.get("unit", "choice") != "choice":
        check_choice(f"the unit of family {name}", d["unit"], UNITS)
    if "choices" in d:
        d["unit"] = "choice"
        d["choices"] = tuple(d["choices"])
        assert d["answer"] in d["choices"], (name, d["answer"], d["choices"])
    else:
        d["answer"] = float(d["answer"])
    d.setdefault("difficulty", fam.difficulty)
    d.setdefault("section", fam.section or TOPICS[fam.topic][1])
    d.setdefault("reference", fam.reference)
    d["diagnostics"] = tuple(d.get("diagnostics", ()))
    return Question(family=name, topic=fam.topic, seed=seed, **d)


def rendezvous(names, seed, salt: str = "") -> list[str]:
    """``names`` in rendezvous (highest-random-weight) order for ``seed``: sorted by
    sha256(``salt|seed|name``). Each name's rank key depends only on the seed and the name, so
    adding a family never reorders the others: it only slots in somewhere between them."""
    return sorted(names, key=lambda n: hashlib.sha256(f"{salt}|{seed}|{n}".encode()).digest())


def draw(family: str | None = None, topic: str | None = None, seed=None, difficulty: int | None = None) -> Question:
    """One question: of ``family``, or of the family first in rendezvous order (for the seed) among
    ``topic`` and/or ``difficulty`` (1 easy, 2 medium, 3 hard). ``seed=None`` draws a fresh random seed."""
    if seed is None:
        seed = secrets.randbelow(2**31)
    if difficulty is not None:
        check_choice("difficulty", difficulty, (1, 2, 3))
    if family is not None:
        return make(family, seed)
    pool = [n for n in families(topic) if difficulty is None or REGISTRY[n].difficulty == difficulty]
    if not pool:
        raise ValueError(f"no family with topic={topic!r}, difficulty={difficulty!r}")
    return make(rendezvous(pool, seed, "draw")[0], seed)


@dataclass
class Worksheet:
    seed: object
    questions: dict = field(default_factory=dict)  # topic -> list[Question]

    def __iter__(self):
        for qs in self.questions.values():
            yield from qs

    def __len__(self) -> int:
        return sum(len(q) for q in self.questions.values())


def worksheet(topics=None, n: int = 5, seed=0) -> Worksheet:
    """``n`` questions per topic (all topics if ``topics`` is None). A topic's families are taken in
    rendezvous order for ``seed`` (``rendezvous``), each once before any repeats; the k-th repeat of
    family f is ``make(f, f"{seed}:{k}")``, or, if that question's text was already asked by f on this
    sheet, the first of ``make(f, f"{seed}:{k}+{j}")`` (j = 1, 2, ...) that was not (``sheet_question``). So a
    question depends only on (seed, family, k): adding a family to the bank leaves the question of
    every family that stays selected unchanged, and no question appears twice on a sheet."""
    _load()
    check_int("n", n, 1)
    if topics is None:
        topics = list(TOPICS)
    elif isinstance(topics, str):
        topics = [topics]
    ws = Worksheet(seed)
    for t in topics:
        order = rendezvous(families(t), seed, "worksheet")
        ws.questions[t] = [sheet_question(order[i % len(order)], seed, i // len(order)) for i in range(n)]
    return ws


def sheet_question(name: str, seed, k: int, tries: int = 50) -> Question:
    """The k-th question (k = 0, 1, ...) of family ``name`` on a worksheet of ``seed``: a text that none
    of its k earlier questions has (a family with few distinct questions, e.g. a choice between two
    layouts, may run out after ``tries`` draws: then the k-th draw is kept)."""
    seen = {sheet_question(name, seed, j, tries).text for j in range(k)}
    first = make(name, f"{seed}:{k}")
    for j in range(tries):
        q = first if j == 0 else make(name, f"{seed}:{k}+{j}")
        if q.text not in seen:
            return q
    return first
