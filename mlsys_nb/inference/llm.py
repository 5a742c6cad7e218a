"""``LLM``: offline batch generation in vLLM's style, a thin front over ``LLMEngine`` (nano-vllm's ``llm.py``).

``LLM(model, config=EngineConfig(...), **options).generate(prompts, SamplingParams(...))`` queues every
prompt in the engine and steps it until all are done; with ``speculative_model`` the engine drafts and
verifies tokens for every running decode inside the same continuous batch (``spec_batch.BatchSpeculator``).
"""

from __future__ import annotations

import itertools

from .config import EngineConfig
from .engine import LLMEngine
from .sampling_params import SamplingParams
from .sequence import RequestOutput

__all__ = ["LLM"]


class LLM:
    """Offline generation in vLLM's style: ``LLM(model).generate(prompts, SamplingParams(...))``.

    ``speculative_model`` (a ``Transformer``, a preset name or ``"ngram"``) with
    ``num_speculative_tokens`` = k: the engine drafts up to k tokens for every running decode and
    verifies them in its one batched forward (``spec_batch.BatchSpeculator``); temperature, top_k,
    top_p, min_p, max_tokens, seed, n, EOS, stop strings, stop token ids, logprobs and
    json_schema/regex/choice are honoured (drafted tokens are masked by the grammar too); requests with
    penalties, logit_bias or min_tokens decode one token per step in the same batch.
    ``spec_stats``: one ``SpecStats`` per finished sample (α, tokens per target forward), in order."""

    def __init__(self, model, *, tokenizer=None, config: EngineConfig | None = None, **options):
        """``config``: an ``EngineConfig``; ``options``: its fields by name (``block_size=8``), overriding it."""
        c = EngineConfig.build(config, **options)
        self.engine = LLMEngine(model, tokenizer, c)
        self.config = c
        self._next = itertools.count()
        self.seed, self.spec_stats = c.seed, []
        self.speculative_model, self.num_speculative_tokens = None, c.num_speculative_tokens
        if self.engine.speculator is not None:
            sp = self.engine.speculator
            self.speculative_model = "ngram" if sp.ngram else sp.runner.model

    def get_tokenizer(self):
        return self.engine.tokenizer

    def load_weights(self, state_dict) -> None:
        self.engine.load_weights(state_dict)

    def generate(
        self, prompts, sampling_params: SamplingParams | list[SamplingParams] | None = None, use_tqdm: bool = True
    ) -> list[RequestOutput]:
        """One ``RequestOutput`` per prompt, in order.

        ``prompts``: a string, a list of token ids, or a list of those."""
        single = isinstance(prompts, str) or (
            isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], int)
        )
        prompts = [prompts] if single else list(prompts)
        params = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"sampling_params has {len(params)} entries for {len(prompts)} prompts")
        ids, seqs = [], []
        for prompt, p in zip(prompts, params):  # every request is validated before any is queued
            self.engine.prepare(prompt, p)
        for prompt, p in zip(prompts, params):
            ids.append(str(next(self._next)))
            self.engine.add_request(ids[-1], prompt, p)
            seqs += self.engine.requests[ids[-1]]
        done: dict[str, RequestOutput] = {}
        from tqdm.auto import tqdm

        with tqdm(total=len(ids), desc="generate", disable=not use_tqdm) as bar:
            while self.engine.has_unfinished_requests():
                for out in self.engine.step():
                    if out.error is not None:  # offline: a failed request is an exception, as before
                        for rid in ids:
                            self.engine.abort_request(rid)
                        raise RuntimeError(f"request {out.request_id} failed: {out.error}")
                    if out.finished:
                        done[out.request_id] = out
                        bar.update(1)
        self.spec_stats += [s.spec for s in seqs if getattr(s, "spec", None) is not None]
        return [done[i] for i in ids]
