"""FLOPs on CUDA: ``FlopCounterMode`` on a real training step equals the kit's formula (the matmul
attention path, full s x s scores, as tests/test_flops.py checks on CPU), and the measured MFU of a bf16
training step against the table peak (data/hardware.yaml)."""

import pytest
import torch

from test_gpu_calibration import table_gpu

pytestmark = pytest.mark.gpu


def test_flop_counter_on_a_cuda_step_equals_the_formula(cuda, record):
    from mlsys_nb import flops
    from mlsys_nb.config import ModelConfig
    from mlsys_nb.models import Transformer

    cfg = ModelConfig(n_layers=2, hidden=256, n_heads=8, n_kv_heads=4, vocab_size=4096, seq_len=256)
    model = Transformer(cfg, attn_impl="matmul").to(cuda)
    x = torch.randint(0, cfg.vocab_size, (2, 256), device=cuda)
    counted = flops.count_flops(model, x)
    want = flops.flops_per_token(cfg, 256, causal=False) * x.numel()
    record("FlopCounterMode / formula (step, CUDA)", counted["total"] / want, "ratio")
    assert counted["total"] == want


def test_training_step_mfu(cuda, record):
    from mlsys_nb import flops
    from mlsys_nb.config import ModelConfig
    from mlsys_nb.models import Transformer, measure

    cfg = ModelConfig(n_layers=8, hidden=2048, n_heads=16, n_kv_heads=8, vocab_size=32768, seq_len=2048)
    model = Transformer(cfg, attn_impl="sdpa").to(cuda, torch.bfloat16).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=True)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.seq_len + 1), generator=g).to(cuda)

    torch.cuda.synchronize()
    # measure_step times wall clock: _Synced makes each step end on the device
    res = measure.measure_step(model, tokens, repeats=5, warmup=2, optimizer=_Synced(opt))
    gpu = table_gpu()
    record("bf16 training step (L8 h2048, 4 x 2048 tokens)", res["step_s"] * 1e3, "ms", "median of 5")
    record("training tokens/s", res["tokens_per_s"], "tokens/s")
    if gpu is not None:
        u = flops.mfu(cfg, res["tokens_per_s"], seq_len=cfg.seq_len, gpu=gpu.name, dtype="bf16")
        record("training step MFU vs table bf16 peak", u, "ratio", f"model FLOPs (causal); table: {gpu.name}")
        assert 0 < u < 1, u


class _Synced:
    """An optimizer whose ``step`` waits for the device, so a wall-clock step time covers the GPU work."""

    def __init__(self, opt):
        self.opt = opt

    def step(self):
        self.opt.step()
        torch.cuda.synchronize()

    def zero_grad(self, set_to_none=True):
        self.opt.zero_grad(set_to_none=set_to_none)
