"""RLHF on a tiny model (mlsys_nb.rl.rlhf): the losses against hand formulas, the KL estimators against exact
KL, rollouts against teacher forcing, bad input. The whole flow (SFT, reward model with held-out accuracy > 90 %,
PPO raising the true reward by > 1.5 with KL < 8 nats, and the same PPO without the KL penalty hacking the
reward model) is checked by notebook 18 itself, at seed 0 under nbval and at seed 1 in tests/test_nb_18.py."""

import math

import pytest
import torch

from mlsys_nb.rl import rlhf as R


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
