"""The scaling-law widget, driven headless by setting control values."""

import pytest

from mlsys_nb import flops, scaling
from mlsys_nb.widgets.scaling import ScalingWidget


def _lines(fig):
    return [tuple(map(float, l.get_xdata())) for l in fig.axes[0].lines if len(l.get_xdata())]


def test_widget_follows_the_law_and_redraws():
    w = ScalingWidget()
    assert w.error is None
    t0, l0 = w.table(), _lines(w.figure)
    n, d = scaling.law("chinchilla").compute_optimal(1e23)
    assert t0.loc["N* (compute-optimal parameters)", "value"] == pytest.approx(n)
    est = flops.training_time(n, d, gpu="H100-SXM", n_gpus=1024, mfu=0.4, price_per_gpu_hour=2.0)
    assert t0.loc["wall-clock", "value"] == pytest.approx(est.days)
    assert t0.loc["cost", "value"] == pytest.approx(est.cost_usd)
    w.controls["compute"].value = 1e21  # a single control change redraws
    assert w.table().loc["D*/N*", "value"] == pytest.approx(50.08, abs=0.01)  # Chinchilla approach 3, C = 1e21
    assert _lines(w.figure) != l0
    w.set_state({"law": "epoch"})
    assert w.table().loc["D*/N*", "value"] == pytest.approx(21.59, abs=0.01)
    assert w.state()["law"] == "epoch"


def test_inference_demand_and_custom_fit():
    fitted = scaling.ChinchillaLaw(E=1.5, A=300.0, B=900.0, alpha=0.3, beta=0.35, name="my fit")
    w = ScalingWidget(laws={"my fit": fitted}, law="my fit", inference=True, inference_tokens=1e14)
    t = w.table()
    assert t.loc["inference-aware N", "value"] < t.loc["N* (compute-optimal parameters)", "value"]
    assert "saves" in w.stats.value
    w2 = ScalingWidget(laws={"my fit": fitted}, **w.state())
    assert w2.state() == w.state() and w2.table().equals(t)


@pytest.mark.parametrize(
    "bad, word",
    [({"mfu": 0.0}, "MFU"), ({"mfu": 1.5}, "MFU"), ({"n_gpus": 0}, "GPUs"), ({"price_per_gpu_hour": -1.0}, "GPU-hour")],
)
def test_invalid_input_is_shown_in_place(bad, word):
    """The message names the setting in the words of its label, not its variable (``mfu``, ``n_gpus``)."""
    w = ScalingWidget()
    w.set_state(bad)
    assert w.error and word in w.error and "Invalid" in w.message.value
    assert next(iter(bad)) not in w.error
    assert w.table().empty
    w.set_state({"mfu": 0.4, "n_gpus": 8, "price_per_gpu_hour": 2.0})
    assert w.error is None and not w.table().empty


def test_both_panels_have_a_title():
    """Every figure of the dashboard has a title and human units (issue 53): the scaling tab's two panels."""
    w = ScalingWidget()
    titles = [ax.get_title() for ax in w.figure.axes[:2]]
    assert all(titles) and "iso-FLOP" in titles[0], titles


def test_the_headline_writes_large_numbers_as_powers_of_ten():
    w = ScalingWidget(compute=1e23)
    assert "C = 1e23 FLOPs" in w.stats.value and "e+" not in w.stats.value
    assert f"N* = {w.result['N']:.3g}".replace("e+", "e") in w.stats.value
