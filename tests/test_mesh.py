"""Device mesh (mlsys_nb.parallel.mesh): coordinates and groups, and DP x TP, DP x PP, DP x PP x TP
training on 4 and 8 gloo ranks equal to single-process training; with the dp gradient sync taken
out on the test side (``mesh_checks.py``) the same comparison fails."""

import pytest

import mlsys_nb
from mlsys_nb.parallel import mesh

TOL = 1e-5
FOUR = [
    {"dp": 2, "tp": 2},
    {"dp": 2, "pp": 2},
    {"dp": 2, "tp": 2, "impl": "torch"},
]  # PyTorch's FSDP2 + tensor parallel on the same 2D mesh
UNSYNCED = [{"dp": 2, "tp": 2}, {"dp": 2, "pp": 2}]  # run with the dp gradient sync taken out
EIGHT = [{"pp": 2, "dp": 2, "tp": 2}]


def test_coordinates_are_row_major_with_tp_fastest():
    coords = mesh.coordinates(pp=2, dp=3, tp=2)
    assert len(coords) == 12
    for r, c in enumerate(coords):  # independent formula: r = ((pp * dp_n) + dp) * tp_n + tp
        assert r == (c["pp"] * 3 + c["dp"]) * 2 + c["tp"]
    assert mesh.group_ranks("tp", pp=2, dp=3, tp=2)[0] == [0, 1]
    assert mesh.group_ranks("dp", pp=2, dp=3, tp=2)[0] == [0, 2, 4]
    assert mesh.group_ranks("pp", pp=2, dp=3, tp=2)[0] == [0, 6]
    assert mesh.group_ranks("ep", dp=4, tp=2, ep=2) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    text = mesh.grid(pp=2, dp=2, tp=2)
    assert "pp=1:" in text and text.splitlines()[-1].split()[-2:] == ["6", "7"]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"world_size": 4, "dp": 2, "tp": 3}, "world_size"),
        ({"world_size": 4, "dp": 0, "tp": 4}, "dp"),
        ({"world_size": 4, "dp": 2, "tp": 2, "ep": 3}, "ep"),
        ({"world_size": 4, "xp": 4}, "xp"),
    ],
)
def test_bad_dims_are_explained(kw, match):
    with pytest.raises(ValueError, match=match):
        mesh.check_dims(**kw)


def test_train_rejects_before_launch():
    with pytest.raises(ValueError, match="world_size"):
        mesh.train([{"dp": 2, "tp": 2}], world_size=8)
    with pytest.raises(ValueError, match="cp"):
        mesh.train([{"dp": 2, "cp": 2}], world_size=4)
    with pytest.raises(ValueError, match="pp must be 1"):
        mesh.train([{"dp": 2, "pp": 2, "impl": "torch"}], world_size=4)


@pytest.fixture(scope="module")
def four():
    from mesh_checks import train_with_and_without_dp_sync

    mesh.check_cases(FOUR + UNSYNCED, 4)
    kwargs = {"cases": FOUR, "unsynced": UNSYNCED, "steps": 3}
    return mlsys_nb.launch(
        train_with_and_without_dp_sync, world_size=4, kwargs=kwargs, backend="gloo", timeout=180.0, output="quiet"
    )


@pytest.fixture(scope="module")
def eight():
    return mesh.train(EIGHT, world_size=8, steps=3)


def _check(results, cases, world, synced=True):
    for c, case in enumerate(cases):
        dims = {k: v for k, v in case.items() if k != "impl"}
        coords = mesh.coordinates(**dims)
        for rank in range(world):
            r = results[rank][c]
            assert r["coords"] == coords[rank]  # DeviceMesh agrees with coordinates()
            for dim in mesh.DIM_ORDER:  # and its process groups with group_ranks()
                assert r["groups"][dim] in mesh.group_ranks(dim, **dims)
                assert rank in r["groups"][dim]
            if not synced:
                assert r["max_err"] > 100 * TOL, "skipping the dp gradient sync must be caught"
            else:
                assert r["max_err"] < TOL, (case, rank, r["max_err"])
                assert r["moved"] > 100 * TOL  # the parameters did change over the run


@pytest.mark.slow
def test_dp_tp_and_dp_pp_on_four_ranks_equal_single_process(four):
    _check([synced for synced, _ in four], FOUR, 4)
    for rank in range(4):  # the kit's DDP + TP/SP and PyTorch's FSDP2 + TP see the same losses
        kit, torch_run = four[rank][0][0], four[rank][0][2]
        assert torch_run["impl"] == "torch" and kit["impl"] == "kit"
        for (a, _), (b, _) in zip(kit["losses"], torch_run["losses"]):
            assert abs(a - b) < TOL


@pytest.mark.slow
def test_dp_pp_tp_on_eight_ranks_equals_single_process(eight):
    _check(eight, EIGHT, 8)


@pytest.mark.slow
def test_the_comparison_fails_without_the_dp_gradient_sync(four):
    _check([unsynced for _, unsynced in four], UNSYNCED, 4, synced=False)
