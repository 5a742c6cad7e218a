"""The engine's model forward compiled with ``torch.compile`` (inductor): ``EngineConfig.compile=True``.

vLLM V1 compiles the model by default and keeps attention out of the compiled graph ("piecewise" graphs: the paged
attention reads per-step metadata a graph cannot hold). The same here: ``CompiledModel`` compiles
``model(tokens, positions=..., cache=PROXY)`` where every layer's ``cache.attend`` is ONE opaque custom op,
``mlsys_nb::paged_attend(q, k, v, layer_idx)``, whose body runs the step's ``StepBatch.attend`` (write the new
K/V into their slots, attend over the paged pool with the configured backend). Everything between two attention
calls (RMSNorm, the residual adds, the projections, RoPE, SwiGLU, the LM head) is inductor's: on CPU it fuses the
elementwise work into a few C++ loops around the matmuls (``TORCH_LOGS=output_code`` prints them;
``generated_kernels()`` lists them by name). The attention inside the op is the backend's own: eager for
"gather"/"tiled"/"varlen"; with ``attention_backend="flex"`` the decodes run FlexAttention's fused kernel, compiled
per power-of-two batch (``flex_paged.FlexPagedAttention``).

Shapes: a step is one packed row of T tokens (``step_batch.StepBatch``), so the only size that changes from step to
step is T. ``dynamic=True`` compiles one graph symbolic in T; PyTorch specializes a size of 1 (it would be a second
graph), so a lone decode is padded to T = 2 (the padding token's rows are dropped around the attention op and never
sampled). After that one compile, no batch size recompiles: ``stats["graphs"]`` counts the graphs
dynamo compiled (a counting backend around inductor's ``compile_fx``; one per frame compile id, so an analysis dynamo
restarts counts once), and
``stats["compile_seconds"]`` the wall time of the calls that compiled (paid once; the first requests' latency).
With ``dynamic=False`` every new T is a new graph (the test's mutation). Dynamo keeps at most
``torch._dynamo.config.recompile_limit`` (8) graphs per code object, shared by every ``CompiledModel`` of a process
(each needs 1); past it, calls run eager. So the engine shares one ``CompiledModel`` per model (``compiled_model``):
engines built one after another on the same weights (a benchmark's repeats) compile once.
"""

from __future__ import annotations

import re
import time
import weakref
from collections import Counter

import torch

__all__ = ["CompiledModel", "PagedAttendProxy", "compiled_model", "generated_kernels"]

_STEP: list = [None]  # the StepBatch of the forward in progress (the op's "forward context", as in vLLM)


@torch.library.custom_op("mlsys_nb::paged_attend", mutates_args=())
def paged_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """The current step's ``StepBatch.attend(layer_idx, q, k, v)``: [1, heads, T, head_dim] (writes the new K/V into
    the pool: a side effect the compiled graph cannot see, so the op is opaque and runs in program order)."""
    step = _STEP[0]
    if step is None:
        raise RuntimeError("mlsys_nb::paged_attend called outside CompiledModel's forward (no step batch set)")
    n = step.tokens.shape[1]  # the step's real tokens (CompiledModel pads a lone decode to 2)
    out = step.attend(layer_idx, q[:, :, :n], k[:, :, :n], v[:, :, :n])
    return torch.nn.functional.pad(out, (0, 0, 0, q.shape[2] - n)).contiguous()


@paged_attend.register_fake
def _(q, k, v, layer_idx):
    return torch.empty_like(q, memory_format=torch.contiguous_format)


class PagedAttendProxy:
    """The ``cache`` the compiled model sees: the same object every step (nothing for the compiler to guard on);
    positions come from the runner, every attention is the opaque op."""

    positions_checked = True  # the step batch's positions were built on the host from bounded lengths

    def begin(self, b: int, s: int):
        return None  # the runner passes ``positions=``

    def attend(self, layer_idx: int, q, k, v):
        return torch.ops.mlsys_nb.paged_attend(q, k, v, layer_idx)

    def commit(self) -> None:
        """Nothing: the scheduler advances ``num_computed_tokens``."""


