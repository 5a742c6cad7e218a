"""Inside one GPU: attention kernels, their memory traffic, Triton, the memory hierarchy and fusion (notebook 21).

- ``attention``: ``naive_attention`` (the O(s²) reference), ``flash_attention`` (tiled online softmax in
  plain PyTorch with its own recomputing backward; causal bottom-right aligned, GQA, any lengths),
  ``flash_decode`` (FlashDecoding's split-K), ``decode_splits`` (flash-attn's split-count heuristic) and
  ``merge_partials``, the one online-softmax merge (ring attention in ``parallel/context.py`` uses it too), with
  ``merge_segments`` merging any number of partials per segment at once (the engine's varlen decode attention).
  Tested against ``scaled_dot_product_attention``: outputs and the three input gradients on random shapes.
  ``causal_mask`` (bottom-right aligned), ``fill_splits`` (the fewest splits that fill the SMs).
- ``io``: ``IOCounter`` counts the bytes an algorithm loads and stores; ``naive_forward_io`` and
  ``flash_forward_io`` (the paper's Algorithm 1 with its block sizes from the SRAM size, ``paper_block_sizes``)
  run through it;
  ``peak_forward_bytes`` reads peak memory from the profiler's memory timeline.
- ``triton_kernels`` (imported on its own; needs ``pip install -e .[kernels]``): vector add, fused softmax,
  tiled matmul and FlashAttention's forward in Triton, interpreted on CPU tensors.
- ``triton_int8`` and ``triton_fused`` (each imported on its own, as ``triton_kernels``): an int8 weight-only
  matmul for decode (``int8_weight_only_matmul``, notebook 23); fused RMSNorm (+ residual) and SwiGLU, forward
  and backward (``fused_rms_norm``, ``swiglu``).
- ``triton_flash`` (imported on its own, as ``triton_kernels``): FlashAttention's forward and backward written to
  be fast on a GPU (tensor cores, autotuned tiles, the causal loop stopped at the diagonal), differentiable as
  ``flash_attention_triton``; interpreted on CPU tensors.
- ``hierarchy``: this CPU's caches and streaming-read bandwidth, real ops on the roofline; ``fusion``: an
  elementwise chain eager vs ``torch.compile`` beside a bytes model.

Importing this package sets ``TRITON_INTERPRET=1`` when no CUDA device is present and the variable is
unset: Triton reads it when it decorates its own library functions, so it must be set before anything
(``torch.compile``, the profiler) imports Triton.
"""

import os as _os

import torch as _torch

if "TRITON_INTERPRET" not in _os.environ and not _torch.cuda.is_available():
    _os.environ["TRITON_INTERPRET"] = "1"

from .attention import (
    causal_mask,
    decode_key_blocks,
    decode_splits,
    fill_splits,
    flash_attention,
    flash_decode,
    merge_partials,
    merge_segments,
    naive_attention,
    tile_partial,
)
from .io import (
    IOCounter,
    flash_forward_io,
    flash_io_bytes,
    naive_forward_io,
    paper_block_sizes,
    peak_forward_bytes,
    score_matrix_bytes,
)

__all__ = [
    "IOCounter",
    "causal_mask",
    "decode_key_blocks",
    "decode_splits",
    "fill_splits",
    "flash_attention",
    "flash_decode",
    "flash_forward_io",
    "flash_io_bytes",
    "merge_partials",
    "merge_segments",
    "naive_attention",
    "naive_forward_io",
    "paper_block_sizes",
    "peak_forward_bytes",
    "score_matrix_bytes",
    "tile_partial",
]
