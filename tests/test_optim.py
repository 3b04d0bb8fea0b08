"""The paper's schedule and the coupled weight decay optimizer."""

import keras
import numpy as np
import pytest

from keras_preact.training import PaperSchedule, SGDWithL2, paper_schedule


@pytest.mark.parametrize(
    "step, lr",
    [(0, 0.01), (399, 0.01), (400, 0.1), (31999, 0.1), (32000, 0.01), (47999, 0.01),
     (48000, 0.001), (63999, 0.001)],
)
def test_paper_schedule_values(step, lr):
    assert float(paper_schedule()(step)) == pytest.approx(lr, rel=1e-6)


def test_schedule_drops_follow_total_steps_and_warmup_can_be_off():
    s = paper_schedule(total_steps=1000, warmup_steps=0)
    assert s.boundary_steps == (500, 750)
    assert [float(s(i)) for i in (0, 499, 500, 750)] == pytest.approx([0.1, 0.1, 0.01, 0.001])
    imagenet = paper_schedule(total_steps=90, warmup_steps=0, boundaries=(1 / 3, 2 / 3))
    assert imagenet.boundary_steps == (30, 60)


def test_schedule_config_round_trip_through_keras_serialization():
    s = paper_schedule(total_steps=2000, base_lr=0.2, warmup_steps=10, warmup_lr=0.02)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(s))
    assert isinstance(restored, PaperSchedule)
    assert restored.get_config() == s.get_config()
    assert float(restored(1500)) == pytest.approx(0.002)


def test_schedule_rejects_bad_values():
    with pytest.raises(ValueError, match="warmup_steps"):
        paper_schedule(total_steps=100, warmup_steps=100)
    with pytest.raises(ValueError, match="total_steps"):
        paper_schedule(total_steps=0)


def test_weight_decay_is_added_to_the_gradient_before_momentum():
    # Torch optim.sgd: d = g + wd*w; v = m*v + d; w -= lr*v (Keras SGD keeps v scaled by lr).
    opt = SGDWithL2(learning_rate=0.1, momentum=0.9, l2=1e-2)
    w = keras.Variable(np.array([1.0, -2.0], "float32"))
    g = np.array([0.5, 0.5], "float32")
    expected, v = np.array([1.0, -2.0]), np.zeros(2)
    for _ in range(3):
        opt.apply_gradients([(g, w)])
        v = 0.9 * v - 0.1 * (g + 1e-2 * expected)
        expected = expected + v
    np.testing.assert_allclose(w.numpy(), expected, rtol=1e-5)
    config = SGDWithL2.from_config(opt.get_config()).get_config()
    assert config["l2"] == pytest.approx(1e-2) and config["momentum"] == pytest.approx(0.9)
