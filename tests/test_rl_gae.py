"""GAE: a hand-worked rollout, the lam = 1 / lam = 0 identities, episode boundaries, types, bad input."""

import numpy as np
import pytest
import torch

from mlsys_nb.rl import discounted_returns, gae


def brute_force_gae(rewards, values, dones, last_value, gamma, lam):
    """Independent reference (eq. 16 of arXiv:1506.02438 written out): A_t = sum_l (gamma lam)^l delta_{t+l},
    the sum stopped after the step where the episode ends; one column at a time, float64."""
    r, v, d = (np.asarray(x, dtype=np.float64) for x in (rewards, values, dones))
    T = len(r)
    v_next = np.append(v[1:], float(last_value))
    delta = r + gamma * (1 - d) * v_next - v
    adv = np.zeros(T)
    for t in range(T):
        for k in range(t, T):
            adv[t] += (gamma * lam) ** (k - t) * delta[k]
            if d[k]:
                break
    return adv


def random_rollout(rng, T=13, N=4):
    return (rng.normal(size=(T, N)), rng.normal(size=(T, N)), rng.random((T, N)) < 0.2, rng.normal(size=N))


def test_hand_worked_rollout():
    # r = [1, 2, 3], V = [0.5, 1, 1.5], episode ends at t=1, V(after last step) = 2, gamma = lam = 0.5:
    # t=2: delta = 3 + 0.5*2 - 1.5 = 2.5                      A2 = 2.5
    # t=1: delta = 2 - 1 = 1 (episode ended: no bootstrap)     A1 = 1
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1                         A0 = 1 + 0.25 * 1 = 1.25
    adv, ret = gae(np.array([1.0, 2.0, 3.0]), np.array([0.5, 1.0, 1.5]), np.array([False, True, False]), 2.0, 0.5, 0.5)
    np.testing.assert_allclose(adv, [1.25, 1.0, 2.5])
    np.testing.assert_allclose(ret, [1.75, 2.0, 4.0])


@pytest.mark.parametrize("lam", [0.0, 0.37, 0.95, 1.0])
def test_matches_brute_force_on_random_rollouts(lam):
    rng = np.random.default_rng(int(lam * 100))
    r, v, d, last = random_rollout(rng)
    adv, ret = gae(r, v, d, last, 0.9, lam)
    for n in range(r.shape[1]):
        np.testing.assert_allclose(adv[:, n], brute_force_gae(r[:, n], v[:, n], d[:, n], last[n], 0.9, lam), rtol=1e-12)
    np.testing.assert_allclose(ret, adv + v)


def test_lambda_one_is_discounted_return_minus_value():
    r, v, d, last = random_rollout(np.random.default_rng(1), T=40, N=3)
    adv, ret = gae(r, v, d, last, 0.97, 1.0)
    np.testing.assert_allclose(adv, discounted_returns(r, d, last, 0.97) - v, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ret, discounted_returns(r, d, last, 0.97), rtol=1e-10, atol=1e-12)


def test_lambda_zero_is_one_step_td_error():
    r, v, d, last = random_rollout(np.random.default_rng(2))
    adv, _ = gae(r, v, d, last, 0.9, 0.0)
    v_next = np.concatenate([v[1:], last[None]])
    np.testing.assert_allclose(adv, r + 0.9 * (~d) * v_next - v, rtol=1e-12)


def boundary_leaks(fn) -> bool:
    """True if what happens after an episode end changes the advantages before it."""
    rng = np.random.default_rng(3)
    r, v, d, last = random_rollout(rng, T=12, N=1)
    d[:] = False
    d[5] = True
    a1, _ = fn(r, v, d, last, 0.99, 0.95)
    r2, v2 = r.copy(), v.copy()
    r2[6:] += 10.0
    v2[6:] -= 7.0
    a2, _ = fn(r2, v2, d, last + 3.0, 0.99, 0.95)
    return not np.allclose(a1[:6], a2[:6])


def test_episode_boundaries_are_respected_and_the_check_catches_a_leak():
    assert not boundary_leaks(gae)

    def ignores_dones(r, v, d, last, gamma, lam):
        return gae(r, v, np.zeros_like(d), last, gamma, lam)

    assert boundary_leaks(ignores_dones)


