"""PPO and policy gradients: the loss against its formula, clipping, same-step autoreset and truncation
bootstrap on real gymnasium envs, evaluation seeding, bad input, REINFORCE variance. CartPole to 475 (seed 1,
then >= 475 on 100 fresh greedy episodes) is checked by notebook 17 in tests/test_nb_17.py (seed=1), and at
seed 0 under nbval."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from mlsys_nb.rl import evaluate_policy, pg, ppo

SHORT = "mlsys_nb_test/CartPoleShort-v0"  # CartPole cut at 8 steps: nearly every episode is truncated
if SHORT not in gym.registry:
    gym.register(SHORT, entry_point="gymnasium.envs.classic_control.cartpole:CartPoleEnv", max_episode_steps=8)


def model(seed=0):
    return ppo.ActorCritic(4, 2, 64, torch.Generator().manual_seed(seed))


def test_ppo_loss_matches_the_formula_on_random_inputs():
    g = torch.Generator().manual_seed(0)
    new, old, adv, v, ret, ent = (torch.randn(64, generator=g, dtype=torch.float64) for _ in range(6))
    new = old + 0.3 * new
    loss, parts = ppo.ppo_loss(new, old, adv, v, ret, ent, clip=0.2, vf_coef=0.5, ent_coef=0.01)
    a = adv.numpy()
    a = (a - a.mean()) / (a.std(ddof=1) + 1e-8)
    rho = np.exp(new.numpy() - old.numpy())
    pol = -np.mean(np.minimum(rho * a, np.clip(rho, 0.8, 1.2) * a))
    val = np.mean((v.numpy() - ret.numpy()) ** 2)
    np.testing.assert_allclose(float(loss), pol + 0.5 * val - 0.01 * ent.numpy().mean(), rtol=1e-10)
    np.testing.assert_allclose(float(parts["clip_fraction"]), np.mean(np.abs(rho - 1) > 0.2))


@pytest.mark.parametrize(
    "ratio, adv, moves",
    [(1.5, 1.0, False), (1.5, -1.0, True), (0.5, 1.0, True), (0.5, -1.0, False), (1.1, 1.0, True), (0.9, -1.0, True)],
)
def test_clipping_stops_the_gradient_only_where_it_should(ratio, adv, moves):
    """Outside [1 - eps, 1 + eps] in the direction the advantage pushes, the gradient is zero (eq. 7)."""
    new = torch.tensor([np.log(ratio)], requires_grad=True)
    loss, _ = ppo.ppo_loss(
        new,
        torch.zeros(1),
        torch.tensor([adv]),
        torch.zeros(1),
        torch.zeros(1),
        torch.zeros(1),
        clip=0.2,
        normalize=False,
    )
    loss.backward()
    assert (abs(float(new.grad)) > 1e-6) == moves
    unclipped = torch.tensor([np.log(ratio)], requires_grad=True)
    ppo.ppo_loss(
        unclipped,
        torch.zeros(1),
        torch.tensor([adv]),
        torch.zeros(1),
        torch.zeros(1),
        torch.zeros(1),
        clip=None,
        normalize=False,
    )[0].backward()
    assert abs(float(unclipped.grad)) > 1e-6  # without clipping it would always move


def replay_env0(actions, seed):
    """Env 0 of the vector env replayed alone (same seed, unseeded resets after): per step, the observation
    the agent acted on, whether the step ended the episode, and the final observation when truncated."""
    env = gym.make(SHORT)
    obs, _ = env.reset(seed=seed)
    seen, finals = [], {}
    for t, a in enumerate(actions):
        seen.append(obs)
        obs, _, term, trunc, _ = env.step(int(a))
        if trunc and not term:
            finals[t] = obs
        if term or trunc:
            obs, _ = env.reset()
    return np.array(seen), finals


def test_rollout_has_no_fake_transitions_and_bootstraps_truncation():
    m = model()
    envs = ppo.make_envs(SHORT, 3)
    try:
        batch = ppo.Rollout(envs, m, seed=11, gamma=0.9, generator=torch.Generator().manual_seed(0)).collect(30)
    finally:
        envs.close()
    seen, finals = replay_env0(batch["actions"][:, 0].numpy(), seed=11)
    np.testing.assert_allclose(batch["obs"][:, 0].numpy(), seen, rtol=1e-6)  # every stored step is a real one
    assert len(finals) >= 3 and batch["dones"][:, 0].sum() >= 3
    for t, final in finals.items():
        expected = 1.0 + 0.9 * float(m.value(torch.as_tensor(final)).detach())
        np.testing.assert_allclose(float(batch["rewards"][t, 0]), expected, rtol=1e-5)
    not_done = ~batch["dones"]
    assert torch.all(batch["rewards"][not_done] == 1.0)


def test_next_step_autoreset_would_store_fake_transitions():
    """The same check catches gymnasium's default (NEXT_STEP) mode: the step after an episode's end is a reset
    step whose action is ignored, so the stored observations no longer match a replay."""
    envs = ppo.make_envs(SHORT, 3, same_step=False)
    try:
        batch = ppo.Rollout(envs, model(), seed=11, gamma=0.9, generator=torch.Generator().manual_seed(0)).collect(30)
    finally:
        envs.close()
    seen, _ = replay_env0(batch["actions"][:, 0].numpy(), seed=11)
    assert not np.allclose(batch["obs"][:, 0].numpy(), seen)


def test_policy_is_greedy_and_accepts_one_or_many_observations():
    policy = ppo.Policy(model(3))
    obs = np.random.default_rng(0).normal(size=(50, 4)).astype(np.float32)
    batch = policy(obs)
    assert batch.shape == (50,) and batch.dtype == np.int64
    assert [policy(o) for o in obs[:5]] == list(batch[:5])
    assert np.array_equal(batch, policy(obs))
    logits = policy.model.pi(torch.as_tensor(obs))
    assert np.array_equal(batch, logits.argmax(-1).numpy())


def test_evaluate_seeds_episode_i_with_seed_plus_i():
    policy = ppo.Policy(model(1))  # untrained greedy policy: short episodes whose length depends on the seed
    together = evaluate_policy(policy, "CartPole-v1", 4, seed=20)
    alone = np.concatenate([evaluate_policy(policy, "CartPole-v1", 1, seed=20 + i) for i in range(4)])
    np.testing.assert_array_equal(together, alone)
    assert len(set(together)) > 1 and together.max() < 475


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="env_id 'CartPole-v9' is not a registered gymnasium environment"):
        ppo.train_ppo("CartPole-v9", progress=False)
    with pytest.raises(ValueError, match="env_id"):
        evaluate_policy(ppo.Policy(model()), "NoSuchEnv-v0", 3, 0)
    with pytest.raises(TypeError, match="only Discrete"):
        ppo.make_envs("Pendulum-v1", 2)
    with pytest.raises(ValueError, match="episodes must be an int >= 1"):
        evaluate_policy(ppo.Policy(model()), "CartPole-v1", 0, 0)
    with pytest.raises(ValueError, match="clip must be a finite number > 0 and < 1"):
        ppo.ppo_loss(*(torch.zeros(2),) * 6, clip=1.5)
    with pytest.raises(ValueError, match="clip must be a finite number > 0 and < 1"):
        ppo.PPOConfig(clip=0.0)
    with pytest.raises(ValueError, match="gamma must be a finite number >= 0 and <= 1"):
        ppo.PPOConfig(gamma=1.2)
    with pytest.raises(ValueError, match="lam must be a finite number >= 0 and <= 1"):
        ppo.PPOConfig(lam=-0.5)
    with pytest.raises(ValueError, match="batch_size must divide"):
        ppo.PPOConfig(batch_size=100)
    with pytest.raises(ValueError, match=r"total_steps \(or None\) must be an int >= 1"):
        ppo.train_ppo(total_steps=0, progress=False)


def test_baselines_reduce_measured_gradient_variance():
    """Same expectation, less variance: total return > return-to-go > return-to-go minus a baseline."""
    est = pg.gradient_variance(model(0), "CartPole-v1", episodes=60, seed=0)
    v = {k: e["variance"] for k, e in est.items()}
    assert v["total_return"] > 2 * v["reward_to_go"] > 2 * 1.2 * v["baseline"], v
    m1, m2 = est["reward_to_go"]["mean"], est["baseline"]["mean"]
    assert float(m1 @ m2 / (m1.norm() * m2.norm())) > 0.9  # an unbiased baseline keeps the direction


def test_a_short_run_improves_and_the_curve_has_its_columns():
    _, curve = ppo.train_ppo(seed=0, total_steps=6144, progress=False)
    assert list(curve.columns[:3]) == ["env_steps", "wall_s", "mean_return"]
    assert curve.env_steps.iloc[-1] == 6144 and curve.wall_s.is_monotonic_increasing
    assert curve.mean_return.iloc[-1] > 2 * curve.mean_return.dropna().iloc[0]
    assert curve.attrs["reached"] is None  # with total_steps there is no early stop


def test_an_early_stop_ends_on_a_full_progress_bar(monkeypatch):
    """Solved before the budget: the bar closes at n == total (a notebook bar stopped short turns red, like a
    failure). Threshold 1 passes at the first evaluation; the budget is far larger."""
    import io

    import tqdm.auto
    import tqdm.std

    closed = []

    class Recorded(tqdm.std.tqdm):
        def __init__(self, *a, **k):
            super().__init__(*a, **{**k, "disable": False, "file": io.StringIO()})

        def close(self):
            closed.append((self.n, self.total))
            super().close()

    monkeypatch.setattr(tqdm.auto, "tqdm", Recorded)
    _, curve = ppo.train_ppo(seed=0, threshold=1, max_steps=100_000, progress=True)
    assert curve.attrs["reached"] is not None and curve.attrs["reached"] < 100_000
    assert closed and closed[-1] == (curve.attrs["reached"], curve.attrs["reached"])


def test_sb3_peer_leaves_no_log_folder_behind(tmp_path, monkeypatch):
    """SB3 makes tempdir/SB3-<date> on every learn() by default; the peer runs with a logger that writes nowhere."""
    pytest.importorskip("stable_baselines3")
    import tempfile

    from mlsys_nb.rl import sb3_train

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.delenv("SB3_LOGDIR", raising=False)
    _, curve = sb3_train("CartPole-v1", seed=0, total_steps=256)
    assert curve["env_steps"].iloc[-1] == 256
    assert list(tmp_path.glob("SB3-*")) == []
