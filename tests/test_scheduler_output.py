"""The scheduler decides; the runner moves bytes (issue 48, vLLM v1's ``SchedulerOutput``).

``Scheduler.schedule()`` works on a ``BlockManager`` alone (no torch, no model runner, no pool of tensors) and
returns what to run and which K/V blocks move (swap out, swap in, copy-on-write, dropped CPU copies); the
model runner owns the CPU swap pool and does every copy (``ModelRunner.move_blocks``). Checked here: the
scheduler module loads neither torch nor the runner; a scheduler over a bare ``BlockManager`` produces the
swap-out and swap-in a hand count predicts; in the engine, the blocks the runner swaps back read back equal,
byte for byte, to the blocks the scheduler freed, and a runner that copies nothing out fails that check."""

import subprocess
import sys

import pytest
import torch

from mlsys_nb.inference import LLM, EngineConfig, SamplingParams
from mlsys_nb.inference.block_manager import BlockManager
from mlsys_nb.inference.model_runner import ModelRunner, SwapPool
from mlsys_nb.inference.scheduler import Scheduler, SchedulerOutput
from mlsys_nb.inference.sequence import Sequence, SequenceStatus

VOCAB = 300  # engine_test_model's vocabulary (tests/conftest.py ENGINE_VOCAB)