def test_a_column_is_its_own_rollout():
    r, v, d, last = random_rollout(np.random.default_rng(4))
    adv, _ = gae(r, v, d, last, 0.9, 0.8)
    adv1, _ = gae(r[:, 2], v[:, 2], d[:, 2], last[2], 0.9, 0.8)
    np.testing.assert_allclose(adv[:, 2], adv1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_torch_in_torch_out_same_dtype_same_numbers(dtype):
    r, v, d, last = random_rollout(np.random.default_rng(5))
    adv, ret = gae(
        torch.tensor(r, dtype=dtype),
        torch.tensor(v, dtype=dtype),
        torch.tensor(d),
        torch.tensor(last, dtype=dtype),
        0.99,
        0.95,
    )
    assert isinstance(adv, torch.Tensor) and adv.dtype == dtype and ret.dtype == dtype and adv.shape == r.shape
    ref, _ = gae(r, v, d, last, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref, rtol=1e-5 if dtype == torch.float32 else 1e-12, atol=1e-5)


def test_numpy_float32_stays_float32():
    r, v, d, last = (x.astype(np.float32) if x.dtype != bool else x for x in random_rollout(np.random.default_rng(6)))
    adv, ret = gae(r, v, d, last, 0.99, 0.95)
    assert isinstance(adv, np.ndarray) and adv.dtype == np.float32 and ret.dtype == np.float32


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"gamma": 1.5}, "gamma must be a finite number >= 0 and <= 1"),
        ({"gamma": -0.1}, "gamma must be a finite number >= 0 and <= 1"),
        ({"lam": 1.01}, "lam must be a finite number >= 0 and <= 1"),
        ({"lam": -1}, "lam must be a finite number >= 0 and <= 1"),
    ],
)
def test_bad_gamma_lambda(kwargs, match):
    r, v, d, last = random_rollout(np.random.default_rng(7))
    args = {"gamma": 0.99, "lam": 0.95} | kwargs
    with pytest.raises(ValueError, match=match):
        gae(r, v, d, last, **args)


def test_bad_shapes_and_types():
    r, v, d, last = random_rollout(np.random.default_rng(8))
    with pytest.raises(ValueError, match="values must have the shape of rewards"):
        gae(r, v[:-1], d, last)
    with pytest.raises(ValueError, match="dones must have the shape of rewards"):
        gae(r, v, d[:, :2], last)
    with pytest.raises(ValueError, match="last_value must have shape"):
        gae(r, v, d, last[:2])
    with pytest.raises(ValueError, match="time-major"):
        gae(r[None], v[None], d[None], last)
    with pytest.raises(TypeError, match="torch tensors too"):
        gae(torch.tensor(r), v, d, last)
    with pytest.raises(TypeError, match="floating-point"):
        gae(np.ones((3,), dtype=np.int64), np.ones(3), np.zeros(3, bool), 0.0)


def test_golden_vectors():
    """Worked by hand (formulas reference, GAE section): terminal after the last step, gamma = 0.99."""
    adv, _ = gae(np.array([0.1, 0.2, 1.0]), np.array([0.5, 0.4, 0.2]), np.array([False, False, True]), 0.0, 0.99, 0.95)
    np.testing.assert_allclose(adv, [0.70175, 0.7504, 0.8], atol=5e-6)
    r = np.array([0.1, 0.1, 0.2, 0.1, 0.5, 0.1, 0.3, 0.1, 0.1, 1.0])
    v = np.array([0.8, 0.7, 0.7, 0.6, 0.5, 0.4, 0.4, 0.3, 0.2, 0.1])
    d = np.zeros(10, dtype=bool)
    d[-1] = True
    for lam, a0 in ((0.0, -0.0070), (0.5, 0.0926), (0.9, 0.8662), (0.95, 1.1925), (1.0, 1.6489)):
        adv, _ = gae(r, v, d, 0.0, 0.99, lam)
        assert abs(adv[0] - a0) < 5e-5 and abs(adv[-1] - 0.9) < 1e-12, (lam, adv[0])
