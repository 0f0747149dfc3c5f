"""gradpipe-gradnoise: contract, annealed variance, reproducibility."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from gradpipe.registry import get_registry
from gradpipe.testing import check_component, contract_cases


def test_registered_through_entry_point():
    assert get_registry().get("transform", "gradient_noise").provider.dist == \
        "gradpipe-gradnoise"


@pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe-gradnoise"))
def test_contract(kind, name):
    check_component(kind, name)


def noise_after(steps, eta=1.0, gamma=0.55, seed=0):
    """The noise the transform added at each step to a zero gradient (SGD lr=1)."""
    var = tf.Variable(tf.zeros([20000]))
    pipe = gradpipe.build({"transforms": [
        {"kind": "gradient_noise", "eta": eta, "gamma": gamma, "seed": seed},
        {"kind": "sgd", "learning_rate": 1.0}]})
    out = []
    for _ in range(steps):
        before = var.numpy().copy()
        pipe.apply_gradients([(tf.zeros([20000]), var)])
        out.append(before - var.numpy())
    return out


def test_variance_follows_the_annealing_schedule():
    """Sample variance at step t is eta/(1+t)^gamma (20k samples: rtol 5%)."""
    for t, noise in enumerate(noise_after(4)):
        assert np.var(noise) == pytest.approx(1.0 / (1 + t) ** 0.55, rel=0.05)
        assert abs(np.mean(noise)) < 0.03


def test_reproducible_and_seeded():
    a, b, c = noise_after(2), noise_after(2), noise_after(2, seed=1)
    np.testing.assert_array_equal(a[1], b[1])
    assert not np.allclose(a[1], c[1])


def test_bad_eta():
    with pytest.raises(gradpipe.ConfigError, match=r"transforms\[0\]\.eta: must be >= 0"):
        gradpipe.parse({"transforms": [{"kind": "gradient_noise", "eta": -1.0},
                                       {"kind": "sgd"}]})
