"""``TrainConfig(finetune=..., offload=...)`` in ``memory.estimate``: LoRA / QLoRA model states and activations,
ZeRO-Offload / ZeRO-Infinity's CPU offload; checked against published figures and against tensors measured on a
real small model (``quant.add_lora``, ``checkpoint.OffloadAdamW``)."""

import math

import pytest
import torch

from mlsys_nb import memory
from mlsys_nb.checkpoint import OffloadAdamW, offload_bytes_per_step
from mlsys_nb.config import ArgumentError, TrainConfig, tiny_config
from mlsys_nb.memory import estimate, preset
from mlsys_nb.models import Transformer
from mlsys_nb.quant import NF4Linear, add_lora
from mlsys_nb.quant.sizing import finetune_bytes

# QLoRA (Dettmers et al. 2023, arXiv:2305.14314, abstract and §1): fine-tuning LLaMA-65B needs "more than 780 GB"
# of GPU memory in 16 bits and "less than 48 GB" with QLoRA (r = 64 adapters on every linear layer of the blocks,
# gradient checkpointing). Counted as the paper does: 16-bit weights and gradients, two fp32 Adam moments.
QLORA_PAPER = dict(precision="bf16-nomaster", optimizer="adamw", recompute="full", micro_batch=1, seq_len=512)


def _65b(finetune, **kw):
    return estimate(preset("llama-65b"), TrainConfig(finetune=finetune, lora_rank=64, **{**QLORA_PAPER, **kw}))


def test_qlora_paper_llama_65b_full_over_780_gb_qlora_under_48_gb():
    full, qlora = _65b("full"), _65b("qlora")
    assert full.total > 780e9 and full.model_states > 780e9
    assert qlora.total < 48e9
    # the NF4 base is what makes it fit: LoRA on the base kept in 16 bits does not
    assert _65b("lora").total > 48e9
    # finetune_bytes (quant.sizing) is a thin caller: the same model-state terms
    fb = finetune_bytes("llama-65b", "qlora", r=64)
    assert fb["total"] == qlora.model_states
    assert fb["weights"] + fb["adapters"] == qlora.params and fb["optimizer"] == qlora.optimizer


def test_qlora_check_fails_when_every_parameter_trains(monkeypatch):
    """The key check broken: adapters that carry the whole model's gradients and optimizer states."""
    real = memory.finetune_elements

    def everything_trains(model, train, n_rank, layers):
        return dict(real(model, train, n_rank, layers), trainable=n_rank)

    monkeypatch.setattr(memory.states, "finetune_elements", everything_trains)  # where stage_states looks it up
    assert _65b("qlora").total > 48e9


def _measured_lora_states(cfg, r, targets, quantize_base):
    """Bytes after one real fp32 AdamW step of a LoRA / QLoRA fine-tune of ``Transformer(cfg)``."""
    torch.manual_seed(0)
    model = add_lora(Transformer(cfg), r=r, alpha=2 * r, targets=targets, quantize_base=quantize_base)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    model(x, x).backward()
    opt.step()

    def nb(ts):
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    nf4 = [m for m in model.modules() if isinstance(m, NF4Linear)]
    return dict(
        frozen=nb(p for p in model.parameters() if not p.requires_grad),
        nf4=nb(b for m in nf4 for b in m.buffers()),
        n_nf4=len(nf4),
        trainable=nb(p for p in model.parameters() if p.requires_grad),
        grads=nb(p.grad for p in model.parameters()),
        moments=nb(v for st in opt.state.values() for k, v in st.items() if k != "step"),
    )


@pytest.mark.parametrize("r,targets", [(4, memory.LORA_TARGETS), (8, ("q_proj", "v_proj")), (3, ("down_proj",))])
def test_lora_state_bytes_measured_equal_the_estimate(r, targets):
    cfg = tiny_config(hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=96, seq_len=8)
    got = _measured_lora_states(cfg, r, targets, quantize_base=False)
    est = estimate(
        cfg,
        TrainConfig(
            precision="fp32",
            optimizer="adamw",
            finetune="lora",
            lora_rank=r,
            lora_targets=targets,
            seq_len=8,
            kernels="eager",
            device="cpu",
        ),
    )
    assert got["frozen"] + got["trainable"] == est.params
    assert got["grads"] == est.grads and got["moments"] == est.optimizer and est.master == 0
    assert est.detail["finetune"]["adapter_bytes"] == got["trainable"]


def test_qlora_state_bytes_measured_match_the_estimate_to_the_per_tensor_constants():
    cfg = tiny_config(hidden=64, n_heads=4, n_kv_heads=2, ffn_hidden=128, seq_len=8)
    got = _measured_lora_states(cfg, 4, memory.LORA_TARGETS, quantize_base=True)
    est = estimate(
        cfg,
        TrainConfig(
            precision="fp32", optimizer="adamw", finetune="qlora", lora_rank=4, seq_len=8, kernels="eager", device="cpu"
        ),
    )
    assert got["grads"] == est.grads and got["moments"] == est.optimizer
    # stored NF4 also holds, per tensor, the fp32 mean of the scales and a whole last block of second-level
    # scales (4 + 4·⌈G/256⌉ - G/64 bytes, in [4, 8)); the closed form counts large tensors
    extra = got["frozen"] + got["nf4"] + got["trainable"] - est.params
    assert 4 * got["n_nf4"] <= extra < 8 * got["n_nf4"]


