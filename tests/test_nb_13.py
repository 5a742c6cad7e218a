"""Notebook 13 under papermill with non-default parameters (the defaults run under nbval): another
model and GPU, another context, the worked solutions on."""

import pytest
import torch
from nbrun import passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_inference_anatomy_notebook_other_model_with_solutions():
    nb = run_notebook(
        "13_inference_anatomy.ipynb",
        preset_name="llama-2-7b",
        gpu_name="A100-80GB-SXM",
        context=4096,
        batch_sizes=[1, 8],
        solutions=True,
        seed=1,
    )
    text = printed_text(nb)
    labels = passed_labels(nb)
    for check in (
        "cached generation = uncached generation",
        "cached logits equal the full recompute",
        "the per-token formula reproduces every published figure",
        "decode at batch 1 is memory-bound",
        "measured decode throughput grows with batch",
        "exercise 1 matches kv_bytes_per_token",
        "exercise 2 matches the roofline's decode time",
    ):
        assert any(label.startswith(check) for label in labels), (check, labels)
    assert "not attempted" not in text, "with solutions=True the checks run on the worked solutions"


# ----------------------------------------------------------------------------- section 5's checks, broken
# The notebook asserts, on interleaved measurements (``measure_throughput``): decode tokens/s at the largest
# batch >= 1.5x batch 1's (the step cost is shared by the batch) and prefill tokens/s at batch 1 >= 2x decode's
# (prefill runs the prompt's tokens in one forward). Two runners that break those ideas must fail them.
MIN_GAIN, MIN_PREFILL_OVER_DECODE = 1.5, 2.0  # the notebook's bounds


class _PerSequence(torch.nn.Module):
    """The batching idea broken: every sequence of the batch runs its own step (a batch-1 cache each)."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.cfg, self._last = model, model.cfg, (None, [])

    def forward(self, x, cache=None):
        from mlsys_nb.inference import KVCache

        if self._last[0] is not cache:  # a new request batch: one batch-1 cache per sequence
            self._last = (cache, [KVCache(self.inner, 1, cache.max_len) for _ in range(x.shape[0])])
        rows = self._last[1]
        return torch.cat([self.inner(x[i : i + 1], cache=rows[i]) for i in range(x.shape[0])])


class _TokenByTokenPrefill(torch.nn.Module):
    """The prefill idea broken: the prompt goes through the model one token at a time, like decode."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.cfg = model, model.cfg

    def forward(self, x, cache=None):
        return torch.cat([self.inner(x[:, t : t + 1], cache=cache) for t in range(x.shape[1])], dim=1)


def _ratios(model, batch_sizes=(1, 8)):
    from mlsys_nb.inference.measure import measure_throughput

    rows = measure_throughput(model, batch_sizes, prompt_len=32, decode_steps=6, reps=3, progress=False)
    gain = rows[-1]["decode_tokens_per_s"] / rows[0]["decode_tokens_per_s"]
    return gain, rows[0]["prefill_tokens_per_s"] / rows[0]["decode_tokens_per_s"]


@pytest.fixture(scope="module")
def small_model():
    from mlsys_nb.config import load_model_preset
    from mlsys_nb.models import Transformer

    torch.manual_seed(0)
    torch.set_num_threads(1)
    return Transformer(load_model_preset("small")).eval()


@pytest.mark.slow
def test_section5_checks_pass_the_real_model_and_fail_broken_runners(small_model):
    gain, prefill_over_decode = _ratios(small_model)
    assert gain >= MIN_GAIN and prefill_over_decode >= MIN_PREFILL_OVER_DECODE, (gain, prefill_over_decode)
    broken_gain, _ = _ratios(_PerSequence(small_model))
    assert broken_gain < MIN_GAIN, f"a runner without a shared step cost passes the batching check: x{broken_gain:.2f}"
    _, broken_prefill = _ratios(_TokenByTokenPrefill(small_model), batch_sizes=(1,))
    assert broken_prefill < MIN_PREFILL_OVER_DECODE, (
        f"a token-by-token prefill passes the prefill check: x{broken_prefill:.2f}"
    )


def test_per_sequence_runner_computes_the_same_logits(small_model):
    # the broken runner is slow for the right reason only: it computes what the model computes
    from mlsys_nb.inference import KVCache

    x = torch.randint(0, small_model.cfg.vocab_size, (3, 10), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = small_model(x, cache=KVCache(small_model, 3, 16))
        got = _PerSequence(small_model)(x, cache=KVCache(small_model, 3, 16))
        by_token = _TokenByTokenPrefill(small_model)(x, cache=KVCache(small_model, 3, 16))
    assert torch.allclose(got, want, atol=1e-5) and torch.allclose(by_token, want, atol=1e-4)
