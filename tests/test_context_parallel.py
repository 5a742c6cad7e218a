"""Context parallelism (``mlsys_nb.parallel.context``) on 2, 4 and 8 gloo ranks.

One launch per world size runs ``context_parallel_checks.cp_checks``: ring and all-gather-KV
attention, causal and not, contiguous and zig-zag chunks, grouped-query attention, against
PyTorch's SDPA on the whole sequence (outputs and the q, k, v gradients); the work per rank (load
balance), the bytes sent, a deliberately broken merge that must be caught, and the K/V memory a
rank really holds (measured with ``LiveBytes``), with a ring that keeps every block it received."""

from __future__ import annotations

import pytest
import torch

import mlsys_nb
from mlsys_nb.parallel import context as cpm

TOL = 1e-5
B, KV, D = 2, 2, 8


@pytest.fixture(scope="module", params=[2, 4, 8], ids=["cp2", "cp4", "cp8"])
def results(request):
    from context_parallel_checks import cp_checks

    return mlsys_nb.launch(cp_checks, world_size=request.param, timeout=240.0, output="quiet")


def _cases(res):
    return {k: v for k, v in res.items() if k.startswith(("ring/", "allgather/"))}


@pytest.mark.slow
def test_outputs_and_gradients_equal_full_attention(results):
    bad = []
    for r, res in enumerate(results):
        cases = _cases(res)
        assert len(cases) == 8
        for name, c in cases.items():
            for k in ("out", "dq", "dk", "dv"):
                if not c[k] <= TOL:
                    bad.append(f"cp={res['world']} rank {r} {name}: {k} = {c[k]:.3g}")
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_waiting_before_compute_gives_the_same_result(results):
    for res in results:
        c = res["no-overlap/ring"]
        assert max(c["out"], c["dq"], c["dk"], c["dv"]) <= TOL
        assert c["fwd_ops"] == res["ring/causal=True/zigzag"]["fwd_ops"]


@pytest.mark.slow
def test_a_wrong_merge_is_caught(results):
    assert max(res["broken/merge"]["out"] for res in results) > 1e-2


@pytest.mark.slow
def test_zigzag_balances_causal_work_and_contiguous_does_not(results):
    cp, s = results[0]["world"], results[0]["seq_len"]
    for layout in cpm.LAYOUTS:
        work = [res[f"ring/causal=True/{layout}"]["work"] for res in results]
        assert work == cpm.causal_work(s, cp, layout), (layout, work)
        full = [res[f"ring/causal=False/{layout}"]["work"] for res in results]
        assert full == [s * s // cp] * cp
    naive = [res["ring/causal=True/contiguous"]["work"] for res in results]
    zz = [res["ring/causal=True/zigzag"]["work"] for res in results]
    assert max(zz) == min(zz)
    assert max(naive) / (sum(naive) / cp) == pytest.approx(2 * cp / (cp + 1))
    assert max(naive) > max(zz)


@pytest.mark.slow
def test_bytes_and_kv_memory_per_rank(results):
    cp, s = results[0]["world"], results[0]["seq_len"]
    want = cpm.ring_bytes_per_layer(B, s, cp, KV, D, dtype="fp32")
    for res in results:
        for layout in cpm.LAYOUTS:
            ring, ag = res[f"ring/causal=True/{layout}"], res[f"allgather/causal=True/{layout}"]
            assert ring["kv_block_bytes"] == want["kv_block"]
            assert ring["fwd_ops"] == {"isend": cp - 1, "irecv": cp - 1}
            assert ring["bwd_ops"] == {"isend": 2 * cp - 1, "irecv": 2 * cp - 1}
            assert ring["fwd_sent"] == want["forward"] and ring["bwd_sent"] == want["backward"]
            # all-gather: the same forward bytes in one collective, the whole K|V held
            assert ag["fwd_ops"] == {"all_gather_into_tensor": 1}
            assert ag["bwd_ops"] == {"reduce_scatter_tensor": 1}
            assert ag["fwd_sent"] == pytest.approx(want["forward"])


def ring_holds_two_blocks(peaks: dict, block: int, cp: int) -> bool:
    """The ring's idea, checked on measured peaks at fixed local tokens: going from 2 ranks to
    ``cp`` ranks adds less than one K|V block (it holds the block in use and the one arriving)."""
    return peaks[cp] - peaks[2] < block


def gathers_all_blocks(peaks: dict, block: int, cp: int) -> bool:
    """All-gather's idea: going from 1 rank to ``cp`` ranks adds at least the ``cp − 1`` K|V blocks
    it gathers (all held at once)."""
    return peaks[cp] - peaks[1] >= (cp - 1) * block


@pytest.mark.slow
def test_kv_memory_measured_per_rank(results):
    """Measured (unique storages alive at the peak): the ring's memory does not grow with cp, the
    all-gather's grows by >= 1 K/V block per rank, and a ring that keeps every received block
    fails the ring's check (from cp = 4 on; at cp = 2 both hold the same 2 blocks)."""
    cp = results[0]["world"]
    for res in results:
        mem, block = res["memory"], res["memory"]["block"]
        assert gathers_all_blocks(mem["allgather"], block, cp), mem
        assert not gathers_all_blocks(mem["ring"], block, cp) or cp <= 2, mem
        assert ring_holds_two_blocks(mem["ring"], block, cp), mem
        if cp >= 4:
            assert not ring_holds_two_blocks(mem["keep-all"], block, cp), mem


def test_positions_cover_the_sequence_once():
    for cp in (1, 2, 4, 8):
        for layout in cpm.LAYOUTS:
            allpos = torch.cat([cpm.positions(16 * cp, cp, r, layout) for r in range(cp)])
            assert torch.equal(allpos.sort().values, torch.arange(16 * cp))
    assert cpm.positions(16, 2, 0, "zigzag").tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert cpm.positions(16, 2, 1, "zigzag").tolist() == [4, 5, 6, 7, 8, 9, 10, 11]


def test_bad_inputs_name_the_parameter():
    with pytest.raises(ValueError, match=r"seq_len must be a multiple of 2·cp=8 \(an int >= 1\), got 12"):
        cpm.check_cp_args(12, 4, layout="zigzag")  # needs a multiple of 2·cp = 8
    cpm.check_cp_args(12, 4, layout="contiguous")
    with pytest.raises(ValueError, match="layout='striped' is not allowed: layout must be one of"):
        cpm.check_cp_args(16, 2, layout="striped")
    with pytest.raises(ValueError, match="n_kv_heads must be an int >= 1 that divides n_heads=4, got 3"):
        cpm.check_cp_args(16, 2, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="cp must be an int >= 1, got 0"):
        cpm.check_cp_args(16, 0)
    with pytest.raises(ValueError, match="seq_len must be a multiple of 2·cp=8 .*got 10"):
        cpm.shard_sequence(torch.zeros(1, 1, 10, 2), 4, 0)
