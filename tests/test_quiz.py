"""mlsys_nb.quiz: every family draws, checks, and its key agrees with a second route."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from mlsys_nb import quiz
from mlsys_nb.quiz import units

FAMILIES = quiz.families()


def test_families_cover_every_topic_and_required_names():
    assert len(FAMILIES) >= 80, len(FAMILIES)
    assert FAMILIES == sorted(FAMILIES)
    for t in quiz.topics():
        assert quiz.families(t), f"topic {t} has no family"
    for name in (
        "pipeline.bubble_fraction",
        "memory.model_states",
        "inference.kv_cache_bytes",
        "flops.training_days",
        "comm.allreduce_time",
    ):
        assert name in FAMILIES


@pytest.mark.parametrize("name", FAMILIES)
def test_family_draws_50_seeds_checks_right_and_rejects_wrong(name):
    for seed in range(50):
        q = quiz.make(name, seed)
        assert q.family == name and q.text and q.hints and q.solution and q.section and q.reference
        assert q.check(q.answer).ok, (name, seed, q.answer)
        assert q.check(q.answer_response()).ok, (name, seed, q.answer_response())
        if q.is_choice:
            wrong = [c for c in q.choices if c != q.answer]
            assert wrong and not q.check(wrong[0]).ok
        else:
            assert math.isfinite(q.answer) and q.answer != 0, (name, seed)
            assert not q.check(q.answer * 1.5).ok, (name, seed)
            assert not q.check(q.answer / 1.5).ok, (name, seed)


def test_same_seed_same_question_in_another_process():
    code = (
        "import json; from mlsys_nb import quiz; "
        "print(json.dumps([[q.text, str(q.answer)] for q in quiz.worksheet(None, 2, seed=7)]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**__import__("os").environ, "PYTHONHASHSEED": "123"},
        timeout=120,
    ).stdout
    here = [[q.text, str(q.answer)] for q in quiz.worksheet(None, 2, seed=7)]
    assert json.loads(out) == here
    assert quiz.draw(topic="pipeline", seed=3).text == quiz.draw(topic="pipeline", seed=3).text
    assert quiz.draw(topic="pipeline", seed=3, difficulty=2).topic == "pipeline"
    assert len({quiz.make("memory.model_states", s).text for s in range(20)}) > 5  # seeds matter


@pytest.mark.parametrize(
    "text,unit,value",
    [
        ("3.2 GB", "bytes", 3.2e9),
        ("3.2GiB", "bytes", 3.2 * 2**30),
        ("3.2e9", "bytes", 3.2e9),
        ("3,200 MB", "bytes", 3.2e9),
        ("12 ms", "seconds", 0.012),
        ("45%", "fraction", 0.45),
        ("2.5 days", "days", 2.5),
        ("60 h", "days", 2.5),
        ("7B", "params", 7e9),
        ("1.5x", "ratio", 1.5),
        ("$1,000", "USD", 1000.0),
        ("450 GB/s", "bytes/s", 450e9),
        ("3e21 FLOPs", "FLOPs", 3e21),
        ("12 us", "seconds", 12e-6),
        ("62 count", "count", 62),
        ("3 micro-batches", "micro-batches", 3),
    ],
)
def test_parse(text, unit, value):
    assert units.parse(text, unit) == pytest.approx(value)


def test_wrong_dimension_is_rejected_not_converted():
    q = quiz.make("inference.kv_cache_bytes", 0)
    r = q.check("12 ms")
    assert not r.ok and r.value is None and "bytes" in r.feedback
    with pytest.raises(units.UnitError, match="seconds"):
        units.parse("3 GB", "seconds")
    with pytest.raises(units.UnitError):
        units.parse("lots", "bytes")


def test_feedback_diagnoses_common_slips():
    q = quiz.make("inference.kv_cache_bytes", 3)
    assert "K and V" in q.check(q.answer / 2).feedback
    assert "GiB" in q.check(f"{q.answer / 1e9} GiB").feedback
    assert q.check(f"{q.answer / 1e9:.6g} GB").ok
    m = quiz.make("memory.model_states", 11)
    wrong = quiz.make("memory.model_states", 11)
    assert m.check(m.answer).ok and wrong.tolerance == 0.02


# ---- second routes: each key re-derived by hand formulas or a measurement ----------------------
def _hand(q):
    """An independent hand formula for the family, or None if covered elsewhere."""
    p = q.params
    f = q.family
    if f.startswith("comm.") and f.endswith("_time"):
        n, S, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
        lg = math.ceil(math.log2(n))
        pw = 2 ** int(math.log2(n))
        table = {
            ("all_reduce", "ring"): (2 * (n - 1), 2 * (n - 1) / n),
            ("all_reduce", "tree"): (2 * lg, 2),
            ("all_reduce", "binomial_tree"): (2 * lg, 2 * lg),
            ("all_reduce", "rabenseifner"): (2 * lg, 2 * (n - 1) / n),
            ("all_reduce", "recursive_doubling"): (int(math.log2(pw)) + 2 * (pw != n),) * 2,
            ("all_gather", "ring"): (n - 1, (n - 1) / n),
            ("reduce_scatter", "ring"): (n - 1, (n - 1) / n),
            ("all_to_all", "pairwise"): (n - 1, (n - 1) / n),
            ("broadcast", "binomial_tree"): (lg, lg),
            ("broadcast", "pipelined_chain"): (n - 1, 1),
        }
        ka, kb = table[(p["op"], p["algorithm"])]
        return ka * a + kb * S / b
    if f == "comm.ring_allreduce_bytes_sent":
        return 2 * (p["n"] - 1) / p["n"] * p["bytes"]
    if f == "comm.allgather_bytes_sent":
        return (p["n"] - 1) / p["n"] * p["bytes"]
    if f == "comm.ring_tree_crossover":
        n = p["n"]
        return n * (n - 1 - math.ceil(math.log2(n))) * p["alpha"] * p["beta"]
    if f == "data_parallel.ddp_bytes_per_step":
        return 2 * (p["n"] - 1) / p["n"] * 2 * p["n_params"]
    if f == "data_parallel.zero_bytes_per_step":
        return (3 if p["zero"] == 3 else 2) * (p["n"] - 1) / p["n"] * 2 * p["n_params"]
    if f == "data_parallel.zero3_vs_ddp_traffic":
        return 1.5
    if f in ("tensor.tp_bytes_per_layer", "tensor.sp_bytes_per_layer"):
        return 2 * 2 * (p["tp"] - 1) / p["tp"] * p["b"] * p["s"] * p["h"] * 2
    if f == "expert_context.ep_bytes_per_layer":
        return 4 * p["top_k"] * p["tokens"] * p["hidden"] * (p["ep"] - 1) / p["ep"] * 2
    if f == "expert_context.ep_vs_tp_moe":
        return p["top_k"]
    if f == "expert_context.cp_causal_imbalance":
        return p["cp"]
    if f == "memory.model_states":
        n, dp, z = p["n_params"], p["dp"], p["zero"]
        return 2 * n / (dp if z >= 3 else 1) + 2 * n / (dp if z >= 2 else 1) + 12 * n / (dp if z >= 1 else 1)
    if f == "flops.training_days":
        from mlsys_nb import hardware

        return 6 * p["n_params"] * p["tokens"] / (p["n_gpus"] * hardware.gpu(p["gpu"]).peak("bf16") * p["mfu"]) / 86400
    if f == "flops.training_flops":
        return 6 * p["n_params"] * p["tokens"]
    if f == "flops.mfu":
        from mlsys_nb import hardware

        return p["tokens_per_s"] * 6 * p["n_params"] / (p["n_gpus"] * hardware.gpu(p["gpu"]).peak("bf16"))
    if f == "scaling.twenty_rule_params":
        return math.sqrt(p["C"] / 120)
    if f == "inference.kv_cache_bytes":
        from mlsys_nb import memory

        c = memory.preset(p["preset"])
        b = {"bf16": 2, "fp8": 1, "fp32": 4, "int8": 1}[p["dtype"]]
        return 2 * c.n_layers * c.n_kv_heads * c.head_dim * b * p["tokens"]
    if f == "pipeline.bubble_fraction":
        from mlsys_nb import pipeline as pl

        cf = pl.closed_form(p["schedule"], p["p"], p["m"], p["v"], F=1.0, B=1.0, W=1.0)
        if cf["bubble_time"] is None:
            return None
        busy = 3.0 * p["m"]
        return cf["bubble_time"] / (busy + cf["bubble_time"])
    if f == "pipeline.bubble_ratio":
        v = p["v"] or 1
        return (p["p"] - 1) / (p["m"] * v)
    if f == "pipeline.interleaving_gain":
        return p["v"]
    if f == "pipeline.peak_activations_gpipe":
        return p["m"]
    if f in ("pipeline.peak_activations_1f1b", "pipeline.peak_activations_zb_h1"):
        return min(p["p"], p["m"])
    if f == "serving.speculative_tokens_per_step":
        return sum(p["alpha"] ** i for i in range(p["k"] + 1))
    if f == "serving.prefix_sharing_savings":
        from mlsys_nb import memory

        c = memory.preset(p["preset"])
        return (
            (p["n"] - 1)
            * (p["prefix"] // p["block_size"])
            * p["block_size"]
            * (2 * c.n_layers * c.n_kv_heads * c.head_dim * 2)
        )
    if f == "serving.paged_utilization":
        L, bs = p["lengths"], p["block_size"]
        return sum(L) / sum(math.ceil(x / bs) * bs for x in L)
    if f == "rl.gae_advantage":
        r, v, g, lam = p["rewards"], p["values"], p["gamma"], p["lam"]
        vals = v + [p["last_value"]]
        return sum((g * lam) ** t * (r[t] + g * vals[t + 1] - vals[t]) for t in range(len(r)))
    if f == "expert_context.ep_all_to_all_time":
        n, S = p["ep"], p["top_k"] * p["tokens"] * p["hidden"] * 2
        return (n - 1) * p["alpha"] + (n - 1) / n * S / p["beta"]
    if f == "expert_context.cp_ring_bytes":
        blk = 2 * p["b"] * p["seq_len"] // p["cp"] * p["n_kv_heads"] * p["head_dim"] * 2
        return (p["cp"] - 1 if p["pass"] == "forward" else 2 * p["cp"] - 1) * blk
    if f == "tensor.tp_allreduce_time_per_layer":
        n, S = p["tp"], p["b"] * p["s"] * p["h"] * 2
        return 2 * (2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * S / p["beta"])
    if f == "comm.busbw":
        n = p["n"]
        factor = 2 * (n - 1) / n if p["op"] == "all_reduce" else (n - 1) / n
        return p["bytes"] / p["seconds"] * factor
    if f in ("flops.gpu_hours", "flops.cost_usd"):
        from mlsys_nb import hardware

        h = 6 * p["n_params"] * p["tokens"] / (hardware.gpu(p["gpu"]).peak("bf16") * p["mfu"]) / 3600
        return h * p.get("price", 1.0)
    if f == "flops.implied_mfu":
        from mlsys_nb import hardware

        return 6 * p["n_params"] * p["tokens"] / (p["gpu_hours"] * 3600 * hardware.gpu(p["gpu"]).peak("bf16"))
    if f == "memory.bytes_per_param":  # params + grads + optimizer states + fp32 master, by hand
        table = {
            ("bf16-mixed", "adam"): 2 + 2 + 4 + 4 + 4,
            ("fp32", "adam"): 4 + 4 + 4 + 4,
            ("bf16-mixed", "sgd-momentum"): 2 + 2 + 4 + 4,
            ("fp32", "sgd"): 4 + 4,
            ("bf16-mixed", "adam-8bit"): 2 + 2 + 1 + 1 + 4,
        }
        return table[(p["precision"], p["optimizer"])]
    if f.startswith("scaling.") and "law" in p:
        from mlsys_nb import scaling

        L = scaling.law(p["law"])
        if f == "scaling.loss":
            return L.E + L.A / p["N"] ** L.alpha + L.B / p["D"] ** L.beta
        a, b = L.alpha, L.beta
        G = (a * L.A / (b * L.B)) ** (1 / (a + b))
        n = G * (p["C"] / 6) ** (b / (a + b))
        d = p["C"] / (6 * n)
        return {"scaling.chinchilla_params": n, "scaling.chinchilla_tokens": d, "scaling.tokens_per_param": d / n}[f]
    if f == "inference.kv_bytes_per_token":
        from mlsys_nb import memory

        c = memory.preset(p["preset"])
        if c.kv_lora_rank:
            return (c.kv_lora_rank + c.rope_head_dim) * c.n_layers * 2
        return 2 * c.n_layers * c.n_kv_heads * c.head_dim * 2
    if f == "inference.ridge_point":
        from mlsys_nb import hardware

        g = hardware.gpu(p["gpu"])
        return g.peak("bf16") / g.hbm_bandwidth_bytes_per_s
    if f == "serving.speculative_speedup":
        return sum(p["alpha"] ** i for i in range(p["k"] + 1)) / (p["k"] * p["c"] + 1)
    if f == "rl.weight_sync_time":
        return (p["n"] - 1) * p["alpha"] + 2 * p["n_params"] / p["beta"]
    if f == "pipeline.makespan":
        from mlsys_nb import pipeline as pl

        bt = pl.closed_form(p["schedule"], p["p"], p["m"], p["v"], F=1.0, B=1.0, W=1.0)["bubble_time"]
        return None if bt is None else 3.0 * p["m"] + bt
    if f == "pipeline.min_microbatches":
        q, t = p["p"] - 1, p["target"]
        return max(1, math.ceil(q * (1 - t) / t - 1e-9))
    if f.startswith("pipeline.peak_activations_"):  # the closed form vs the simulator's count
        from mlsys_nb import pipeline as pl

        if p["schedule"] == "zbv" and p["m"] < 2 * p["p"] - 1:
            return None
        return pl.peak_in_flight(p["schedule"], p["p"], p["m"], p["v"])[0]
    if f == "layout.modelled_mfu":
        from mlsys_nb import flops, hardware, memory

        c = flops.flops_per_token(memory.preset(p["model"]), 4096) * p["global_batch_tokens"]
        return c / (p["gpus"] * hardware.gpu(p["gpu"]).peak("bf16") * p["step_s"])
    if f == "inference.gqa_kv_saving":
        from mlsys_nb import memory

        c = memory.preset(p["preset"])
        return c.n_heads / c.n_kv_heads
    if f == "serving.static_batching_utilization":
        return sum(p["lengths"]) / (len(p["lengths"]) * max(p["lengths"]))
    if f == "rl.ppo_clipped_objective":
        r, a, e = p["ratio"], p["advantage"], p["clip"]
        return min(r * a, min(max(r, 1 - e), 1 + e) * a)
    if f == "data_parallel.grad_allreduce_time":
        n = p["n"]
        return 2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * 2 * p["n_params"] / p["beta"]
    if f == "data_parallel.bucketing_speedup":
        n, S, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
        k = math.ceil(S / p["bucket"])
        lat, bw = 2 * (n - 1) * a, 2 * (n - 1) / n * S / b
        return (p["tensors"] * lat + bw) / (k * lat + bw)
    if f == "rl.grpo_advantage":
        r, i = p["rewards"], p["index"]
        mean = sum(r) / len(r)
        std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
        return (r[i] - mean) / (std + 1e-6)
    if f == "rl.dpo_loss":
        m = p["beta"] * ((p["pc"] - p["rc"]) - (p["pr"] - p["rr"]))
        return math.log1p(math.exp(-m))
    if f == "rl.kl_k3_estimate":
        q = p["logp_ref"] - p["logp"]
        return math.exp(q) - q - 1
    if f == "serving.overlap_scheduling_speedup":
        return (p["cpu_s"] + p["model_s"]) / max(p["cpu_s"], p["model_s"])
    return None


HAND = [
    "comm.allreduce_time",
    "comm.allreduce_tree_time",
    "comm.allreduce_binomial_time",
    "comm.allreduce_rabenseifner_time",
    "comm.allreduce_recursive_doubling_time",
    "comm.allgather_time",
    "comm.reduce_scatter_time",
    "comm.all_to_all_time",
    "comm.broadcast_tree_time",
    "comm.broadcast_chain_time",
    "comm.ring_allreduce_bytes_sent",
    "comm.allgather_bytes_sent",
    "comm.ring_tree_crossover",
    "data_parallel.ddp_bytes_per_step",
    "data_parallel.zero_bytes_per_step",
    "data_parallel.zero3_vs_ddp_traffic",
    "tensor.tp_bytes_per_layer",
    "tensor.sp_bytes_per_layer",
    "expert_context.ep_bytes_per_layer",
    "expert_context.ep_vs_tp_moe",
    "expert_context.cp_causal_imbalance",
    "memory.model_states",
    "flops.training_days",
    "flops.training_flops",
    "flops.mfu",
    "scaling.twenty_rule_params",
    "inference.kv_cache_bytes",
    "pipeline.bubble_fraction",
    "pipeline.bubble_ratio",
    "pipeline.interleaving_gain",
    "pipeline.peak_activations_gpipe",
    "pipeline.peak_activations_1f1b",
    "pipeline.peak_activations_zb_h1",
    "serving.speculative_tokens_per_step",
    "serving.prefix_sharing_savings",
    "serving.paged_utilization",
    "rl.gae_advantage",
    "expert_context.ep_all_to_all_time",
    "expert_context.cp_ring_bytes",
    "tensor.tp_allreduce_time_per_layer",
    "comm.busbw",
    "flops.gpu_hours",
    "flops.cost_usd",
    "flops.implied_mfu",
    "memory.bytes_per_param",
    "scaling.loss",
    "scaling.chinchilla_params",
    "scaling.chinchilla_tokens",
    "scaling.tokens_per_param",
    "inference.kv_bytes_per_token",
    "inference.ridge_point",
    "serving.speculative_speedup",
    "rl.weight_sync_time",
    "pipeline.makespan",
    "pipeline.min_microbatches",
    "pipeline.peak_activations_interleaved_1f1b",
    "pipeline.peak_activations_zb_h2",
    "pipeline.peak_activations_zbv",
    "layout.modelled_mfu",
    "inference.gqa_kv_saving",
    "serving.static_batching_utilization",
    "rl.ppo_clipped_objective",
    "data_parallel.grad_allreduce_time",
    "data_parallel.bucketing_speedup",
    "rl.grpo_advantage",
    "rl.dpo_loss",
    "rl.kl_k3_estimate",
    "serving.overlap_scheduling_speedup",
]


@pytest.mark.parametrize("name", HAND)
def test_key_matches_hand_formula(name):
    checked = 0
    for seed in range(30):
        q = quiz.make(name, seed)
        want = _hand(q)
        if want is None:
            continue
        assert q.answer == pytest.approx(want, rel=1e-6), (name, seed, q.params)
        checked += 1
    assert checked >= 10


def test_hand_route_catches_a_broken_key(monkeypatch):
    """The second route fails when the calculator's idea is broken (KV cache without V)."""
    from mlsys_nb.inference import kv_cache

    monkeypatch.setattr(
        kv_cache,
        "kv_bytes_per_token",
        lambda model, dtype="bf16": (
            0.5
            * (
                2
                * kv_cache._config(model).n_layers
                * kv_cache._config(model).n_kv_heads
                * kv_cache._config(model).head_dim
                * kv_cache._dtype_bytes(dtype)
            )
        ),
    )
    q = quiz.make("inference.kv_cache_bytes", 0)
    assert q.answer != pytest.approx(_hand(q), rel=1e-3)


