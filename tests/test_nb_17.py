"""Notebook 17 under papermill with another seed and the worked solutions switched on."""

import pytest
from nbrun import other_capability, passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_17_runs_with_solutions_and_another_seed():
    # compare_sb3=True: the default (quick) run leaves stable-baselines3 out; this run trains it beside ours, for
    # one rollout (8 x 32 steps, sb3_steps' least) only: a smoke run of the comparison's code (its training, curve,
    # table, plot and "did not reach" line; 4096 steps ran the same lines ~3 s longer). SB3 to 475 is
    # benchmarks/ppo.py's, data/measured/ppo.md
    # ac_steps=20_000 (the default run's 60,000 checks the long curve): the actor-critic's check, best > 2x its
    # starting return, on another seed; at 20,000 steps seeds 0-5 reached 3.6-12.5x (measured, 2026-11-26)
    # under other CPU kernels than this machine's (other_capability: "default" on a vector CPU), so a check tuned to
    # one CPU's rounding fails here too
    nb = run_notebook(
        "17_rl_fundamentals.ipynb",
        capability=other_capability(),
        seed=1,
        solutions=True,
        compare_sb3=True,
        sb3_steps=256,
        ac_steps=20_000,
    )
    text = printed_text(nb)
    labels = passed_labels(nb)
    for check in (
        "REINFORCE more than doubles",
        "return-to-go cuts the variance",
        "the hand-worked case, lambda = 1",
        "the actor-critic more than doubles",
        "the gradient vanishes exactly",
        "PPO reached 475",
        "exercise 1, my_gae equals",
        "exercise 2, my_clipped gives",
    ):
        assert any(label.startswith(check) for label in labels), (check, labels)
    assert "SB3 did not reach 475 within sb3_steps=256 env steps" in text, "compare_sb3=True: SB3's line is missing"
    assert "not attempted" not in text


def _returns_to_go_by_tensor_steps(rewards, gamma):
    """The recursion G_t = r_t + gamma G_{t+1} on 0-d tensors, one torch op per step (the reference)."""
    import torch

    out, g = torch.empty_like(rewards), 0.0
    for t in reversed(range(len(rewards))):
        g = rewards[t] + gamma * g
        out[t] = g
    return out


def test_returns_to_go_bit_equal_to_the_tensor_recursion():
    import numpy as np
    import torch

    from mlsys_nb.rl.pg import returns_to_go

    rng = np.random.default_rng(0)
    for n in (0, 1, 5, 300):
        for dtype in (torch.float32, torch.float64):
            for gamma in (0.99, 0.5, 1.0, float(rng.random())):
                r = torch.tensor(rng.normal(size=n) * 3, dtype=dtype)
                got = returns_to_go(r, gamma)
                assert got.dtype == dtype and torch.equal(got, _returns_to_go_by_tensor_steps(r, gamma)), (n, gamma)
    # and the value itself: constant rewards give the geometric sum (float64, independent of the loop)
    g = returns_to_go(torch.ones(50, dtype=torch.float64), 0.9)
    assert np.allclose(g.numpy(), (1 - 0.9 ** np.arange(50, 0, -1)) / (1 - 0.9), rtol=1e-12)


def test_run_episodes_side_by_side_are_the_episodes_one_env_plays():
    """``run_episodes`` (8 episodes in one vector env, as ``train_reinforce`` collects them): replaying each
    episode's actions in a fresh single env reset with the same seed gives the same observations and rewards,
    and that env's episode ends exactly at the episode's last step (not earlier, not later)."""
    import gymnasium as gym
    import numpy as np
    import torch

    from mlsys_nb.rl.pg import run_episodes
    from mlsys_nb.rl.ppo import ActorCritic, make_envs

    model = ActorCritic(4, 2, 64, torch.Generator().manual_seed(3))
    seeds = [11, 12, 13, 14, 15, 16, 17, 18]
    envs = make_envs("CartPole-v1", len(seeds), same_step=False)
    try:
        episodes = run_episodes(model, envs, seeds, torch.Generator().manual_seed(4))
    finally:
        envs.close()
    assert len(episodes) == len(seeds) and len({len(r) for _, _, r in episodes}) > 1, "want episodes of several lengths"
    env = gym.make("CartPole-v1")
    try:
        for s, (obs, act, rew) in zip(seeds, episodes):
            o, _ = env.reset(seed=s)
            assert obs.shape == (len(act), 4) and rew.shape == act.shape and act.dtype == torch.int64
            for t, a in enumerate(act.tolist()):
                assert np.array_equal(obs[t].numpy(), o), (s, t)
                o, r, term, trunc, _ = env.step(a)
                assert float(rew[t]) == r, (s, t)
                assert (term or trunc) == (t == len(act) - 1), f"seed {s}: the episode ends at {t}, not {len(act) - 1}"
    finally:
        env.close()


def test_actor_critic_fast_path_is_bit_equal_to_its_modules():
    """``ActorCritic.logits``/``value`` (the layers' ``F.linear``/``tanh`` called directly, the rollouts' and
    PPO's path) give exactly ``pi(obs)`` / ``v(obs)`` of the ``nn.Sequential`` modules, forward and gradients,
    on random inputs of the shapes the rollouts use ([4], [8, 4], [256, 4])."""
    import torch

    from mlsys_nb.rl.ppo import ActorCritic

    g = torch.Generator().manual_seed(5)
    model = ActorCritic(4, 2, 64, g)
    for shape in ((4,), (8, 4), (256, 4)):
        x = torch.randn(shape, generator=g) * 3
        fast = (model.logits(x), model.value(x))
        ref = (model.pi(x), model.v(x).squeeze(-1))
        for a, b in zip(fast, ref):
            assert torch.equal(a, b), shape
        w = torch.randn(fast[0].shape, generator=g)
        grads = [
            torch.autograd.grad((lo * w).sum() + va.pow(2).sum(), list(model.parameters())) for lo, va in (fast, ref)
        ]
        assert all(torch.equal(a, b) for a, b in zip(*grads)), shape
