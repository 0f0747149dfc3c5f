"""Run TFRS ClippyAdagrad on cases from stdin (JSON); print results as JSON.

Runs in its own process with TF_USE_LEGACY_KERAS=1: TFRS needs Keras 2 (tf_keras).
"""

import json
import os
import sys

assert os.environ.get("TF_USE_LEGACY_KERAS") == "1"
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_recommenders as tfrs  # noqa: E402


def run(case):
    opt = tfrs.experimental.optimizers.ClippyAdagrad(export_clipping_factors=True,
                                                     **case["params"])
    var = tf.Variable(np.array(case["init"], "float32"))
    factors = []
    for step in case["steps"]:
        if "indices" in step:
            grad = tf.IndexedSlices(tf.constant(step["values"], tf.float32),
                                    tf.constant(step["indices"]),
                                    tf.constant(np.shape(case["init"])))
        else:
            grad = tf.constant(step["values"], tf.float32)
        opt.apply_gradients([(grad, var)])
        factors.append(float(opt.clipping_factors[0].numpy()))
    return {"var": var.numpy().tolist(), "accumulator": opt._accumulators[0].numpy().tolist(),
            "factors": factors}


print(json.dumps([run(c) for c in json.load(sys.stdin)]))