class CompiledModel:
    """``model`` with its forward compiled, called like the model on a step batch:
    ``compiled(tokens, positions=positions, cache=step_batch)`` -> logits [1, T, vocab].

    ``dynamic``: compile symbolic in the step's token count T (default) or per T (``False``). ``backend``:
    "inductor" (generated C++/Triton kernels) or "eager" (dynamo's graphs run as captured: the same guards and
    recompiles, no code generated; the tests count recompiles with it). ``stats``: graphs compiled and the seconds
    the compiling calls took."""

    def __init__(self, model, dynamic: bool = True, backend: str = "inductor"):
        if backend not in ("inductor", "eager"):
            raise ValueError(f"backend must be 'inductor' or 'eager', got {backend!r}")
        self.model, self.proxy, self.backend, self.dynamic = model, PagedAttendProxy(), backend, dynamic
        self.stats = {"graphs": 0, "compile_seconds": 0.0}
        self.compile_ids: set = set()  # the (frame, recompile) ids dynamo compiled (a retried analysis counts once)
        self.fn = torch.compile(self._forward, backend=self._backend, dynamic=dynamic)

    def _backend(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx  # inductor, as torch.compile's default backend

        cid = torch._guards.CompileContext.current_compile_id()  # frame/recompile number; dynamo may retry a frame
        self.compile_ids.add((cid.frame_id, cid.frame_compile_id) if cid else len(self.compile_ids))
        self.stats["graphs"] = len(self.compile_ids)
        return compile_fx(gm, example_inputs) if self.backend == "inductor" else gm.forward

    def _forward(self, tokens, positions):
        return self.model(tokens, positions=positions, cache=self.proxy)

    def __call__(self, tokens, *, positions, cache):
        graphs, t0 = self.stats["graphs"], time.perf_counter()
        if self.dynamic and tokens.shape[1] == 1:  # a lone decode padded to 2 tokens (T = 1 would be a 2nd graph)
            tokens, positions = tokens.repeat(1, 2), positions.repeat(1, 2)
        _STEP[0] = cache
        try:
            out = self.fn(tokens, positions)
        finally:
            _STEP[0] = None
        if self.stats["graphs"] > graphs:  # this call compiled: its wall time is the compile's
            self.stats["compile_seconds"] += time.perf_counter() - t0
        return out


_BY_MODEL: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its CompiledModel


def compiled_model(model) -> CompiledModel:
    """The one ``CompiledModel`` of ``model`` in this process (made at the first call): what ``EngineConfig.compile``
    uses, so every engine on the same model shares its graph, its compile time and its ``stats``."""
    if model not in _BY_MODEL:
        _BY_MODEL[model] = CompiledModel(model)
    return _BY_MODEL[model]


def generated_kernels() -> dict:
    """What inductor generated for the compiled forward last loaded in this process (the newest Python module it
    wrote that calls ``mlsys_nb.paged_attend``; ``{}`` if none): ``"fused"``, the names of its generated C++ (or
    Triton) kernels, each name listing the ops fused into that one loop (``cpp_fused_add_mean_mul_pow_rsqrt_0``:
    a residual add and an RMSNorm); ``"extern"``, {library call: count} (``mm``: the BLAS matmuls);
    ``"attention_calls"``, the opaque attention op's calls (one per layer); ``"path"``, the module's file."""
    from torch._inductor.codecache import PyCodeCache

    for mod in reversed(PyCodeCache.modules):
        with open(mod.__file__) as f:
            src = f.read()
        calls = src.count("torch.ops.mlsys_nb.paged_attend.default(")
        if calls:
            fused = re.findall(r"\b(cpp_fused_\w+|triton_(?:poi|red|per)_fused_\w+)\(", src)
            return {
                "fused": sorted(set(fused)),
                "fused_calls": len(fused),  # calls per forward (a kernel is reused where its shapes repeat)
                "extern": dict(Counter(re.findall(r"extern_kernels\.(\w+)\(", src))),
                "attention_calls": calls,
                "path": mod.__file__,
            }
    return {}
