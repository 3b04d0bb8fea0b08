"""Signal propagation at initialization: the paper's Eq. 3-5 hold, and fail where they should.

Eq. 4/5: with identity shortcuts and nothing after the addition, x_L = x_l + sum F and
dE/dx_l = dE/dx_L (1 + ...): the deep gradient reaches every shallow unit unchanged
(`direct` ~ 1). A shortcut scaled by lambda makes that term lambda^(L-l) (Eq. 7-8).
Depth 32 = 5 basic units per stage, batch 8: about a second per model.
"""

from __future__ import annotations

import keras
import numpy as np
import pytest

import keras_preact
from keras_preact import analysis

UNITS_PER_STAGE = 5


def stats_for(**overrides):
    keras.utils.set_random_seed(0)  # the estimates are noisy: same init every run
    model = keras_preact.build("preact-110", depth=6 * UNITS_PER_STAGE + 2, **overrides)
    stats = analysis.signal_propagation(model, batch_size=8)
    assert stats["unit"][UNITS_PER_STAGE] == "stage2_unit001"
    return {k: v.reshape(3, UNITS_PER_STAGE) for k, v in stats.items() if k != "unit"}


@pytest.fixture(scope="module")
def full_preact():
    return stats_for()


def test_residual_units_names_and_outputs():
    units = analysis.residual_units(keras_preact.build("resnet-20"))
    assert len(units) == 9
    assert units[0] == ("stage1_unit001", "stage1_unit001_out_relu")  # post-add ReLU (Fig. 4a)
    units = analysis.residual_units(keras_preact.build("preact-20"))
    assert units[-1] == ("stage3_unit003", "stage3_unit003_add")  # pre-act: the sum itself


def test_full_preact_propagates_signal_directly(full_preact):
    stats = full_preact
    np.testing.assert_array_equal(stats["stage"][:, 0], [1, 2, 3])
    # Eq. 5: the gradient at each unit contains the stage's deepest gradient ~unchanged (the
    # deepest unit's own share is 1 by definition: the units before it are what count).
    assert stats["direct"][:, :-1].min() > 0.8
    # Eq. 4: the signal grows smoothly (x_{l+1} = x_l + F), no collapse and no blow-up:
    # less than doubling the second moment per unit.
    steps = stats["signal"][:, 1:] / stats["signal"][:, :-1]
    assert np.all(steps > 1.0) and np.all(steps < 1.7)
    growth = stats["signal"][:, -1] / stats["signal"][:, 0]
    assert np.all(growth**2 < 2 ** (UNITS_PER_STAGE - 1))
    # No vanishing gradient towards the input.
    assert stats["gradient"][0, 0] > stats["gradient"][-1, -1]


@pytest.mark.parametrize(
    "overrides",
    [
        {"shortcut": "constant-scaling", "shortcut_scale": 0.5},
        # Sec. 3.1: dropout "imposes a scale of lambda with an expectation of 0.5".
        {"shortcut": "dropout", "dropout_rate": 0.5},
    ],
)
def test_scaled_shortcuts_decay_exponentially(overrides):
    stats = stats_for(**overrides)
    # The direct term is lambda^k = 0.5^k for the unit k units before the stage's last one.
    for k in (1, 2, 3):
        direct = stats["direct"][:, -1 - k]
        assert np.all(direct > 0.5**k / 2) and np.all(direct < 0.5**k * 2), (k, direct)
    assert np.all(stats["direct"][:, 0] < 0.25)  # 0.5^4 = 0.06 expected, noisy estimate
    # What is true besides: the gradient's *norm* does not vanish (BN re-normalizes the
    # residual branch), it just has to pass through the weight layers instead.
    assert stats["gradient"][0, 0] > stats["gradient"][-1, -1]


def test_analysis_restores_bn_statistics_and_validates():
    model = keras_preact.build("preact-20")
    before = [v.numpy().copy() for v in model.non_trainable_variables]
    analysis.signal_propagation(model, batch_size=2)
    for b, v in zip(before, model.non_trainable_variables):
        np.testing.assert_array_equal(b, v.numpy())
    with pytest.raises(ValueError, match="one \\(batch, classes\\) output"):
        analysis.signal_propagation(keras_preact.build("preact-20", include_top=False))
    import keras

    plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match="no residual units"):
        analysis.residual_units(plain)


def test_a_saved_model_is_analysed_from_its_file(tmp_path):
    keras.utils.set_random_seed(0)
    model = keras_preact.build("preact-20", depth=8)
    model.save(str(tmp_path / "model.keras"))
    a = analysis.signal_propagation(model, batch_size=4)
    b = analysis.signal_propagation(str(tmp_path), batch_size=4)  # a run dir holding it
    assert b["unit"] == a["unit"]
    np.testing.assert_allclose(b["signal"], a["signal"], rtol=1e-4)


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="scan needs TensorFlow")
def test_a_scanned_model_is_analysed_unit_by_unit_in_its_layer_form():
    keras.utils.set_random_seed(0)
    plain = keras_preact.build("preact-110", depth=6 * UNITS_PER_STAGE + 2)
    fast = keras_preact.arch.scan.to_scanned(plain)
    with pytest.raises(ValueError, match="scanned loops.*scan.to_layered"):
        analysis.residual_units(fast)
    a = analysis.signal_propagation(plain, batch_size=4)
    b = analysis.signal_propagation(fast, batch_size=4)
    assert b["unit"] == a["unit"] and len(a["unit"]) == 3 * UNITS_PER_STAGE
    np.testing.assert_allclose(b["signal"], a["signal"], rtol=1e-4)
