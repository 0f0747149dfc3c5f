"""gradpipe-agc: found through its entry point and correct against the closed form."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import gradpipe


def test_registered_through_entry_point():
    """The installed distribution provides `agc` to every pipeline."""
    from gradpipe.registry import get_registry

    comp = get_registry().get("transform", "agc")
    assert comp.provider.dist == "gradpipe-agc"
    assert comp.provider.entry_point == "agc"


def test_closed_form_unitwise():
    """Units over the ratio are rescaled to clipping * ||W_i||; others pass (atol 1e-6)."""
    w = np.array([[1.0, 0.0], [0.0, 0.0]], "f4")  # unit norms: 1 and eps=1e-3
    g = np.array([[0.5, 0.0], [0.0, 0.0005]], "f4")  # unit norms: .5 and 5e-4
    var = tf.Variable(w)
    pipe = gradpipe.build({"transforms": [{"kind": "agc", "clipping": 0.1},
                                          {"kind": "sgd", "learning_rate": 1.0}]})
    pipe.apply_gradients([(tf.constant(g), var)])
    # unit 0: ratio .5 > .1 -> scaled to norm .1; unit 1: ratio .5 > .1 -> 1e-4
    expected = w - np.array([[0.1, 0.0], [0.0, 0.0001]], "f4")
    np.testing.assert_allclose(var.numpy(), expected, atol=1e-6, rtol=0)


def test_small_gradients_untouched():
    var = tf.Variable(np.ones((3, 2), "f4"))
    g = np.full((3, 2), 1e-3, "f4")
    pipe = gradpipe.build({"transforms": [{"kind": "agc", "clipping": 0.01},
                                          {"kind": "sgd", "learning_rate": 1.0}]})
    pipe.apply_gradients([(tf.constant(g), var)])
    np.testing.assert_allclose(var.numpy(), 1 - g, atol=1e-7, rtol=0)


def test_bad_clipping_is_config_error():
    with pytest.raises(gradpipe.ConfigError, match=r"transforms\[0\].clipping: must be > 0"):
        gradpipe.build({"transforms": [{"kind": "agc", "clipping": -1.0}]})


@pytest.mark.parametrize("kind, name", __import__("gradpipe.testing", fromlist=["x"])
                         .contract_cases(dist="gradpipe-agc"))
def test_contract(kind, name):
    from gradpipe.testing import check_component

    check_component(kind, name)