def test_pipeline_key_matches_the_measured_timeline():
    """bubble_fraction re-derived from the simulated timeline's op rows (idle = makespan − Σ op durations)."""
    from mlsys_nb import pipeline as pl

    for seed in range(15):
        q = quiz.make("pipeline.bubble_fraction", seed)
        p = q.params
        r = pl.simulate(pl.schedule(p["schedule"], p["p"], p["m"], p["v"]), F=1.0, B=1.0, W=1.0)
        busy = sum(e - s for *_, s, e in r.rows())
        assert q.answer == pytest.approx(1 - busy / (p["p"] * r.makespan), rel=1e-9)


def test_cards_state_the_refuting_numbers():
    z = [quiz.make("cards.zero3_traffic", s) for s in range(10)]
    assert {q.answer for q in z} == {"true", "false"}
    assert all("1.5" in " ".join(q.solution) for q in z)
    assert any("16" in " ".join(q.solution) for q in [quiz.make("cards.adam_bytes_per_param", 0)])
    one = quiz.make("cards.one_f_one_b_bubble", 0)
    s = " ".join(one.solution)
    import re

    g, o = re.findall(r"GPipe ([\d.]+), 1F1B ([\d.]+)", s)[0]
    assert g == o  # the same bubble, measured by the simulator


