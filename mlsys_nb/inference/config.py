"""``EngineConfig``: every option of the serving engine in one dataclass (vLLM's ``EngineArgs``).

``LLM``, ``LLMEngine`` and the server's command line read the same fields, so an option has one name,
one default and one check:

- ``LLM(model, config=EngineConfig(block_size=8))`` or, equivalently, ``LLM(model, block_size=8)``
  (keywords override the fields of ``config``);
- ``python -m mlsys_nb.inference.serve --block-size 8``: ``add_cli_arguments(parser)`` makes one flag
  per field (``--enable-prefix-caching`` / ``--no-enable-prefix-caching`` for booleans) and
  ``from_cli(namespace)`` reads them back.

Sizes are in tokens (``block_size``, ``max_num_batched_tokens``), blocks (``num_blocks``,
``swap_blocks``) or bytes (``kv_cache_memory``). Bad values raise a ``ValueError`` naming the field and
the allowed range when the config is built, before any model is loaded.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass

from ..config import check_choice, check_int

__all__ = ["ATTENTION_BACKENDS", "EngineConfig", "KV_CACHE_DTYPES", "PREEMPTION_MODES"]

PREEMPTION_MODES = ("recompute", "swap")
# "gather": each sequence's blocks gathered, then SDPA (paged.paged_attention); "tiled": block by block with
# the online softmax, nothing gathered (paged.paged_attention_tiled, PagedAttention's kernel idea); "varlen": all
# decodes in one call, their contexts packed without padding (paged.paged_decode_attention_varlen), chunks as "gather";
# "flex": FlexAttention reads the blocks in place through a block mask from the block tables, all decodes in one call
# (flex_paged.paged_attention_flex; its fused kernel with ``compile=True``, decodes only: chunks then gather)
ATTENTION_BACKENDS = ("gather", "tiled", "varlen", "flex")
KV_CACHE_DTYPES = ("auto", "fp32", "bf16", "fp16", "int8", "fp8")  # "auto": the model's parameter dtype;
# "int8"/"fp8" (e4m3): codes plus fp32 scales, K per channel per block (its K exact in an fp32 residual until the
# block is full) and V per token (``paged.quantize_kv``, KIVI's scheme)


@dataclass(frozen=True)
class EngineConfig:
    """The serving engine's options (module docstring); each field's comment gives its unit."""

    block_size: int = 16  # tokens per KV block
    num_blocks: int | None = None  # KV blocks in the pool; None: from kv_cache_memory
    kv_cache_memory: int = 256 * 2**20  # bytes of K/V when num_blocks is None
    kv_cache_dtype: str = "auto"  # dtype of the K/V pool: one of KV_CACHE_DTYPES (int8/fp8: quantized)
    attention_backend: str = "gather"  # paged attention: one of ATTENTION_BACKENDS
    max_num_seqs: int = 64  # sequences in one step
    max_num_batched_tokens: int = 512  # new tokens in one step (the token budget)
    enable_chunked_prefill: bool = True  # split long prompts across steps
    enable_prefix_caching: bool = True  # share computed blocks of equal prefixes
    continuous_batching: bool = True  # False: static batching (a new batch when the last one is done)
    preemption_mode: str = "recompute"  # "recompute" or "swap" when blocks run out
    swap_blocks: int | None = None  # CPU blocks for swap; None: as many as num_blocks
    seed: int = 0  # random weights of a preset model, and the sampler of unseeded requests
    step_times_window: int = 10_000  # steps kept in LLMEngine.step_times (bounded memory)
    max_grammar_states: int = 100_000  # refuse a grammar whose automaton is larger
    speculative_model: object = None  # a draft Transformer, a preset name, "ngram", or None
    num_speculative_tokens: int = 4  # draft tokens per step (k)
    async_scheduling: bool = False  # prepare step t+1 on a worker thread while step t's forward runs
    enforce_eager: bool = False  # True: never capture CUDA graphs (on CUDA the decode step is captured by default)
    compile: bool = False  # True: the model's forward compiled with torch.compile (inductor; compiled.py)

    def __post_init__(self):
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens", "step_times_window", "max_grammar_states"):
            check_int(name, getattr(self, name), 1)
        check_int("kv_cache_memory", self.kv_cache_memory, 1)
        if self.num_blocks is not None:
            check_int("num_blocks", self.num_blocks, 2)
        if self.swap_blocks is not None:
            check_int("swap_blocks", self.swap_blocks, 1)
        check_int("seed", self.seed, 0)
        check_int("num_speculative_tokens", self.num_speculative_tokens, 1)
        check_choice("preemption_mode", self.preemption_mode, PREEMPTION_MODES)
        check_choice("kv_cache_dtype", self.kv_cache_dtype, KV_CACHE_DTYPES)
        check_choice("attention_backend", self.attention_backend, ATTENTION_BACKENDS)
        for name in (
            "enable_chunked_prefill",
            "enable_prefix_caching",
            "continuous_batching",
            "async_scheduling",
            "enforce_eager",
            "compile",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.async_scheduling and self.speculative_model is not None:
            raise ValueError(
                f"async_scheduling=True needs speculative_model=None (got {self.speculative_model!r}): a step's "
                "drafts depend on the tokens the step before sampled"
            )

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def build(cls, config: EngineConfig | None = None, **overrides) -> EngineConfig:
        """``config`` (default: the defaults) with ``overrides`` applied; an unknown name is refused
        with the list of valid ones."""
        unknown = sorted(set(overrides) - set(cls.fields()))
        if unknown:
            raise TypeError(f"unknown engine option(s) {unknown}: valid ones are {list(cls.fields())}")
        if config is not None and not isinstance(config, cls):
            raise TypeError(f"config must be an EngineConfig, got {type(config).__name__}")
        return dataclasses.replace(config or cls(), **overrides)

    # ---- the command line ------------------------------------------------------------------------
    @classmethod
    def add_cli_arguments(cls, parser: argparse.ArgumentParser, *, skip=("speculative_model",)) -> None:
        """One ``--flag`` per field (``--block-size``; booleans as ``--x`` / ``--no-x``), default the field's."""
        for f in dataclasses.fields(cls):
            if f.name in skip:
                continue
            flag = "--" + f.name.replace("_", "-")
            if f.type in ("bool", bool):
                parser.add_argument(flag, action=argparse.BooleanOptionalAction, default=f.default)
            elif f.name == "preemption_mode":
                parser.add_argument(flag, choices=PREEMPTION_MODES, default=f.default)
            elif f.name == "kv_cache_dtype":
                parser.add_argument(flag, choices=KV_CACHE_DTYPES, default=f.default)
            elif f.name == "attention_backend":
                parser.add_argument(flag, choices=ATTENTION_BACKENDS, default=f.default)
            else:
                parser.add_argument(flag, type=int, default=f.default, help=f"(default {f.default})")

    @classmethod
    def from_cli(cls, args: argparse.Namespace) -> EngineConfig:
        """The config the flags of ``add_cli_arguments`` describe (other attributes of ``args`` are ignored)."""
        return cls.build(**{n: getattr(args, n) for n in cls.fields() if hasattr(args, n)})
