"""RLHF on a tiny model (mlsys_nb.rl.rlhf): the losses against hand formulas, the KL estimators against exact
KL, rollouts against teacher forcing, bad input. The whole flow (SFT, reward model with held-out accuracy > 90 %,
PPO raising the true reward by > 1.5 with KL < 8 nats, and the same PPO without the KL penalty hacking the
reward model, each judged on the mean of the run's last quarter of evaluations: ``late_mean``) is checked by
notebook 18 itself, at seed 0 under nbval and at seed 1 under other CPU kernels in tests/test_nb_18.py; here,
that its rise and hacking checks fail when their idea is broken."""

import math

import pytest
import torch

from mlsys_nb.rl import rlhf as R

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tiny tensors: a second thread only waits


def test_true_reward_rule():
    assert R.true_reward("aab") == 2
    assert R.true_reward("a" * 8) == 8
    assert R.true_reward("a" * 12) == 12 - 2 * 4
    assert R.true_reward("") == 0


def test_preferences_are_labelled_by_the_hidden_reward_and_length_goes_with_the_label():
    pairs = R.make_preferences(500, seed=3)
    assert all(R.true_reward(c) > R.true_reward(r) for _, c, r in pairs)
    assert all(1 <= len(x) <= R.MAX_LEN for _, c, r in pairs for x in (c, r))
    longer = sum(len(c) > len(r) for _, c, r in pairs) / len(pairs)
    assert 0.65 < longer < 0.9, longer  # the spurious feature: correlated, not identical


def test_bradley_terry_loss_matches_hand_formula():
    c, r = torch.tensor([1.0, -0.5, 3.0]), torch.tensor([0.0, 0.5, 3.0])
    hand = sum(math.log(1 + math.exp(-(a - b))) for a, b in zip(c.tolist(), r.tolist())) / 3
    assert R.bradley_terry_loss(c, r).item() == pytest.approx(hand, rel=1e-6)
    assert R.bradley_terry_loss(torch.tensor([0.0]), torch.tensor([0.0])).item() == pytest.approx(math.log(2))


def test_dpo_loss_matches_hand_formula_and_its_gradient_raises_chosen_lowers_rejected():
    pc = torch.tensor([-3.0, -5.0], requires_grad=True)
    pr = torch.tensor([-4.0, -2.0], requires_grad=True)
    rc, rr, beta = torch.tensor([-3.5, -4.0]), torch.tensor([-3.0, -2.5]), 0.5
    z = [beta * ((a - b) - (c - d)) for a, b, c, d in zip(pc.tolist(), rc.tolist(), pr.tolist(), rr.tolist())]
    hand = sum(math.log(1 + math.exp(-x)) for x in z) / 2
    loss = R.dpo_loss(pc, pr, rc, rr, beta)
    assert loss.item() == pytest.approx(hand, rel=1e-6)
    loss.backward()
    assert (pc.grad < 0).all() and (pr.grad > 0).all()  # descent raises log pi(chosen), lowers log pi(rejected)
    # hand gradient: d/d pc = -beta * sigmoid(-z) / B
    want = torch.tensor([-beta / (1 + math.exp(x)) / 2 for x in z])
    torch.testing.assert_close(pc.grad, want)


def test_grpo_advantages_match_hand_computation():
    r = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 8.0]])
    a = R.grpo_advantages(r, eps=0.0)
    torch.testing.assert_close(a[0], torch.tensor([-1.0, 0.0, 1.0]))
    m, s = 6.0, math.sqrt(((5 - 6) ** 2 * 2 + (8 - 6) ** 2) / 2)  # Bessel: n - 1 = 2
    torch.testing.assert_close(a[1], torch.tensor([(5 - m) / s, (5 - m) / s, (8 - m) / s]))
    with pytest.raises(ValueError, match="group_size >= 2"):
        R.grpo_advantages(torch.ones(4, 1))


@pytest.mark.parametrize("kind", ["k1", "k3"])
def test_kl_estimators_are_unbiased_on_known_distributions(kind):
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.5, 0.3, 0.15, 0.05])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    exact = float((p * (p / q).log()).sum())
    x = torch.multinomial(p, 200_000, replacement=True, generator=g)
    est = R.kl_estimate(p.log()[x], q.log()[x], kind)
    assert est.mean().item() == pytest.approx(exact, rel=0.03)
    if kind == "k3":
        assert (est >= 0).all()
    # the estimate of KL(q || p) differs from KL(p || q): the direction matters
    assert abs(float((q * (q / p).log()).sum()) - exact) > 0.05
    with pytest.raises(ValueError, match="kind"):
        R.kl_estimate(p, q, "k2")