def test_the_scheduler_imports_neither_torch_nor_the_runner():
    """Fails if scheduler.py (or anything it imports) imports torch, the model runner or the paged pool."""
    code = (
        "import sys; import mlsys_nb.inference.scheduler; "
        "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.') "
        "or k.rsplit('.', 1)[-1] in ('model_runner', 'paged', 'cuda_graphs')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def _seq(i: int, prompt: list[int]) -> Sequence:
    return Sequence(i, f"r{i}", prompt, SamplingParams(max_tokens=8, ignore_eos=True))


def test_a_scheduler_over_a_bare_block_manager_decides_the_swaps():
    """3 blocks of 2 tokens, two 2-token prompts. Step 1 admits both (a block each). Step 2: a's third token
    takes the last free block, b's finds none: b (the youngest) is swapped out, its one computed block in
    ``swap_out`` and free again. When a finishes, b comes back: ``swap_in`` names its new block (first = 0, no
    prefix-cache hit) and a fresh block for its next token. No tensor anywhere: the runner's job."""
    m = BlockManager(3, 2, prefix_caching=False)
    c = EngineConfig(block_size=2, num_blocks=3, preemption_mode="swap", swap_blocks=4, max_num_seqs=2)
    s = Scheduler(m, c)
    a, b = _seq(0, [1, 2]), _seq(1, [3, 4])
    s.add(a)
    s.add(b)
    out = s.schedule()
    assert isinstance(out, SchedulerOutput)
    assert out.scheduled == [(a, 2), (b, 2)] and not (out.swap_out or out.swap_in or out.copies or out.dropped)
    s.update(out.scheduled)
    a.output_token_ids.append(5)
    b.output_token_ids.append(6)
    b_blocks = m.block_table(b.seq_id)

    out = s.schedule()
    assert out.scheduled == [(a, 1)]
    assert out.swap_out == [(b.seq_id, b_blocks)] and not out.swap_in
    assert b.status is SequenceStatus.SWAPPED and s.swapped[0] is b and s.swap_free == 3
    assert b.seq_id not in m.seqs and m.num_free_blocks() == 1  # b's block is free, its bytes not yet copied
    s.update(out.scheduled)
    a.output_token_ids.append(7)

    s.finish(a)  # frees a's two blocks
    out = s.schedule()
    assert out.scheduled == [(b, 1)] and not out.swap_out
    assert out.swap_in == [(b.seq_id, m.block_table(b.seq_id)[:1], 0)]
    assert len(m.block_table(b.seq_id)) == 2  # and one more block for its next token
    assert b.status is SequenceStatus.RUNNING and s.swap_free == 4
    m.check_invariants()


def test_finishing_a_swapped_sequence_drops_its_cpu_copy_at_the_next_step():
    m = BlockManager(3, 2, prefix_caching=False)
    s = Scheduler(m, EngineConfig(block_size=2, num_blocks=3, preemption_mode="swap", max_num_seqs=2))
    a, b = _seq(0, [1, 2]), _seq(1, [3, 4])
    s.add(a)
    s.add(b)
    s.update(s.schedule().scheduled)
    a.output_token_ids.append(5)
    b.output_token_ids.append(6)
    assert s.schedule().swap_out  # b swapped out
    s.finish(b)  # e.g. aborted while swapped
    assert s.swap_free == s.swap_blocks == 3
    assert s.schedule().dropped == [b.seq_id]


def test_a_sequence_swapped_out_and_finished_before_the_next_step_is_neither_copied_nor_dropped():
    """``preempt`` outside ``schedule()`` puts its swap-out in the next output; finishing the sequence first
    takes it back out (a drop after it would run first and leave the copy held in the CPU pool forever)."""
    m = BlockManager(3, 2, prefix_caching=False)
    s = Scheduler(m, EngineConfig(block_size=2, num_blocks=3, preemption_mode="swap", max_num_seqs=2))
    a, b = _seq(0, [1, 2]), _seq(1, [3, 4])
    s.add(a)
    s.add(b)
    s.update(s.schedule().scheduled)
    s.preempt(b)
    assert b.status is SequenceStatus.SWAPPED and s.swap_free == 2
    s.finish(b)
    out = s.schedule()
    assert not out.swap_out and not out.dropped and s.swap_free == s.swap_blocks


def _swap_run(model, monkeypatch, break_it: str = ""):
    """A swapping engine whose runner's ``move_blocks`` is watched: per swapped sequence, the pool's blocks as
    the scheduler freed them (before the runner copies them out) and as the runner wrote them back. Returns
    (every swapped sequence read back equal, number of swap-ins)."""
    if break_it == "no copy out":  # a pool that takes the CPU blocks but copies nothing into them
        monkeypatch.setattr(
            SwapPool, "swap_out", lambda self, sid, kv, blocks: self.held.update({sid: [0] * len(blocks)})
        )
    llm = LLM(model, num_blocks=24, block_size=4, preemption_mode="swap", enable_prefix_caching=False)
    eng = llm.engine
    real, saved, same = eng.runner.move_blocks, {}, []

    def watched(out):
        for sid, blocks in out.swap_out:
            saved[sid] = [t[:, blocks].clone() for t in eng.kv.tensors()]
        swap_in = list(out.swap_in)
        real(out)
        for sid, blocks, first in swap_in:
            back = [t[:, blocks].clone() for t in eng.kv.tensors()]
            same.append(all(torch.equal(x[:, first:], y[:, first:]) for x, y in zip(saved.pop(sid), back)))

    eng.runner.move_blocks = watched
    g = torch.Generator().manual_seed(4)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(5, 30, (1,), generator=g)),), generator=g).tolist()]
    prompts += [torch.randint(0, VOCAB, (20,), generator=g).tolist() for _ in range(7)]
    llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
    assert eng.status()["preemptions"]["swap"] > 0
    return all(same), len(same)


@pytest.mark.parametrize("break_it", ["", "no copy out"])
def test_the_runner_swaps_the_bytes_back_unchanged(engine_test_model, monkeypatch, break_it):
    equal, swapped_in = _swap_run(engine_test_model, monkeypatch, break_it)
    assert swapped_in > 0
    assert equal is (break_it == ""), "a pool that copies nothing out must fail the read-back check"


def test_the_runner_owns_the_swap_pool():
    """The engine's scheduler counts CPU blocks; the runner holds the pool of tensors, sized alike."""
    from mlsys_nb.inference.engine import LLMEngine

    eng = LLMEngine("tiny", num_blocks=8, block_size=4, preemption_mode="swap", swap_blocks=5)
    assert isinstance(eng.runner, ModelRunner) and isinstance(eng.runner.swap_pool, SwapPool)
    assert eng.scheduler.swap_blocks == eng.scheduler.swap_free == len(eng.runner.swap_pool.free) == 5
    assert not any(isinstance(v, torch.Tensor) for v in vars(eng.scheduler).values())
    assert LLMEngine("tiny", num_blocks=8, block_size=4).runner.swap_pool is None
