"""ZeRO-Offload from scratch (Ren et al. 2021): the optimizer states and the AdamW update live on the host.

Per step the accelerator computes forward and backward as usual; then its gradients go to the host
(device -> host), the host runs AdamW on an fp32 master copy with the fp32 moments, and the updated
parameters come back (host -> device). The accelerator never holds the optimizer states (8 bytes per
parameter for AdamW's two moments, plus 4 for an fp32 master under mixed precision).

``OffloadAdamW`` does exactly that and counts the bytes it moves in each direction; on a CPU-only
machine "device" and "host" are both CPU memory, so the copies are real but the accelerator-side saving
is a model. ``offload_bytes_per_step``, ``offload_time`` and ``offload_break_even_tokens`` are the
model: when does the traffic over PCIe hide under the step's compute (labelled as a model; the GPU and
link figures come from ``data/hardware.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_int, check_number, dtype_bytes
from ..hardware import gpu as gpu_spec
from ..hardware import link as link_spec

__all__ = ["OffloadAdamW", "offload_bytes_per_step", "OffloadTime", "offload_time", "offload_break_even_tokens"]


class OffloadAdamW:
    """AdamW whose master weights and moments live on ``host``; ``step()`` copies the gradients there,
    updates, and copies the parameters back (cast to the parameters' dtype).

    ``bytes_to_host`` / ``bytes_to_device``: bytes copied so far in each direction."""

    def __init__(self, params, *, host="cpu", **adamw_kwargs):
        import torch  # here, so that the offload formulas below load without torch

        self.params = [p for p in params if p.requires_grad]
        if not self.params:
            raise ValueError("params must contain at least one tensor that requires grad")
        self.master = [p.detach().to(host, torch.float32, copy=True) for p in self.params]
        for m in self.master:
            m.grad = torch.zeros_like(m)
        self.inner = torch.optim.AdamW(self.master, **adamw_kwargs)
        self.bytes_to_host = 0
        self.bytes_to_device = 0

    def gradients_to_host(self) -> None:
        """Step 1 of ``step``: copy each gradient to its fp32 master's ``.grad`` on the host, free the device's."""
        for p, m in zip(self.params, self.master):
            m.grad.copy_(p.grad)  # device -> host (cast up to fp32 if the gradient is bf16/fp16)
            self.bytes_to_host += p.grad.numel() * p.grad.element_size()
            p.grad = None  # the device no longer holds it (ZeRO-Offload streams gradients out during backward)

    def parameters_to_device(self) -> None:
        """Step 3 of ``step``: copy the updated fp32 masters back into the device parameters (cast down)."""
        import torch

        with torch.no_grad():
            for p, m in zip(self.params, self.master):
                p.copy_(m)  # host -> device (cast down to the parameter's dtype)
                self.bytes_to_device += p.numel() * p.element_size()

    def step(self) -> None:
        self.gradients_to_host()
        self.inner.step()
        self.parameters_to_device()

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def host_bytes(self) -> int:
        """Bytes this optimizer holds on the host: ``state_bytes()`` plus the fp32 gradient copies."""
        return self.state_bytes() + sum(m.grad.numel() * m.grad.element_size() for m in self.master)

    def state_bytes(self) -> int:
        """Bytes of optimizer state held on the host (master copy and AdamW's two moments)."""
        total = sum(m.numel() * m.element_size() for m in self.master)
        for state in self.inner.state.values():
            total += sum(v.numel() * v.element_size() for v in state.values() if v.dim())
        return total


def offload_bytes_per_step(n_params: int, grad_dtype="bf16", param_dtype="bf16", *, params_on_host=False) -> dict:
    """Bytes one step moves: gradients to the host (``n · bytes(grad)``) and parameters back
    (``n · bytes(param)``); bf16 both ways is ZeRO-Offload's ``2Ψ + 2Ψ = 4Ψ``. ``params_on_host``
    (ZeRO-Infinity's CPU offload of the parameters): they stay on the host and are fetched twice per step,
    for forward and for backward (``2n · bytes(param)``), while the updated ones need not come back."""
    n = check_int("n_params", n_params, 1)
    down, up = n * dtype_bytes(grad_dtype, "grad_dtype"), n * dtype_bytes(param_dtype, "param_dtype")
    if params_on_host:
        up = 2 * up
    return {"to_host": down, "to_device": up, "total": down + up}


@dataclass(frozen=True)
class OffloadTime:
    """A model of one step with offload, in seconds: ``compute_s`` (6·N·tokens at ``mfu`` of the GPU's
    bf16 peak), ``transfer_s`` (the step's bytes over the link, one direction at a time), ``hidden``
    (transfer fits under compute, so overlapped it costs nothing)."""

    compute_s: float
    transfer_s: float
    hidden: bool
    exposed_s: float  # transfer time left over when overlapped with compute: max(0, transfer - compute)


def offload_time(
    n_params: int, tokens_per_step: float, gpu: str = "H100-SXM", link: str = "pcie5-x16", mfu: float = 0.4
) -> OffloadTime:
    """Model (not measured): compute ``6·N·tokens / (peak_bf16·mfu)`` against ``4N`` bytes over ``link``'s
    per-direction bandwidth; gradients stream out during backward and parameters come back after the
    host's update, so at best the transfer hides under compute."""
    n = check_int("n_params", n_params, 1)
    tokens = check_number("tokens_per_step", tokens_per_step, 0.0, lo_open=True, unit="tokens")
    m = check_number("mfu", mfu, 0.0, 1.0, lo_open=True)
    compute = 6.0 * n * tokens / (gpu_spec(gpu).peak("bf16") * m)
    transfer = offload_bytes_per_step(n)["total"] / link_spec(link).per_direction_bytes_per_s
    return OffloadTime(compute, transfer, transfer <= compute, max(0.0, transfer - compute))


def offload_break_even_tokens(gpu: str = "H100-SXM", link: str = "pcie5-x16", mfu: float = 0.4) -> float:
    """Tokens per GPU per step above which the offload traffic hides under compute (model):
    ``4·peak·mfu / (6·bandwidth)``; the parameter count cancels."""
    m = check_number("mfu", mfu, 0.0, 1.0, lo_open=True)
    return 4.0 * gpu_spec(gpu).peak("bf16") * m / (6.0 * link_spec(link).per_direction_bytes_per_s)
