"""The server's command line: ``python -m mlsys_nb.inference.serve --model tiny --port 8000`` (a preset with
random weights) or ``--model-dir PATH`` (a transformers checkpoint directory); every ``EngineConfig`` option is a
flag (``--speculative-model ngram --num-speculative-tokens 4``, ...). Binds 127.0.0.1 unless ``--host`` says
otherwise. A bad value exits with argparse's usage error naming the flag, before any model is built.
"""

from __future__ import annotations

import argparse
import os

from ..config import EngineConfig
from .protocol import Limits
from .routes import build_app

SPEC_NGRAM = "ngram"  # --speculative-model: draft by n-gram lookup in the sequence itself (no draft model)


def speculative_choices() -> list[str]:
    """The values ``--speculative-model`` accepts: the presets of data/models.yaml and ``"ngram"``."""
    from ...config import model_presets

    return [*model_presets(), SPEC_NGRAM]


def build_parser() -> argparse.ArgumentParser:
    """The command line: the server's own flags, then one flag per ``EngineConfig`` field (``--block-size``,
    ``--no-enable-prefix-caching``, ``--preemption-mode swap``, ``--kv-cache-dtype bf16``,
    ``--speculative-model ngram --num-speculative-tokens 3``, ...)."""
    ap = argparse.ArgumentParser(description="OpenAI-compatible server over the mlsys_nb engine")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default="tiny", help="a preset name from data/models.yaml (random weights)")
    src.add_argument(
        "--model-dir",
        default=None,
        metavar="PATH",
        help="a transformers checkpoint directory (save_pretrained: config.json and weights; its tokenizer if saved "
        "there), converted with models.from_hf",
    )
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model or PATH)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-waiting-requests", type=int, default=Limits.max_waiting_requests)
    ap.add_argument("--max-n", type=int, default=Limits.max_n)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids oversubscription on small CPUs)")
    ap.add_argument("--log-level", default="warning")
    engine_flags = ap.add_argument_group("engine (EngineConfig; --seed also seeds the random weights)")
    EngineConfig.add_cli_arguments(engine_flags, skip=("speculative_model",))
    engine_flags.add_argument(
        "--speculative-model",
        default=None,
        choices=speculative_choices(),
        metavar="PRESET|ngram",
        help="speculative decoding inside the batch: a draft preset from data/models.yaml (random weights, seed + 1; "
        "its vocabulary must be the target's) or ngram (prompt lookup); --num-speculative-tokens drafts per step",
    )
    return ap


def load_model_dir(path: str):
    """(a transformers causal LM, its tokenizer directory or None) from a ``save_pretrained`` directory;
    ``ValueError`` naming ``--model-dir`` when ``path`` holds none."""
    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"--model-dir {path!r}: not a transformers checkpoint directory (expected a directory with config.json "
            "and the weights, as save_pretrained writes)"
        )
    from transformers import AutoModelForCausalLM

    try:
        hf = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model-dir {path!r}: transformers could not load a causal LM from it ({e})") from e
    has_tok = any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    return hf.eval(), (path if has_tok else None)


def check_draft_vocab(ap: argparse.ArgumentParser, args) -> None:
    """A draft preset must share ``--model``'s vocabulary (a model dir's is checked on load): else a usage error
    listing the drafts allowed here."""
    from ...config import load_model_preset

    draft = args.speculative_model
    if draft in (None, SPEC_NGRAM) or args.model is None:
        return
    want, got = load_model_preset(args.model).vocab_size, load_model_preset(draft).vocab_size
    if want != got:
        same = [n for n in speculative_choices() if n == SPEC_NGRAM or load_model_preset(n).vocab_size == want]
        ap.error(
            f"--speculative-model {draft}: its vocab_size {got} differs from --model {args.model}'s {want}; "
            f"allowed here: {same}"
        )


def build_engine(ap: argparse.ArgumentParser, args, config: EngineConfig):
    """The ``LLMEngine`` of ``--model-dir`` or ``--model``; a ``ValueError`` becomes a usage error."""
    from ..engine import LLMEngine

    try:
        if args.model_dir is not None:
            hf, tokenizer = load_model_dir(args.model_dir)
            return LLMEngine(hf, tokenizer=tokenizer, config=config)
        return LLMEngine(args.model, config=config)
    except ValueError as e:
        ap.error(str(e))


def run_server(argv=None) -> None:
    """Parse ``argv``, build the engine, serve it with uvicorn until interrupted."""
    ap = build_parser()
    args = ap.parse_args(argv)
    if args.model_dir is not None:
        args.model = None  # the checkpoint, not the default preset
    try:
        config = EngineConfig.from_cli(args)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    check_draft_vocab(ap, args)
    import torch
    import uvicorn

    torch.set_num_threads(args.threads)
    engine = build_engine(ap, args, config)
    name = args.served_model_name or args.model or args.model_dir
    limits = Limits(max_n=args.max_n, max_waiting_requests=args.max_waiting_requests)
    app = build_app(engine, name, limits)
    print(f"serving {name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
