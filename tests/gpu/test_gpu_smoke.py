"""Smoke subset (``-m "gpu and smoke"``, well under 60 s): the device answers, one bf16 matmul on the
tensor cores is right, and one serving-engine run on CUDA equals greedy decoding by recomputation."""

import pytest
import torch

from mlsys_nb.runtime.gpu_record import cuda_seconds

pytestmark = [pytest.mark.gpu, pytest.mark.smoke]


def test_device_query(cuda, record):
    p = torch.cuda.get_device_properties(cuda)
    free, total = torch.cuda.mem_get_info(cuda)
    assert total == p.total_memory and 0 < free <= total
    record("device total memory", p.total_memory, "B", "torch.cuda.get_device_properties().total_memory")
    record("streaming multiprocessors", p.multi_processor_count, "SMs")
    record("free memory at start", free, "B", "torch.cuda.mem_get_info")
    # the CUDA context: memory the device reports in use that the caching allocator does not hold
    x = torch.ones(1, device=cuda)
    free, total = torch.cuda.mem_get_info(cuda)
    context = total - free - torch.cuda.memory_reserved(cuda)
    assert context > 0 and x.item() == 1
    record("CUDA context and other processes", context, "B", "total - free - memory_reserved after 1 tensor")


def test_one_bf16_matmul(cuda, record):
    n = 4096
    g = torch.Generator(device=cuda).manual_seed(0)
    a = torch.randn(n, n, device=cuda, generator=g, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=cuda, generator=g, dtype=torch.bfloat16)
    c = a @ b
    # independent reference: fp64 on the same (bf16-exact) inputs, a sample of rows
    want = a[:64].double() @ b.double()
    rel = ((c[:64].double() - want).norm() / want.norm()).item()
    assert rel < 1e-2, rel  # bf16 output rounding is 2^-9 = 2e-3 relative per element
    t = min(cuda_seconds(lambda: a @ b, reps=5, warmup=2))
    record("bf16 matmul 4096^3 (smoke)", 2 * n**3 / t / 1e12, "TFLOP/s", "best of 5, CUDA events")


def test_one_engine_run_on_cuda(cuda, record):
    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference import LLM, SamplingParams
    from mlsys_nb.models import Transformer

    torch.manual_seed(0)
    model = Transformer(load_model_preset("tiny").replace(vocab_size=300)).to(cuda).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5)  # well separated logits: no near-ties for argmax
    prompts = [[1, 2, 3, 4, 5], list(range(10, 40))]
    outs = LLM(model).generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)
    for prompt, out in zip(prompts, outs):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(8):
                ids.append(int(model(torch.tensor([ids], device=cuda))[0, -1].argmax()))
        assert out.outputs[0].token_ids == ids[len(prompt) :]
    assert model.embed.weight.device.type == "cuda"
    record("engine greedy == recompute (tiny, 2 prompts x 8 tokens)", "equal", "", "fp32 on CUDA")