def test_zero3_shards_frozen_base_and_adapters_over_dp():
    m = preset("llama-2-7b")
    one = estimate(m, TrainConfig(finetune="qlora", lora_rank=16))
    eight = estimate(m, TrainConfig(finetune="qlora", lora_rank=16, dp=8, zero=3))
    for key in ("params", "grads", "optimizer", "master"):
        a, b = getattr(one, key), getattr(eight, key)
        assert b * 8 >= a and b * 8 - a < 8 * 8  # 1/8 each, up to the padding of ceil(n / 8)


def test_lora_adds_the_adapters_a_outputs_to_the_activations():
    m = preset("llama-2-7b")
    base = TrainConfig(micro_batch=2, seq_len=2048)
    full, lora = estimate(m, base), estimate(m, base.replace(finetune="lora", lora_rank=16))
    extra = dict(lora.terms)["LoRA A outputs (B inputs)"]
    assert extra == 2 * 16 * 7 * 2 * 2048  # bf16, r, 7 adapted layers, tokens
    assert lora.activations_per_layer - full.activations_per_layer == extra
    # TP does not split the r-wide outputs (A is replicated on column-parallel layers, all-reduced on row ones)
    tp = estimate(m, base.replace(finetune="lora", lora_rank=16, tp=4, sp=True))
    assert dict(tp.terms)["LoRA A outputs (B inputs)"] == extra


def test_default_fields_leave_the_estimate_unchanged():
    m, t = preset("llama-3.1-8b"), TrainConfig(dp=8, zero=2, tp=2, micro_batch=2)
    a, b = estimate(m, t), estimate(m, t.replace(finetune="full", offload="none", lora_rank=8))
    assert a.as_dict() == b.as_dict() and a.host == 0 and a.offload_bytes_per_step == 0


# ZeRO-Offload (Ren et al. 2021, arXiv:2101.06840, abstract): "train models with over 13 billion parameters on a
# single GPU" (a 32 GB V100), 10x more than PyTorch, by keeping the optimizer states, gradients and update on the host.
V100 = dict(gpu="V100-SXM2-32GB", precision="bf16-mixed", micro_batch=1, seq_len=1024, recompute="full")


def test_zero_offload_headline_13b_fits_one_v100_32gb():
    m = preset("llama-2-13b")
    off, on = estimate(m, TrainConfig(offload="optimizer", **V100)), estimate(m, TrainConfig(**V100))
    assert off.fits and not on.fits
    n = off.n_params_rank
    assert off.grads == off.optimizer == off.master == 0 and off.params == 2 * n
    assert off.host == 16 * n  # fp32 master + fp32 gradients + two fp32 moments, on the host
    assert off.offload_bytes_per_step == offload_bytes_per_step(int(n))["total"] == 4 * n
    # had the gradients stayed on the accelerator, it would not fit (the idea broken)
    assert off.total + 2 * n > off.gpu_memory
    # ZeRO-Infinity's CPU variant: the parameters leave too, fetched twice per step
    inf = estimate(m, TrainConfig(offload="optimizer+params", **V100))
    assert inf.params == 0 and inf.host == off.host + 2 * n and inf.total < off.total
    assert inf.offload_bytes_per_step == 2 * n + 2 * 2 * n


def _offload_step(cfg, monkeypatch=None):
    torch.manual_seed(0)
    model = Transformer(cfg)
    off = OffloadAdamW(model.parameters(), lr=1e-3)
    x = torch.randint(0, cfg.vocab_size, (2, cfg.seq_len))
    model(x, x).backward()
    off.step()
    device = sum(p.numel() * p.element_size() for p in model.parameters())
    device += sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    return off, device


def test_offload_adamw_state_location_equals_the_estimate():
    cfg = tiny_config(seq_len=8)
    est = estimate(
        cfg,
        TrainConfig(precision="fp32", optimizer="adamw", offload="optimizer", seq_len=8, kernels="eager", device="cpu"),
    )
    off, device = _offload_step(cfg)
    assert device == est.model_states  # parameters only: the gradients went to the host
    assert off.host_bytes() == est.host
    assert off.bytes_to_host + off.bytes_to_device == est.offload_bytes_per_step


def test_offload_check_fails_when_gradients_stay_on_the_device(monkeypatch):
    """The key check broken: an offload step that copies the gradients but keeps them on the device."""

    def keep(self):
        for p, m in zip(self.params, self.master):
            m.grad.copy_(p.grad)
            self.bytes_to_host += p.grad.numel() * p.grad.element_size()

    monkeypatch.setattr(OffloadAdamW, "gradients_to_host", keep)
    cfg = tiny_config(seq_len=8)
    est = estimate(cfg, TrainConfig(precision="fp32", offload="optimizer", seq_len=8, kernels="eager", device="cpu"))
    _, device = _offload_step(cfg)
    assert device != est.model_states


def test_bad_finetune_and_offload_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="finetune"):
        TrainConfig(finetune="adapters")
    with pytest.raises(ValueError, match="offload"):
        TrainConfig(offload="nvme")
    with pytest.raises(ArgumentError, match="lora_targets"):
        TrainConfig(finetune="lora", lora_targets=("wq",))
    with pytest.raises(ValueError, match="lora_rank"):
        TrainConfig(lora_rank=0)
    with pytest.raises(ArgumentError, match="model must be a dense model"):
        estimate(preset("mixtral-8x7b"), TrainConfig(finetune="lora", ep=1))
    with pytest.raises(ArgumentError, match="optimizer\\+params"):
        estimate(preset("llama-2-7b"), TrainConfig(finetune="qlora", offload="optimizer+params"))
    with pytest.raises(ArgumentError, match="fp32_grad_accum"):
        estimate(preset("llama-2-7b"), TrainConfig(offload="optimizer", fp32_grad_accum=True))
    assert math.isfinite(estimate(preset("llama-2-7b"), TrainConfig(offload="optimizer", zero=1, dp=4)).host)