def test_choice_accepts_letters_and_rejects_unknown():
    q = quiz.make("comm.faster_allreduce", 0)
    letter = "ab"[q.choices.index(q.answer)]
    assert q.check(letter).ok and q.check(q.answer.upper()).ok
    r = q.check("banana")
    assert not r.ok and "options" in r.feedback


def test_cli_show_solutions_and_answers_file(tmp_path):
    env = {**__import__("os").environ}
    out = subprocess.run(
        [sys.executable, "-m", "mlsys_nb.quiz", "--topic", "pipeline", "-n", "3", "--seed", "1", "--show-solutions"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("Answer:") == 3
    ws = quiz.worksheet(["pipeline"], 3, seed=1)
    answers = tmp_path / "a.txt"
    answers.write_text("\n".join(str(q.answer) if q.is_choice else repr(q.answer) for q in ws) + "\n")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mlsys_nb.quiz",
            "--topic",
            "pipeline",
            "-n",
            "3",
            "--seed",
            "1",
            "--answers-file",
            str(answers),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert "score 3/3" in out.stdout


def test_html_worksheets(tmp_path):
    from mlsys_nb.quiz import html

    paths = html.write_worksheets(tmp_path, seed=5, n=3, topics=["pipeline", "memory"])
    names = sorted(p.name for p in paths)
    assert "pipeline.html" in names and "pipeline_answers.html" in names and "index.html" in names
    sheet = (tmp_path / "pipeline.html").read_text()
    key = (tmp_path / "pipeline_answers.html").read_text()
    ws = quiz.worksheet(["pipeline"], 3, seed=5)
    first = next(iter(ws))
    import html as h

    assert h.escape(first.answer_text()) not in sheet and h.escape(first.answer_text()) in key


def test_max_micro_batch_is_the_edge_of_fitting():
    """Second route for the search families: the answer fits and one more does not."""
    from mlsys_nb import memory
    from mlsys_nb.config import TrainConfig

    for seed in range(5):
        q = quiz.make("memory.max_micro_batch", seed)
        p = q.params
        t = TrainConfig(seq_len=p["seq_len"], dp=p["dp"], zero=p["zero"], recompute=p["recompute"], gpu=p["gpu"])
        m = memory.preset(p["model"])
        b = memory.estimate(m, t.replace(micro_batch=int(q.answer)))
        nxt = memory.estimate(m, t.replace(micro_batch=int(q.answer) + 1))
        assert b.total <= b.gpu_memory < nxt.total


def test_oom_knob_has_exactly_one_fix():
    from mlsys_nb import memory
    from mlsys_nb.config import TrainConfig

    for seed in range(5):
        q = quiz.make("memory.oom_knob", seed)
        p = q.params
        t = TrainConfig(micro_batch=p["micro_batch"], seq_len=p["seq_len"], dp=p["dp"], zero=p["zero"], gpu=p["gpu"])
        m = memory.preset(p["model"])
        assert not memory.estimate(m, t).fits
        changes = {
            "ZeRO-3": dict(zero=3),
            "full recompute": dict(recompute="full"),
            "TP = 8 with SP": dict(tp=8, sp=True),
            "halve the micro-batch": dict(micro_batch=max(1, t.micro_batch // 2)),
        }
        fits = [k for k in q.choices if memory.estimate(m, t.replace(**changes[k])).fits]
        assert fits == [q.answer]


def test_each_solution_cites_a_real_notebook_section_and_reference_entry():
    """Sections name existing notebooks and their real headings; references name real entries of
    docs/references.md."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    anchors = set(re.findall(r"^### .*\[([a-z0-9-]+)\]\s*$", (root / "docs" / "references.md").read_text(), re.M))
    headings = {}
    for nb in (root / "notebooks").glob("*.ipynb"):
        cells = json.loads(nb.read_text())["cells"]
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        headings[nb.name] = [re.sub(r"[`*]", "", h) for h in re.findall(r"^## (.*)$", text, re.M)]
    for name in FAMILIES:
        q = quiz.make(name, 0)
        for nb, secs in re.findall(r"notebooks/(\d\d_\w+\.ipynb)((?:, §[^,;]+)*)", q.section):
            assert nb in headings, (name, nb)
            for num, title in re.findall(r"§(\d+) ([^,;(]+)", secs):
                want = f"{num} · {title.strip()}"
                assert any(h.replace(".", " ·", 1).startswith(want) or h.startswith(want) for h in headings[nb]), (
                    name,
                    nb,
                    want,
                )
        refs = re.findall(r"#([a-z0-9-]+)", q.reference)
        assert refs, (name, q.reference)
        assert set(refs) <= anchors, (name, set(refs) - anchors)


def test_bad_arguments_name_the_parameter():
    from mlsys_nb.config import ArgumentError

    with pytest.raises(ArgumentError, match="difficulty"):
        quiz.draw(difficulty=5)
    with pytest.raises(ArgumentError, match="topic"):
        quiz.draw(topic="nope")
    with pytest.raises(ArgumentError, match="family"):
        quiz.draw(family="nope.nope")