def test_rollout_logprobs_equal_teacher_forcing_and_mask_ends_at_eos():
    pol = R.new_policy(seed=0)
    ro = R.rollout(pol, list(R.PROMPTS) * 2, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    logp, _ = R.token_logprobs(pol, ro.tokens)
    torch.testing.assert_close(ro.logprobs[ro.mask], logp[ro.mask], atol=1e-4, rtol=1e-4)
    assert (ro.logprobs[~ro.mask] == 0).all()
    for row, m in zip(ro.tokens[:, R.PROMPT_LEN :], ro.mask):
        n = int(m.sum())
        assert (row[: n - 1] != R.EOS).all()  # no EOS inside a response; the last valid token may be EOS
        assert m[:n].all() and not m[n:].any()


def test_shaped_rewards_sum_to_score_minus_kl():
    g = torch.Generator().manual_seed(1)
    logp, ref = -torch.rand(3, 5, generator=g), -torch.rand(3, 5, generator=g)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    score = torch.tensor([1.0, -2.0, 0.5])
    r = R.shaped_rewards(score, logp, ref, mask, 0.2)
    want = score - 0.2 * ((logp - ref) * mask).sum(1)
    torch.testing.assert_close(r.sum(1), want)
    assert (r[~mask] == 0).all()


def test_bad_input_raises_clear_errors():
    with pytest.raises(ValueError, match="kl_coef"):
        R.RLConfig(kl_coef=-0.1).check()
    with pytest.raises(ValueError, match="group_size"):
        R.RLConfig(group_size=1).check()
    with pytest.raises(ValueError, match="clip"):
        R.RLConfig(clip=1.5).check()
    with pytest.raises(ValueError, match="beta"):
        R.dpo_loss(torch.zeros(1), torch.zeros(1), torch.zeros(1), torch.zeros(1), beta=0.0)
    with pytest.raises(ValueError, match="temperature"):
        R.rollout(R.new_policy(), ["Q1:"], temperature=0.0)
    with pytest.raises(ValueError, match="kl_coef"):
        R.ppo(None, None, kl_coef=-1.0)  # rejected before any model is touched
    with pytest.raises(ValueError, match="multiple of group_size"):
        R.grpo(None, None, batch=30, group_size=8)


def test_hidden_states_are_the_forward_without_the_head_and_scores_sum_over_response_tokens():
    pol = R.new_policy(seed=2)
    tokens, mask = R.encode_batch(["Q1:", "Q2:"], ["ab", "aaaa"])
    torch.testing.assert_close(pol.lm_head(R.hidden_states(pol, tokens)), pol(tokens))
    rm = R.ScalarModel(pol)
    torch.nn.init.normal_(rm.head.weight, generator=torch.Generator().manual_seed(0))
    v = rm.values(tokens)
    want = torch.stack([v[0, 3:6].sum(), v[1, 3:8].sum()])  # "ab" + EOS, "aaaa" + EOS
    torch.testing.assert_close(rm.score(tokens, mask), want)
    rm.normalize(pol, n=64, seed=5)
    ro = R.rollout(pol, [R.PROMPTS[i % 4] for i in range(64)], generator=torch.Generator().manual_seed(5))
    s = rm.score(ro.tokens, ro.mask).detach()
    assert abs(float(s.mean())) < 1e-4 and float(s.std()) == pytest.approx(1.0, rel=1e-4)


def test_late_mean_averages_the_last_quarter_and_the_runs_evaluate_there():
    """The checks of notebook 18 read ``late_mean``: the mean over the evaluations of the last quarter of a run,
    which ``ppo``/``grpo`` evaluate at every iteration (``dpo`` every 5 steps), besides every ``eval_every``."""
    import pandas as pd

    assert [R.late_start(n) for n in (1, 4, 12, 24, 60, 100)] == [1, 4, 10, 19, 46, 76]
    assert [i for i in range(1, 25) if R.evaluation_due(i, 24, 5, 0.25)] == [5, 10, 15, 19, 20, 21, 22, 23, 24]
    assert [i for i in range(1, 101) if R.evaluation_due(i, 100, 25, 0.25, 5)] == [25, 50, 75, 80, 85, 90, 95, 100]
    assert [i for i in range(1, 25) if R.evaluation_due(i, 24, 5, 0.0)] == [5, 10, 15, 20, 24]
    h = pd.DataFrame({"iteration": [0, 5, 10, 15, 19, 20, 24], "true_reward": [2, 9, 9, 9, 4, 5, 3], "sample": "ab"})
    late = R.late_mean(h)
    assert late.true_reward == 4 and "sample" not in late.index and late.iteration == 21
    with pytest.raises(ValueError, match="late_share"):
        R.RLConfig(late_share=1.5).check()


def _trained_start(seed):
    """Notebook 18's SFT policy and normalised reward model (kept on disk by rlhf_init: test_nb_18's start)."""
    from mlsys_nb.rl import placement as pl

    init = pl.rlhf_init(seed=seed, steps=150)
    policy = R.new_policy(seed=seed)
    policy.load_state_dict(init["policy"])
    rm = R.ScalarModel(R.new_policy(seed=seed))
    rm.load_state_dict(init["reward"])
    rm.eval().requires_grad_(False)
    return policy.eval(), rm.normalize(policy, seed=seed)


@pytest.fixture(scope="module")
def start(one_torch_thread):
    return _trained_start(1)


@pytest.mark.slow
def test_the_rise_check_fails_for_ppo_that_does_not_learn(start, monkeypatch):
    """Notebook 18's check, rise of the late mean of the true reward > 1.5, bites: PPO whose advantages point
    the wrong way (GAE's sign flipped: it learns to lower the reward) fails it, on every seed and CPU (the true
    reward falls), and so does a policy the updates never change (rise exactly 0: every evaluation draws the
    same samples from the same policy)."""
    from mlsys_nb.runtime import check_margin

    policy, rm = start

    real_gae = R.gae

    def flipped(*a, **k):
        adv, ret = real_gae(*a, **k)
        return -adv, ret

    monkeypatch.setattr(R, "gae", flipped)
    _, h = R.ppo(policy, rm, seed=1, iterations=12, progress=False)
    with pytest.raises(AssertionError, match="rise"):
        check_margin("PPO: rise of the true reward", R.late_mean(h).true_reward - h.iloc[0].true_reward, ">", 1.5)
    monkeypatch.undo()
    monkeypatch.setattr(R, "ppo_update", lambda *a, **k: 0.0)
    _, h = R.ppo(policy, rm, seed=1, iterations=4, progress=False)
    assert (h.true_reward == h.true_reward.iloc[0]).all()
    with pytest.raises(AssertionError, match="rise"):
        check_margin("PPO: rise of the true reward", R.late_mean(h).true_reward - h.iloc[0].true_reward, ">", 1.5)


@pytest.mark.slow
def test_the_hacking_check_fails_when_the_no_kl_run_keeps_its_kl(start):
    """Notebook 18's reward-hacking check (the no-KL run's late true reward 2 below the KL run's) fails when the
    "no-KL" run keeps beta = 0.3: two KL runs of other seeds land within 2 of each other."""
    from mlsys_nb.runtime import check_margin

    policy, rm = start
    _, h_kl = R.ppo(policy, rm, seed=1, kl_coef=0.3, iterations=12, progress=False)
    _, h_not0 = R.ppo(policy, rm, seed=2, kl_coef=0.3, iterations=12, progress=False)
    late, h0 = R.late_mean(h_kl), R.late_mean(h_not0)
    with pytest.raises(AssertionError, match="true reward below"):
        check_margin("no KL: true reward below the KL run's", late.true_reward - h0.true_reward, ">", 2)


def test_decoupled_ppo_on_policy_is_plain_ppo_and_off_policy_differs():
    """``RLConfig(decoupled=True)``: with rollouts whose log-probabilities are the trainer's own (on-policy) the
    proximal policy is the behaviour policy and the update is plain PPO's, bit for bit; with stale log-probs
    (one step old) it is another update."""
    import copy

    torch.manual_seed(0)
    actor = R.new_policy(seed=3)
    rm = R.ScalarModel(R.new_policy(seed=4)).eval().requires_grad_(False)
    ro = R.rollout(actor, list(R.PROMPTS) * 2, max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        own, _ = R.token_logprobs(actor, ro.tokens)
    on_policy = R.Rollouts(ro.tokens, ro.mask, own * ro.mask)
    lag = 0.3 * torch.rand(own.shape, generator=torch.Generator().manual_seed(2))
    stale = R.Rollouts(ro.tokens, ro.mask, (own - lag) * ro.mask)

    def update(rollouts, decoupled):
        a, c = copy.deepcopy(actor).train(), copy.deepcopy(rm).requires_grad_(True).train()
        opt = torch.optim.Adam(list(a.parameters()) + list(c.parameters()), lr=1e-3)
        cfg = R.RLConfig(batch=8, decoupled=decoupled)
        R.ppo_update(a, c, actor, rm, opt, rollouts, cfg, torch.Generator().manual_seed(1))
        return a.state_dict()

    plain, dec = update(on_policy, False), update(on_policy, True)
    assert all(torch.equal(plain[k], dec[k]) for k in plain)
    plain, dec = update(stale, False), update(stale, True)
    assert not all(torch.equal(plain[k], dec[k]) for k in plain)
