"""Notebook 18 under papermill with another seed and the worked solutions switched on."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_18_runs_with_solutions_and_another_seed():
    nb = run_notebook("18_rlhf.ipynb", seed=1, solutions=True)
    text = printed_text(nb)
    for check in (
        "the SFT policy writes",
        "held-out accuracy",
        "PPO raised the true reward",
        "without KL the RM score is higher",
        "GRPO raised the true reward",
        "DPO raised the true reward",
        "all three methods beat the SFT policy",
        "7B on one GPU holds",
    ):
        assert f"check passed: {check}" in text, check
    assert_exercises_passed(text, 2)


def _encode_batch_by_rows(prompts, responses, eos=True):
    """The reference: an EOS-filled tensor and a zero mask, written row by row."""
    import torch

    from mlsys_nb.rl import rlhf as R

    ids = [list(r.encode()) + ([R.EOS] if eos else []) for r in responses]
    t = max(len(x) for x in ids)
    tokens = torch.full((len(ids), R.PROMPT_LEN + t), R.EOS, dtype=torch.long)
    mask = torch.zeros(len(ids), t, dtype=torch.bool)
    for i, (p, x) in enumerate(zip(prompts, ids)):
        tokens[i, : R.PROMPT_LEN] = torch.tensor(list(p.encode()))
        tokens[i, R.PROMPT_LEN : R.PROMPT_LEN + len(x)] = torch.tensor(x, dtype=torch.long)
        mask[i, : len(x)] = True
    return tokens, mask


def test_encode_batch_equals_the_row_by_row_reference():
    import random

    import pytest
    import torch

    from mlsys_nb.rl import rlhf as R

    rng = random.Random(0)
    for n in (1, 2, 7, 64):
        prompts = [rng.choice(R.PROMPTS) for _ in range(n)]
        responses = ["".join(rng.choice("ab") for _ in range(rng.randint(0, 16))) for _ in range(n)]
        for eos in (True, False):
            if not eos and not any(responses):
                continue  # no token at all: nothing to pad to
            got, want = R.encode_batch(prompts, responses, eos=eos), _encode_batch_by_rows(prompts, responses, eos)
            for a, b in zip(got, want):
                assert a.dtype == b.dtype and torch.equal(a, b), (n, eos)
    with pytest.raises(ValueError, match="prompt 'Q10:' is not 3 bytes"):
        R.encode_batch(["Q10:"], ["ab"])
