import pytest

from scheduler import CostModel, fit_cost_model


def test_time_s_matches_formula():
    model = CostModel(fixed_s=0.5, per_item_s=0.25, scaling_exponent=0.5)
    # 0.5 + 0.25 * 16 / 4 ** 0.5 = 0.5 + 4 / 2 = 2.5
    assert model.time_s(16, 4) == pytest.approx(2.5)
    assert model.time_s(16) == pytest.approx(4.5)
    assert model.time_s(0, 3) == 0.0


@pytest.mark.parametrize("bad", [dict(fixed_s=-1.0), dict(per_item_s=-0.1), dict(scaling_exponent=1.5)])
def test_rejects_impossible_parameters(bad):
    with pytest.raises(ValueError):
        CostModel(**bad)


@pytest.mark.parametrize(
    "truth",
    [CostModel(0.01, 0.002, 0.8), CostModel(0.0, 0.001, 1.0), CostModel(0.3, 0.0005, 0.0), CostModel(2.0, 0.0, 1.0)],
)
def test_fit_recovers_known_parameters_from_exact_probes(truth):
    probes = [(b, n, truth.time_s(b, n)) for b, n in [(16, 1), (64, 1), (256, 2), (64, 4), (256, 4)]]
    fitted = fit_cost_model(probes)
    assert fitted.fixed_s == pytest.approx(truth.fixed_s, abs=1e-9)
    assert fitted.per_item_s == pytest.approx(truth.per_item_s, rel=1e-6, abs=1e-12)
    if truth.per_item_s > 0:  # the exponent is only identifiable when there is per-item work
        assert fitted.scaling_exponent == pytest.approx(truth.scaling_exponent, abs=1e-6)


def test_fit_on_one_device_count_recovers_line_and_keeps_exponent_one():
    # Two probes on one device: 0.1 + 0.01 * b
    fitted = fit_cost_model([(8, 1, 0.18), (32, 1, 0.42)])
    assert (fitted.fixed_s, fitted.per_item_s, fitted.scaling_exponent) == pytest.approx((0.1, 0.01, 1.0))


def test_fit_degenerate_single_batch_attributes_cost_per_item():
    fitted = fit_cost_model([(10, 1, 1.0), (10, 1, 1.2)])
    assert fitted.fixed_s == 0.0
    # Relative least squares (weights 1/y^2): mean = (1/1 + 1.2/1.44) / (1/1 + 1/1.44) = 1.08197 s; / 10 items
    assert fitted.per_item_s == pytest.approx((1 + 1 / 1.2) / (1 + 1 / 1.44) / 10)


def test_fit_clamps_to_non_negative_parameters():
    # Time falls with batch size (noise): no negative per-item cost, a constant instead.
    fitted = fit_cost_model([(8, 1, 1.0), (64, 1, 0.9)])
    assert fitted.per_item_s == 0.0 and fitted.fixed_s > 0
    # A line through a negative intercept is clamped to go through the origin.
    fitted = fit_cost_model([(10, 1, 0.5), (20, 1, 1.5)])
    assert fitted.fixed_s == 0.0 and fitted.per_item_s > 0


def test_fit_is_deterministic_and_validates_probes():
    probes = [(4, 1, 0.3), (16, 2, 0.5), (64, 4, 0.9)]
    assert fit_cost_model(probes) == fit_cost_model(list(probes))
    with pytest.raises(ValueError):
        fit_cost_model([])
    with pytest.raises(ValueError):
        fit_cost_model([(0, 1, 1.0)])


def test_cost_model_json_round_trip():
    model = CostModel(0.1, 0.002, 0.75)
    assert CostModel.from_dict(model.to_dict()) == model
    with pytest.raises(ValueError, match="unknown key"):
        CostModel.from_dict({"fixed": 1.0})


def test_fit_with_a_known_exponent_fits_only_the_line():
    # noisy single-process probes: the exponent is known (0), not guessed from the noise
    samples = [(8, 1, 0.081), (4, 1, 0.039), (2, 1, 0.021)]
    fitted = fit_cost_model(samples, scaling_exponent=0.0)
    assert fitted.scaling_exponent == 0.0
    assert fitted.per_item_s == pytest.approx(0.01, rel=0.1)
    assert fitted.time_s(8, 4) == fitted.time_s(8, 1)
    with pytest.raises(ValueError, match="scaling_exponent"):
        fit_cost_model(samples, scaling_exponent=2.0)
