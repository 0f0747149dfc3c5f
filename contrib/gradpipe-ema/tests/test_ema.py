"""gradpipe-ema: contract, Keras use_ema semantics, the evaluation swap."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf
from gradpipe_ema import swap_ema

import gradpipe
from gradpipe.registry import get_registry
from gradpipe.testing import check_component, contract_cases


def test_registered_through_entry_point():
    assert get_registry().get("transform", "ema").provider.dist == "gradpipe-ema"


@pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe-ema"))
def test_contract(kind, name):
    check_component(kind, name)


def test_matches_keras_use_ema():
    """SGD(1), ema momentum .9, g = -1: v 1 then 2, average 1 then 1.1 (Keras too)."""
    keras_var = tf.Variable([0.0])
    opt = keras.optimizers.SGD(1.0, use_ema=True, ema_momentum=0.9)
    opt.build([keras_var])
    var = tf.Variable([0.0])
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 1.0},
                                          {"kind": "ema", "momentum": 0.9}]})
    for _ in range(5):
        opt.apply_gradients([(tf.constant([-1.0]), keras_var)])
        pipe.apply_gradients([(tf.constant([-1.0]), var)])
    average = pipe.transform_state("ema")["average/Variable"].numpy()
    np.testing.assert_allclose(average, opt._model_variables_moving_average[0].numpy(),
                               rtol=1e-6)
    np.testing.assert_allclose(var.numpy(), keras_var.numpy(), rtol=0)


def test_swap_for_evaluation():
    var = tf.Variable([0.0])
    pipe = gradpipe.build({"transforms": [{"kind": "sgd", "learning_rate": 1.0},
                                          {"kind": "ema", "momentum": 0.9}]})
    for _ in range(2):
        pipe.apply_gradients([(tf.constant([-1.0]), var)])
    with swap_ema(pipe):
        np.testing.assert_allclose(var.numpy(), [1.1], rtol=1e-6)
    np.testing.assert_allclose(var.numpy(), [2.0], rtol=0)


def test_must_be_after_the_update_rule():
    with pytest.raises(gradpipe.ConfigError,
                       match=r"'ema' changes the step .* move it below transforms\[1\] \('sgd'\)"):
        gradpipe.parse({"transforms": [{"kind": "ema"}, {"kind": "sgd"}]})
