"""Notebook 18 under papermill with another seed and the worked solutions switched on."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_18_runs_with_solutions_and_another_seed():
    # iterations=12 (the default run's 24 check the longer runs): PPO, PPO without KL and GRPO on another seed,
    # with the SFT policy and reward model at the defaults' 150 steps (notebook 19's variant starts from them) and
    # DPO's 100 steps (at 50 its KL reached the check's bound of 8 on seed 1). Run under other CPU kernels than this
    # machine's (other_capability: "default" on a vector CPU), so a check tuned to one CPU's rounding fails here too.
    # The checks read the mean of the last quarter's evaluations (iterations 10-12); under "default" at seed 1
    # (measured 2026-11-29) the least room was PPO's rise, 2.97 against 1.5 (GRPO +2.64 and DPO +2.69 against 1)
    nb = run_notebook("18_rlhf.ipynb", capability=other_capability(), seed=1, solutions=True, iterations=12)
    labels = passed_labels(nb)
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
        assert any(label.startswith(check) for label in labels), (check, labels)
    assert_exercises_passed(nb, 2)


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


def _notebook_18_start(seed, steps, cache_dir):
    """Notebook 18's sections 1 and 2 as its cells run them (SFT, then the reward model trained from the SFT
    policy, kept before ``normalize``), at a few steps."""
    import torch

    from mlsys_nb.rl import rlhf as R

    torch.manual_seed(seed)
    policy = R.new_policy(seed=seed)
    demos = R.make_demos(2000, seed)
    R.sft(policy, demos, steps=steps, batch=32, seed=seed)
    train_pairs = R.make_preferences(2400, seed + 1)[:2000]
    rm, _ = R.train_reward_model(train_pairs, init=policy, steps=steps, batch=32, seed=seed)
    R.save_start(policy, rm, seed=seed, steps=steps, demos=demos, train_pairs=train_pairs, cache_dir=cache_dir)
    return policy, rm, demos, train_pairs


def _state_equal(a, b):
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_rlhf_init_starts_from_notebook_18s_kept_models(tmp_path, monkeypatch, one_torch_thread):
    """Notebook 18 keeps its SFT policy and reward model (``save_start``); ``placement.rlhf_init`` with the same
    seed and steps loads them instead of training (sft is never called), and they are bit-equal to what
    rlhf_init trains from scratch (``cache=False``): the notebook and rlhf_init train the same models."""
    from mlsys_nb.rl import placement as pl
    from mlsys_nb.rl import rlhf as R

    fresh = pl.rlhf_init(seed=2, steps=3, cache=False)
    policy, rm, _, _ = _notebook_18_start(2, 3, tmp_path)
    assert _state_equal(fresh["policy"], policy.state_dict()) and _state_equal(fresh["reward"], rm.state_dict())

    def no_training(*a, **k):
        raise AssertionError("rlhf_init trained although notebook 18's models were kept")

    monkeypatch.setattr(R, "sft", no_training)
    kept = pl.rlhf_init(seed=2, steps=3, cache_dir=tmp_path)
    assert _state_equal(kept["policy"], fresh["policy"]) and _state_equal(kept["reward"], fresh["reward"])


def test_a_kept_start_of_other_inputs_or_sources_is_not_loaded(tmp_path, monkeypatch, one_torch_thread):
    """Every input is in the key: a start kept for other steps, seed, data, thread count or training source is
    not loaded (load_start gives None, rlhf_init trains); a corrupt file is not either, and the broken idea, a
    key that leaves the data out, would hand out models trained on other data."""
    import torch

    from mlsys_nb.rl import placement as pl
    from mlsys_nb.rl import rlhf as R

    _, _, demos, pairs = _notebook_18_start(3, 2, tmp_path)
    same = dict(seed=3, steps=2, demos=demos, train_pairs=pairs, cache_dir=tmp_path)
    assert R.load_start(**same) is not None
    for other in (
        dict(same, steps=3),
        dict(same, seed=4),
        dict(same, demos=R.make_demos(2000, 4)),
        dict(same, train_pairs=pairs[:-1]),
    ):
        assert R.load_start(**other) is None, {k: v for k, v in other.items() if k not in ("demos", "train_pairs")}
    torch.set_num_threads(2)
    try:
        assert R.load_start(**same) is None, "a start trained on another thread count"
    finally:
        torch.set_num_threads(1)
    monkeypatch.setattr(R, "START_SOURCES", R.START_SOURCES + ("rl/gae.py",))
    assert R.load_start(**same) is None, "a start trained by other source code"
    monkeypatch.undo()
    path = tmp_path / f"{R.start_key(seed=3, steps=2, demos=demos, train_pairs=pairs)}.pt"
    path.write_bytes(b"half a file")
    assert R.load_start(**same) is None, "a corrupt file"
    pl.rlhf_init(seed=3, steps=2, cache_dir=tmp_path)  # nothing readable kept: trains, and keeps what it trained
    assert R.load_start(**same) is not None, "rlhf_init keeps what it trained"
    # only the START_KEEP newest starts stay on disk
    policy, rm = R.new_policy(seed=3), R.ScalarModel(R.new_policy(seed=3))
    newest = [
        R.save_start(policy, rm, seed=3, steps=k, demos=demos, train_pairs=pairs, cache_dir=tmp_path) for k in range(10)
    ]
    assert len(list(tmp_path.glob("*.pt"))) == R.START_KEEP and newest[-1].exists()
    # the broken idea: a key without the data loads the start of seed 3's demonstrations for seed 4's
    monkeypatch.setattr(R, "start_key", lambda *, seed, steps, demos, train_pairs, batch=32: f"{seed}-{steps}")
    _notebook_18_start(3, 2, tmp_path)
    assert R.load_start(**dict(same, demos=R.make_demos(2000, 4))) is not None


def test_dpo_reads_the_reference_log_probs_of_its_own_pairs(monkeypatch, one_torch_thread):
    """DPO computes the frozen reference's log-probabilities of every pair once (``reference_pair_logprobs``) and
    looks each step's up by the indices of the pairs it drew: at the first step the policy is the reference, so
    every log-ratio log pi - log pi_ref is 0 (to float rounding). The broken idea, the rows of other pairs (here
    shifted by one), gives log-ratios of whole nats, and this check fails."""
    import torch

    from mlsys_nb.rl import rlhf as R

    policy, pairs = R.new_policy(seed=0), R.make_preferences(200, 1)
    rm = R.ScalarModel(R.new_policy(seed=0))
    real_loss, real_ref = R.dpo_loss, R.reference_pair_logprobs

    def first_log_ratios():
        seen = []

        def spy(pc, pr, rc, rr, beta):
            seen.append(float(torch.maximum((pc - rc).abs().max(), (pr - rr).abs().max()).detach()))
            return real_loss(pc, pr, rc, rr, beta)

        monkeypatch.setattr(R, "dpo_loss", spy)
        R.dpo(policy, pairs, rm, steps=1, batch=16, seed=0, progress=False)
        return seen[0]

    assert first_log_ratios() < 1e-4
    lp, tokens = real_ref(policy, pairs, 64)
    batches = [pairs[i : i + 64] for i in range(0, 200, 64)]
    assert lp.shape == (200, 2) and tokens == sum(
        R.encode_batch([p for p, _, _ in b], [resp[k] for resp in b])[0].numel() for b in batches for k in (1, 2)
    )

    def other_pairs(reference, p, batch):
        lp, n = real_ref(reference, p, batch)
        return lp.roll(1, 0), n

    monkeypatch.setattr(R, "reference_pair_logprobs", other_pairs)
    assert first_log_ratios() > 0.5, "the broken lookup should show"
