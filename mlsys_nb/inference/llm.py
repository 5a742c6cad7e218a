"""``LLM``: offline batch generation in vLLM's style, a thin front over ``LLMEngine`` (nano-vllm's ``llm.py``).

``LLM(model, config=EngineConfig(...), **options).generate(prompts, SamplingParams(...))`` queues every
prompt in the engine and steps it until all are done; with ``speculative_model`` it runs speculative
decoding (``speculative.py``) request by request instead.
"""

from __future__ import annotations

import itertools

from .config import EngineConfig
from .engine import LLMEngine, resolve_model
from .sampling_params import ParamError, SamplingParams
from .sequence import CompletionOutput, RequestOutput
from .tokenizer import decode_stream

__all__ = ["LLM"]


class LLM:
    """Offline generation in vLLM's style: ``LLM(model).generate(prompts, SamplingParams(...))``.

    ``speculative_model`` (a ``Transformer``, a preset name or ``"ngram"``) with
    ``num_speculative_tokens`` = k switches ``generate`` to speculative decoding (``speculative.py``):
    each request runs ALONE (batch 1, contiguous caches: where decode is memory-bound and drafting
    pays), not in the paged continuous-batching scheduler; temperature, top_k, top_p, max_tokens,
    seed, n, EOS, stop strings, stop token ids, logprobs (the target's raw ones) and
    json_schema/regex/choice are honoured (drafted tokens are masked by the grammar too).
    ``spec_stats``: one ``SpecStats`` per sample (α, tokens per forward)."""

    def __init__(self, model, *, tokenizer=None, config: EngineConfig | None = None, **options):
        """``config``: an ``EngineConfig``; ``options``: its fields by name (``block_size=8``), overriding it."""
        c = EngineConfig.build(config, **options)
        self.engine = LLMEngine(model, tokenizer, c)
        self.config = c
        self._next = itertools.count()
        self.seed, self.spec_stats = c.seed, []
        self.speculative_model, self.num_speculative_tokens = None, c.num_speculative_tokens
        if c.speculative_model is not None:
            draft = "ngram" if c.speculative_model == "ngram" else resolve_model(c.speculative_model, c.seed + 1).eval()
            if draft != "ngram" and draft.cfg.vocab_size != self.engine.model.cfg.vocab_size:
                raise ValueError(
                    f"speculative_model vocab_size={draft.cfg.vocab_size} differs from the target's "
                    f"{self.engine.model.cfg.vocab_size}"
                )
            self.speculative_model = draft

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
        if self.speculative_model is not None:
            return self._generate_speculative(prompts, params)
        ids = []
        for prompt, p in zip(prompts, params):
            ids.append(str(next(self._next)))
            self.engine.add_request(ids[-1], prompt, p)
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
        return [done[i] for i in ids]

    def _generate_speculative(self, prompts, params) -> list[RequestOutput]:
        """Each request decoded on its own (batch 1, where decode is memory-bound and drafting pays),
        ``n`` samples with seeds ``seed + i``; temperature/top_k/top_p shape target and draft alike,
        stop strings and stop token ids end a sample, logprobs are the target's raw ones."""
        from .sampler import logprob_entry
        from .speculative import speculative_generate

        eng, outs = self.engine, []
        checked = []
        for prompt, p in zip(prompts, params):  # every request is validated before any runs
            pr = eng.prepare(prompt, p)
            p = pr.params
            if p.processes_logits or p.min_p:
                raise ParamError(
                    "sampling_params",
                    "speculative decoding honours temperature, top_k, top_p, stop, logprobs, seed, n and "
                    "structured outputs; min_p, min_tokens, logit_bias and the penalties need the engine's path",
                )
            # the draft's k tokens and the bonus one need room in the contiguous caches too
            budget = min(pr.budget, eng.model.cfg.seq_len - len(pr.ids) - self.num_speculative_tokens - 1)
            shortest = 1 if pr.grammar is None else max(1, pr.grammar.min_tokens)
            if budget < shortest:
                raise ParamError(
                    "prompt",
                    f"prompt of {len(pr.ids)} tokens leaves {budget} tokens of context for speculative decoding "
                    f"(num_speculative_tokens={self.num_speculative_tokens} + 1 are reserved); needs {shortest}",
                )
            checked.append((prompt, p, pr.ids, pr.grammar, budget))
        for prompt, p, ids, grammar, budget in checked:
            completions = []
            for i in range(p.n):
                hit = {"text": ""}
                detok = decode_stream(eng.tokenizer) if (p.stop and eng.tokenizer is not None) else None

                def stop(toks, p=p, hit=hit, detok=detok):  # the engine's rules (SamplingParams.finish)
                    tok = toks[-1]
                    if detok is not None and (p.ignore_eos or tok not in eng.eos_token_ids):
                        hit["text"] += detok.step(tok)
                    end = p.finish(tok, len(toks), hit["text"], eos_token_ids=eng.eos_token_ids)
                    if end is None or end[0] != "stop":  # "length" is the budget's, below
                        return False
                    hit["reason"], hit["cut"] = end[1], end[2]
                    return True

                toks, stats = speculative_generate(
                    eng.model,
                    ids,
                    draft=self.speculative_model,
                    k=self.num_speculative_tokens,
                    max_new_tokens=budget,  # stops at the context's end, as the engine does
                    temperature=p.temperature,
                    top_k=p.top_k,
                    top_p=p.top_p,
                    seed=((self.seed if p.seed is None else p.seed) + i) % 2**64,
                    allowed=None if grammar is None else grammar.walker(budget),
                    stop=stop,
                    keep_logprobs=p.logprobs is not None,
                )
                self.spec_stats.append(stats)
                ended = "reason" in hit
                at_eos = ended and hit["reason"] is None  # an end-of-sequence id: not part of the text
                text_ids = toks[:-1] if at_eos else toks
                text = eng.decode(text_ids) if eng.tokenizer is not None else ""
                if hit.get("cut") is not None:  # cut where the engine cuts: in its incremental text
                    text = hit["text"][: hit["cut"]]
                lps = None
                if p.logprobs is not None:
                    lps = [logprob_entry(row, t, p.logprobs, eng.tokenizer) for row, t in zip(stats.logprobs, toks)]
                cum = sum(lp[t].logprob for lp, t in zip(lps, toks)) if lps is not None else None
                completions.append(
                    CompletionOutput(i, text, list(toks), cum, lps, "stop" if ended else "length", hit.get("reason"))
                )
            outs.append(
                RequestOutput(
                    str(next(self._next)), prompt if isinstance(prompt, str) else None, ids, completions, True
                )
            )
        return outs


# ---- resolving models and tokenizers -----------------------------------------------------------
