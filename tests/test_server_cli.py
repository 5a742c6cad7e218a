"""The server's command line: ``--speculative-model`` / ``--num-speculative-tokens`` (every value refused with
the flag's name and the allowed values), and ``--model-dir`` (a transformers checkpoint served through the real
CLI, as ``benchmarks/_peers.py`` starts it). The speculative server itself: tests/test_server.py."""

import os
import sys

import httpx
import pytest
import torch

from mlsys_nb.config import model_presets
from mlsys_nb.inference.config import EngineConfig
from mlsys_nb.inference.serve import build_parser, run_server

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))


def _exit_message(argv, capsys) -> str:
    with pytest.raises(SystemExit) as e:
        run_server(argv)
    assert e.value.code == 2  # argparse's usage error, before any model is built
    return capsys.readouterr().err


def test_speculative_flags_reach_the_engine_config():
    for value in ("ngram", "tiny"):
        args = build_parser().parse_args(["--speculative-model", value, "--num-speculative-tokens", "3"])
        assert EngineConfig.from_cli(args) == EngineConfig(speculative_model=value, num_speculative_tokens=3)
    assert EngineConfig.from_cli(build_parser().parse_args([])).speculative_model is None


def test_bad_speculative_values_name_the_flag_and_the_allowed_values(capsys):
    err = _exit_message(["--speculative-model", "gpt-5"], capsys)
    assert "--speculative-model" in err and "'gpt-5'" in err
    assert "ngram" in err and all(name in err for name in model_presets())
    # a preset whose vocabulary differs from the target's: the allowed ones are those that share it
    err = _exit_message(["--model", "tiny", "--speculative-model", "small"], capsys)
    assert "--speculative-model small" in err and "vocab_size 512" in err and "['tiny', 'ngram']" in err
    err = _exit_message(["--speculative-model", "ngram", "--num-speculative-tokens", "0"], capsys)
    assert "num_speculative_tokens" in err and ">= 1" in err


def test_bad_model_dir_names_the_flag(tmp_path, capsys):
    err = _exit_message(["--model-dir", str(tmp_path / "missing")], capsys)
    assert "--model-dir" in err and "missing" in err and "config.json" in err
    (tmp_path / "config.json").write_text("{not json")
    err = _exit_message(["--model-dir", str(tmp_path)], capsys)
    assert "--model-dir" in err and "could not load" in err
    err = _exit_message(["--model", "small", "--model-dir", str(tmp_path)], capsys)
    assert "--model-dir" in err and "--model" in err  # one source of weights


def test_model_dir_server_through_the_cli_answers_what_the_offline_engine_computes(tmp_path):
    """``_peers.kit_server_cmd`` (the benchmark's own command) over a saved checkpoint with a word tokenizer: the
    served greedy completions equal ``LLM`` on the in-memory model, text in, text out."""
    from _peers import ServerProcess, as_text, kit_server_cmd, save_model_dir

    from mlsys_nb.inference import LLM, SamplingParams
    from mlsys_nb.models import Transformer, to_hf
    from mlsys_nb.runtime.ports import free_port

    torch.manual_seed(3)
    model = Transformer(model_presets()["tiny"]).eval()
    d = save_model_dir(to_hf(model), str(tmp_path / "ckpt"))
    prompts = [[5, 17, 3], [100, 2, 2, 2, 9, 40], [7]]
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = kit_server_cmd(d, max_num_seqs=4) + [str(port)]
    with ServerProcess(cmd, url, str(tmp_path / "kit.log"), start_timeout=120):
        assert httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"] == d
        served = []
        for p in prompts:
            r = httpx.post(
                url + "/v1/completions",
                json={"model": d, "prompt": as_text(p), "max_tokens": 6, "temperature": 0, "ignore_eos": True},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            served.append(r.json()["choices"][0]["text"].split())
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the server runs
    try:
        outs = LLM(model).generate(
            prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False
        )
    finally:
        torch.set_num_threads(threads)
    assert served == [[f"t{t}" for t in o.outputs[0].token_ids] for o in outs]
