"""``cocob``, ``proximal_adagrad`` and ``conditional_gradient`` against TF Addons'
own tests and against the reference maths.

TF Addons does not import on TensorFlow 2.21, so its tests
(``tensorflow_addons/optimizers/tests/cocob_test.py``,
``proximal_adagrad_test.py``, ``conditional_gradient_test.py``) are ported: the
same variables, gradients, hyperparameters, step counts and expected values,
with TF Addons' tolerances where its values are golden numbers. Beyond them:

* ``cocob``: a numpy rewrite of TF Addons' update, in its order
  of operations, over random gradients;
* ``proximal_adagrad``: TensorFlow's own kernels, which TF Addons calls
  (``tf.raw_ops.ResourceApplyProximalAdagrad`` and its sparse twin), over
  random gradients;
* ``conditional_gradient``: the closed form, with numpy's SVD;
* a sparse gradient steps as its dense sum (``lazy`` off), ``lazy`` leaves
  the other rows alone, defaults are TF Addons', bad values name the key, and
  each departure from TF Addons (docs/transforms.md) is pinned.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import tensorflow as tf

import gradpipe
from conftest import assert_close
from gradpipe.errors import ConfigError

F32 = np.float32


def run(transform: dict, variables, grads, steps: int = 1, pipe=None):
    """``steps`` applications of the same gradients; the pipeline, to go on."""
    pipe = pipe or gradpipe.build({"transforms": [transform]})
    for _ in range(steps):
        pipe.apply_gradients(zip(grads, variables))
    return pipe


def rows(indices, shape=(5, 3, 2)):
    """IndexedSlices of ``indices`` (repeats allowed), as the optax tests build them."""
    values = tf.ones((len(indices), *shape[1:])) * tf.constant([[1.0, -2.0]] * shape[1])
    return tf.IndexedSlices(values, tf.constant(indices), tf.constant(shape))


# -- defaults and validation --------------------------------------------------

# The keyword defaults of each TF Addons class's ``__init__`` (tensorflow/addons,
# ``tensorflow_addons/optimizers/cocob.py``, ``proximal_adagrad.py``,
# ``conditional_gradient.py``), ``name`` and ``use_locking`` left out.
# ConditionalGradient's ``learning_rate`` has no default: it is required.
TFA_DEFAULTS = {
    "cocob": {"alpha": 100.0},
    "proximal_adagrad": {"learning_rate": 0.001, "initial_accumulator_value": 0.1,
                         "l1_regularization_strength": 0.0,
                         "l2_regularization_strength": 0.0},
    "conditional_gradient": {"lambda_": 0.01, "epsilon": 1e-7, "ord": "fro"},
}
REQUIRED = {"conditional_gradient": {"learning_rate": 0.5}}


@pytest.mark.parametrize("kind", sorted(TFA_DEFAULTS))
def test_defaults_are_tf_addons(kind):
    config = gradpipe.parse({"transforms": [{"kind": kind, **REQUIRED.get(kind, {})}]}
                            ).transforms[0].config
    for key, default in TFA_DEFAULTS[kind].items():
        assert getattr(config, key) == default, key
    extra = {f.name for f in attrs.fields(type(config))} - set(TFA_DEFAULTS[kind])
    assert extra - set(REQUIRED.get(kind, {})) <= {"lazy"}
    assert getattr(config, "lazy", False) is False


def test_conditional_gradient_needs_a_learning_rate():
    with pytest.raises(ConfigError, match="learning_rate"):
        gradpipe.build({"transforms": [{"kind": "conditional_gradient"}]})


@pytest.mark.parametrize("table, key", [
    ({"kind": "cocob", "alpha": 0.5}, "alpha"),  # TF Addons: alpha < 1 raises
    ({"kind": "proximal_adagrad", "learning_rate": -1.0}, "learning_rate"),
    ({"kind": "proximal_adagrad", "initial_accumulator_value": 0.0},
     "initial_accumulator_value"),
    ({"kind": "proximal_adagrad", "l1_regularization_strength": -0.1},
     "l1_regularization_strength"),
    ({"kind": "proximal_adagrad", "l2_regularization_strength": -2.0},
     "l2_regularization_strength"),
    ({"kind": "conditional_gradient", "learning_rate": 1.5}, "learning_rate"),
    ({"kind": "conditional_gradient", "learning_rate": 0.5, "lambda_": -0.1}, "lambda_"),
    ({"kind": "conditional_gradient", "learning_rate": 0.5, "epsilon": -1e-7}, "epsilon"),
    ({"kind": "conditional_gradient", "learning_rate": 0.5, "ord": "spectral"}, "ord"),
])
def test_invalid_values_name_the_key(table, key):
    with pytest.raises(ConfigError, match=key):
        gradpipe.build({"transforms": [table]})


def test_a_misspelt_ord_is_named():
    with pytest.raises(ConfigError, match="did you mean 'nuclear'"):
        gradpipe.build({"transforms": [{"kind": "conditional_gradient", "learning_rate": 0.5,
                                        "ord": "nuclaer"}]})


# -- sparse gradients -----------------------------------------------------------

SPARSE_CASES = {
    "cocob": {"kind": "cocob"},
    "proximal_adagrad": {"kind": "proximal_adagrad", "learning_rate": 0.1},
    "proximal_adagrad_l1_l2": {"kind": "proximal_adagrad", "learning_rate": 0.1,
                               "l1_regularization_strength": 0.01,
                               "l2_regularization_strength": 0.1},
    "conditional_gradient": {"kind": "conditional_gradient", "learning_rate": 0.9,
                             "lambda_": 0.5},
    "conditional_gradient_nuclear": {"kind": "conditional_gradient", "learning_rate": 0.9,
                                     "lambda_": 0.5, "ord": "nuclear"},
}


@pytest.mark.parametrize("indices", [[0, 2, 4], [2, 0, 4, 2]], ids=["unique", "duplicates"])
@pytest.mark.parametrize("case", sorted(SPARSE_CASES))
def test_a_sparse_gradient_steps_as_its_dense_sum(case, indices):
    """Keras's sparse check (five steps, rtol 1e-6, atol 1e-6), as for the optax rules."""
    sparse_var, dense_var = tf.Variable(tf.ones((5, 3, 2))), tf.Variable(tf.ones((5, 3, 2)))
    sparse_pipe, dense_pipe = (gradpipe.build({"transforms": [SPARSE_CASES[case]]})
                               for _ in range(2))
    for _ in range(5):
        grad = rows(indices)
        sparse_pipe.apply_gradients([(grad, sparse_var)])
        dense_pipe.apply_gradients([(tf.convert_to_tensor(grad), dense_var)])
        assert_close(sparse_var.numpy(), dense_var.numpy(), rtol=1e-6, atol=1e-6)
    assert not np.array_equal(dense_var.numpy(), np.ones((5, 3, 2)))
    kind = SPARSE_CASES[case]["kind"]
    dense_state = dense_pipe.transform_state(kind)
    for key, value in sparse_pipe.transform_state(kind).items():
        assert_close(value.numpy(), dense_state[key].numpy(), rtol=1e-6, atol=1e-6)
    if case in ("cocob", "proximal_adagrad"):  # a zero row's step is 0: not even rounding
        np.testing.assert_array_equal(sparse_var.numpy()[[1, 3]], 1.0)


@pytest.mark.parametrize("case", ["proximal_adagrad_l1_l2", "conditional_gradient",
                                  "conditional_gradient_nuclear"])
def test_lazy_leaves_untouched_rows_alone(case):
    """With ``lazy = true`` (TF Addons' sparse apply) the rows no gradient touches
    keep their values; without it, these rules move them (shrink, or scale by the
    learning rate)."""
    after = {}
    for lazy in (True, False):
        var = tf.Variable(tf.ones((5, 3, 2)))
        pipe = run({**SPARSE_CASES[case], "lazy": lazy}, [var], [rows([0, 1, 2, 3, 4])])
        moved = var.numpy()
        run({}, [var], [rows([0, 2])], steps=3, pipe=pipe)
        after[lazy] = var.numpy()
        assert not np.array_equal(after[lazy][[0, 2]], moved[[0, 2]])
    np.testing.assert_array_equal(after[True][[1, 3, 4]], moved[[1, 3, 4]])
    assert np.all(np.abs(after[False][[1, 3, 4]]) < np.abs(moved[[1, 3, 4]]))


# -- cocob ----------------------------------------------------------------------


def cocob_step(w, g, alpha, state=None):
    """One step of TF Addons' ``COCOB._resource_apply_dense``, in numpy, in its
    order of operations: the new weights and the five slots."""
    dtype = w.dtype.type
    scale, grad_sum, norm_sum, offset, reward = state or (
        np.full_like(w, 1e-8), *(np.zeros_like(w) for _ in range(4)))
    scale = np.maximum(scale, np.abs(g))
    grad_sum, norm_sum = grad_sum + g, norm_sum + np.abs(g)
    reward = np.maximum(reward - g * offset, dtype(0))
    bound = np.maximum(norm_sum + scale, dtype(alpha) * scale)
    new_offset = -grad_sum / (scale * bound) * (reward + scale)
    return w - offset + new_offset, (scale, grad_sum, norm_sum, new_offset, reward)


def cocob_reference(w, g, steps, alpha):
    """``steps`` float32 steps of the same gradients."""
    w, g, state = np.asarray(w, F32), np.asarray(g, F32), None
    for _ in range(steps):
        w, state = cocob_step(w, g, alpha, state)
    return w


@pytest.mark.parametrize("alpha, steps, expected", [
    (None, 10, [[0.84528893, 1.845289], [2.845289, 3.845289]]),  # default alpha
    (20, 7, [[0.09346926, 1.0934693], [2.0934694, 3.0934694]]),  # an int alpha
    (55.7, 5, [[0.89307845, 1.8930784], [2.8930783, 3.8930783]]),
])
def test_cocob_tf_addons_dense_sample(alpha, steps, expected):
    """TF Addons' ``run_dense_sample`` (its tolerance: atol 2e-4); then the rewrite
    of its update within a float32 rounding per step."""
    starts, grads = [[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.2], [0.03, 0.04]]
    variables = [tf.Variable(s, dtype=tf.float32) for s in starts]
    run({"kind": "cocob", **({} if alpha is None else {"alpha": alpha})}, variables,
        [tf.constant(g) for g in grads], steps)
    for var, value in zip(variables, expected):
        np.testing.assert_allclose(var.numpy(), value, atol=2e-4)
    reference = [cocob_reference(s, g, steps, alpha or 100.0)
                 for s, g in zip(starts, grads)]
    assert_close([v.numpy() for v in variables], reference, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype, rtol, atol", [(tf.float16, 1e-3, 1e-3),
                                               (tf.float32, 1e-6, 1e-6),
                                               (tf.float64, 1e-12, 1e-12)])
def test_cocob_follows_tf_addons_over_random_gradients(dtype, rtol, atol):
    """Twelve steps whose gradients change sign, so that the reward is spent and
    grows again. A float16 variable steps through a float32 master."""
    rng = np.random.default_rng(3)
    start = rng.normal(size=(4, 3))
    grads = rng.normal(size=(12, 4, 3))
    var = tf.Variable(start, dtype=dtype)
    pipe = gradpipe.build({"transforms": [{"kind": "cocob", "alpha": 10.0}]})
    w = start.astype(np.float64 if dtype == tf.float64 else F32)
    state = None
    for g in grads:
        pipe.apply_gradients([(tf.constant(g, dtype), var)])
        w, state = cocob_step(w, g.astype(w.dtype), 10.0, state)
    np.testing.assert_allclose(var.numpy().astype(np.float64), w, rtol=rtol, atol=atol)


def test_cocob_first_step_is_one_over_alpha():
    """While the sums are small the bet's denominator is ``alpha L^2``: an element's
    first step is ``-sign(g) / alpha``, whatever the gradient's size."""
    var = tf.Variable([1.0, -3.0, 0.5])
    run({"kind": "cocob", "alpha": 20.0}, [var], [tf.constant([0.3, -7.0, 1e-3])])
    np.testing.assert_allclose(var.numpy(), [0.95, -2.95, 0.45], rtol=1e-6)


def test_cocob_starts_from_the_weights_of_the_first_step():
    """The state holds offsets (TF Addons' five slots, by its names), not a copy of
    the weights: weights loaded after the pipeline was built are where the betting
    starts."""
    grads = [tf.constant([0.1, -0.2])]
    loaded = tf.Variable([0.0, 0.0], name="w")
    pipe = gradpipe.build({"transforms": [{"kind": "cocob"}]})
    pipe.build([loaded])
    assert sorted(pipe.transform_state("cocob")) == [
        f"{slot}/w" for slot in ("grad_norm_sum", "gradients_sum", "lr", "reward", "tilde_w")]
    loaded.assign([1.0, 2.0])
    run({}, [loaded], grads, 3, pipe=pipe)
    fresh = tf.Variable([1.0, 2.0])
    run({"kind": "cocob"}, [fresh], grads, 3)
    np.testing.assert_array_equal(loaded.numpy(), fresh.numpy())


# -- proximal_adagrad -------------------------------------------------------------

# TF Addons' proximal_adagrad_test.py: lr 3.0, initial_accumulator_value 0.1, ten
# steps; its keyword arguments, its expected values, its rtol (atol 0).
PROXIMAL = {"kind": "proximal_adagrad", "learning_rate": 3.0,
            "initial_accumulator_value": 0.1}
L1 = {"l1_regularization_strength": 0.001}
L1_L2 = {**L1, "l2_regularization_strength": 2.0}


@pytest.mark.parametrize("keys, sparse, expected, rtol", [
    ({}, False, [[-6.722771, -9.230448], [3.0539124, 1.1230775]], 1e-7),
    (L1, False, [[-6.663634, -9.190331], [2.9593036, 1.0292315]], 1e-7),
    (L1_L2, False, [[-0.0495, -0.0995], [-0.0045, -0.0095]], 1e-7),
    ({}, True, [[-6.722771, 2.0], [4.0, 1.1230775]], 5e-7),
    (L1, True, [[-6.663634, 2.0], [4.0, 1.0292315]], 5e-7),
    (L1_L2, True, [[-0.0495, 2.0], [4.0, -0.0095]], 1e-7),
], ids=["dense", "dense-l1", "dense-l1-l2", "sparse", "sparse-l1", "sparse-l1-l2"])
def test_proximal_adagrad_tf_addons_sample(keys, sparse, expected, rtol):
    """TF Addons' ``run_sample``; its sparse gradients touch one row of each
    variable, and its sparse kernel leaves the other alone: ``lazy = true``."""
    variables = [tf.Variable([1.0, 2.0]), tf.Variable([4.0, 3.0])]
    if sparse:
        grads = [tf.IndexedSlices(tf.constant([0.1]), tf.constant([0]), tf.constant([2])),
                 tf.IndexedSlices(tf.constant([0.02]), tf.constant([1]), tf.constant([2]))]
    else:
        grads = [tf.constant([0.1, 0.2]), tf.constant([0.01, 0.02])]
    run({**PROXIMAL, **keys, "lazy": sparse}, variables, grads, 10)
    for var, value in zip(variables, expected):
        np.testing.assert_allclose(var.numpy(), value, rtol=rtol, atol=0.0)


def kernel_steps(start, grads, keys, *, indices=None):
    """TensorFlow's kernels, which TF Addons' ``_resource_apply_dense`` and
    ``_resource_apply_sparse`` call, stepped over ``grads``."""
    dtype = tf.as_dtype(start.dtype)
    var = tf.Variable(start)
    acc = tf.Variable(tf.fill(start.shape, tf.constant(0.1, dtype)))
    scalars = {name: tf.constant(keys.get(key, 0.0), dtype) for name, key in (
        ("lr", "learning_rate"), ("l1", "l1_regularization_strength"),
        ("l2", "l2_regularization_strength"))}
    for g in grads:
        if indices is None:
            tf.raw_ops.ResourceApplyProximalAdagrad(var=var.handle, accum=acc.handle,
                                                    grad=tf.constant(g), **scalars)
        else:
            tf.raw_ops.ResourceSparseApplyProximalAdagrad(
                var=var.handle, accum=acc.handle, grad=tf.constant(g),
                indices=tf.constant(indices), **scalars)
    return var.numpy()


@pytest.mark.parametrize("dtype, tol", [(np.float32, 1e-6), (np.float64, 1e-14)])
@pytest.mark.parametrize("lazy", [False, True], ids=["dense", "lazy"])
@pytest.mark.parametrize("keys", [
    {}, {"l1_regularization_strength": 0.05}, {"l2_regularization_strength": 0.1},
    {"l1_regularization_strength": 0.05, "l2_regularization_strength": 0.1},
], ids=["plain", "l1", "l2", "l1-l2"])
def test_proximal_adagrad_is_tensorflows_kernel(keys, lazy, dtype, tol):
    """Twelve steps of random gradients (elements cross 0, so the L1 threshold
    bites), against the kernels themselves; lazy: rows 4, 0, 2 of six, against
    the sparse kernel (a row's maths is the dense kernel's)."""
    rng = np.random.default_rng(5)
    start = rng.normal(scale=0.2, size=(6, 3)).astype(dtype)
    indices = [4, 0, 2] if lazy else None
    grads = rng.normal(size=(12, 3 if lazy else 6, 3)).astype(dtype)
    keys = {"learning_rate": 0.5, **keys}
    var = tf.Variable(start)
    pipe = gradpipe.build({"transforms": [{"kind": "proximal_adagrad", "lazy": lazy, **keys}]})
    for g in grads:
        grad = (tf.IndexedSlices(tf.constant(g), tf.constant(indices), tf.constant([6, 3]))
                if lazy else tf.constant(g))
        pipe.apply_gradients([(grad, var)])
    expected = kernel_steps(start, grads, keys, indices=indices)
    np.testing.assert_allclose(var.numpy(), expected, rtol=tol, atol=tol)


def test_proximal_adagrad_refuses_the_zero_accumulator_that_makes_tensorflow_nan():
    """TF Addons accepts ``initial_accumulator_value = 0``; then the kernel's first
    step on an element whose gradient is 0 is ``0 * rsqrt(0)``: NaN."""
    var, acc = tf.Variable([1.0, 2.0]), tf.Variable([0.0, 0.0])
    tf.raw_ops.ResourceApplyProximalAdagrad(
        var=var.handle, accum=acc.handle, lr=tf.constant(0.1), l1=tf.constant(0.0),
        l2=tf.constant(0.0), grad=tf.constant([0.0, 0.5]))
    assert np.isnan(var.numpy()[0])
    with pytest.raises(ConfigError, match=r"initial_accumulator_value.*> 0"):
        gradpipe.parse({"transforms": [{"kind": "proximal_adagrad",
                                        "initial_accumulator_value": 0.0}]})


# -- conditional_gradient ---------------------------------------------------------

# TF Addons' ``assert_allclose_according_to_type``: 1e-6, and 1e-3 for float16
TOLERANCE = {tf.float16: 1e-3, tf.float32: 1e-6, tf.float64: 1e-6}


def top_singular_vector(g):
    """``u v^T`` of ``g``'s largest singular value, ``g`` read as a matrix (a
    vector as one row, a tensor of higher rank as ``[-1, shape[-1]]``), by numpy."""
    g = np.asarray(g, np.float64)
    matrix = g.reshape(1, -1) if g.ndim < 2 else g.reshape(-1, g.shape[-1])
    u, _, vt = np.linalg.svd(matrix, full_matrices=False)
    return np.outer(u[:, 0], vt[0]).reshape(g.shape)


def frank_wolfe(w, grads, lr, lambda_, ord="fro", epsilon=1e-7):
    """TF Addons' ``ConditionalGradient`` step in float64, over ``grads``."""
    w = np.asarray(w, np.float64)
    for g in grads:
        g = np.asarray(g, np.float64)
        s = g / (np.sqrt(np.sum(g**2)) + epsilon) if ord == "fro" else top_singular_vector(g)
        w = lr * w - (1 - lr) * lambda_ * s
    return w


def cg(lr, lambda_, ord="fro", **keys):
    return {"kind": "conditional_gradient", "learning_rate": lr, "lambda_": lambda_,
            "ord": ord, **keys}


# TF Addons' ``_db_params_frobenius_cg01`` and ``_db_params_nuclear_cg01``: "generated
# from the dist-belief conditional_gradient unittest", learning rate 0.1, lambda_ 0.1,
# ten elements from 0.0, ten random gradients (the same for both).
DB_GRADS = np.array([
    [0.00096264342, 0.17914793, 0.93945462, 0.41396621, 0.53037018, 0.93197989, 0.78648776,
     0.50036013, 0.55345792, 0.96722615],
    [0.17075552, 0.88821375, 0.20873757, 0.25236958, 0.57578111, 0.15312378, 0.5513742,
     0.94687688, 0.16012503, 0.22159521],
    [0.35077485, 0.47304362, 0.44412705, 0.44368884, 0.078527533, 0.81223965, 0.31168157,
     0.43203235, 0.16792089, 0.24644311],
    [0.9694621, 0.75035888, 0.28171822, 0.83813518, 0.53807181, 0.3728098, 0.81454384,
     0.03848977, 0.89759839, 0.93665648],
    [0.38578293, 0.8536852, 0.88722926, 0.66276771, 0.13678469, 0.94036359, 0.69107032,
     0.81897682, 0.5433259, 0.67860287],
    [0.27885768, 0.76100707, 0.24625534, 0.81354135, 0.18959245, 0.48038563, 0.84163809,
     0.41172323, 0.83259648, 0.44941229],
    [0.27233034, 0.056316052, 0.5039115, 0.24105175, 0.35697976, 0.75913221, 0.73577434,
     0.16014607, 0.57500273, 0.071136251],
    [0.58697265, 0.2494842, 0.08106143, 0.39954534, 0.15892942, 0.12683646, 0.74053431,
     0.16033, 0.66625422, 0.73515922],
    [0.8215279, 0.41994119, 0.95172721, 0.68000203, 0.79439718, 0.43384039, 0.55561525,
     0.22567581, 0.93331909, 0.29438227],
    [0.68297005, 0.67758518, 0.1748755, 0.13266537, 0.70697063, 0.055731893, 0.68593478,
     0.50580865, 0.12602448, 0.093537711],
])
DB_FROBENIUS = np.array([
    [-4.1555551e-05, -0.0077334875, -0.040554531, -0.017870162, -0.022895107, -0.040231861,
     -0.033951234, -0.021599628, -0.023891762, -0.041753378],
    [-0.00961733, -0.0507779, -0.01580694, -0.01599489, -0.03470477, -0.01264373, -0.03443632,
     -0.05546713, -0.01140388, -0.01665068],
    [-0.02462724, -0.03699233, -0.03154434, -0.03153357, -0.00876844, -0.05606323, -0.02447166,
     -0.03469437, -0.0124694, -0.01829169],
    [-0.04124615, -0.03371741, -0.0144246, -0.03668303, -0.02240246, -0.02052062, -0.03503307,
     -0.00500922, -0.03715545, -0.0393002],
    [-0.01979208, -0.0380417, -0.03747472, -0.0305847, -0.00779536, -0.04024222, -0.03156913,
     -0.0337613, -0.02578116, -0.03148952],
    [-0.01555188, -0.04084422, -0.01573331, -0.04265549, -0.01000746, -0.02740575, -0.04412147,
     -0.02341569, -0.0431026, -0.02502293],
    [-0.01890448, -0.00767214, -0.03367592, -0.01962219, -0.02374279, -0.05110247, -0.05128598,
     -0.01254396, -0.04094185, -0.00703416],
    [-0.03772914, -0.01599993, -0.00831695, -0.02635719, -0.01207801, -0.01285448, -0.05034328,
     -0.01104364, -0.04477356, -0.04558991],
    [-0.03919835, -0.01970845, -0.04187151, -0.03195836, -0.03546333, -0.01999326, -0.02899324,
     -0.01083582, -0.04472339, -0.01725317],
    [-0.04510314, -0.04282944, -0.0147322, -0.0111956, -0.04617687, -0.00535998, -0.0442614,
     -0.03158399, -0.01207165, -0.00736567],
])
DB_NUCLEAR = np.array([
    [-4.1552783e-05, -0.0077334875, -0.040554535, -0.017870164, -0.022895109, -0.040231861,
     -0.033951234, -0.021599628, -0.023891764, -0.041753381],
    [-0.00961733, -0.0507779, -0.01580694, -0.01599489, -0.03470477, -0.01264373, -0.03443632,
     -0.05546713, -0.01140388, -0.01665068],
    [-0.02462724, -0.03699233, -0.03154433, -0.03153357, -0.00876844, -0.05606324, -0.02447166,
     -0.03469437, -0.0124694, -0.01829169],
    [-0.04124615, -0.03371741, -0.0144246, -0.03668303, -0.02240246, -0.02052062, -0.03503307,
     -0.00500922, -0.03715545, -0.0393002],
    [-0.01979207, -0.0380417, -0.03747472, -0.0305847, -0.00779536, -0.04024221, -0.03156913,
     -0.0337613, -0.02578116, -0.03148951],
    [-0.01555188, -0.04084422, -0.01573331, -0.04265549, -0.01000746, -0.02740575, -0.04412147,
     -0.02341569, -0.0431026, -0.02502293],
    [-0.01890448, -0.00767214, -0.03367592, -0.01962219, -0.02374278, -0.05110246, -0.05128598,
     -0.01254396, -0.04094184, -0.00703416],
    [-0.03772915, -0.01599993, -0.00831695, -0.0263572, -0.01207801, -0.01285448, -0.05034329,
     -0.01104364, -0.04477356, -0.04558992],
    [-0.03919835, -0.01970845, -0.04187151, -0.03195836, -0.03546333, -0.01999326, -0.02899324,
     -0.01083582, -0.04472339, -0.01725317],
    [-0.04510314, -0.04282944, -0.0147322, -0.0111956, -0.04617687, -0.00535998, -0.0442614,
     -0.031584, -0.01207165, -0.00736567],
])


@pytest.mark.parametrize("ord, expected", [("fro", DB_FROBENIUS), ("nuclear", DB_NUCLEAR)])
def test_conditional_gradient_like_dist_belief(ord, expected):
    """TF Addons' ``test_like_dist_belief_*_cg01``: every step, rtol = atol = 1e-6."""
    var = tf.Variable(tf.zeros([10]))
    pipe = gradpipe.build({"transforms": [cg(0.1, 0.1, ord)]})
    for grad, out in zip(DB_GRADS, expected):
        pipe.apply_gradients([(tf.constant(grad, tf.float32), var)])
        np.testing.assert_allclose(var.numpy(), out, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("lr, lambda_", [(0.5, 0.01), (0.1, 0.1)], ids=["basic", "sharing"])
@pytest.mark.parametrize("ord, dtype", [("fro", tf.float16), ("fro", tf.float32),
                                        ("fro", tf.float64), ("nuclear", tf.float32),
                                        ("nuclear", tf.float64)])
def test_conditional_gradient_two_steps(ord, dtype, lr, lambda_):
    """TF Addons' ``test_basic_*``, ``test_sharing_*`` and
    ``test_tensor_learning_rate_and_conditional_gradient_*`` (the same steps):
    two variables, each step checked. A float16 variable steps through a float32
    master, so it is float32's step rounded once; TF Addons' float16 tolerance."""
    starts, grads = [[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.1], [0.01, 0.01]]
    variables = [tf.Variable(s, dtype=dtype) for s in starts]
    pipe = gradpipe.build({"transforms": [cg(lr, lambda_, ord)]})
    for steps in (1, 2):
        run({}, variables, [tf.constant(g, dtype) for g in grads], pipe=pipe)
        for var, start, g in zip(variables, starts, grads):
            np.testing.assert_allclose(
                var.numpy(), frank_wolfe(start, [g] * steps, lr, lambda_, ord),
                rtol=TOLERANCE[dtype], atol=TOLERANCE[dtype])


def embedding_gradient(var, indices, loss_of_rows):
    """The IndexedSlices gradient of ``loss_of_rows(embedding_lookup(var, indices))``."""
    with tf.GradientTape() as tape:
        loss = loss_of_rows(tf.nn.embedding_lookup(var, indices))
    grad = tape.gradient(loss, var)
    assert isinstance(grad, tf.IndexedSlices)
    return grad


@pytest.mark.parametrize("ord, dtype", [("fro", tf.float16), ("fro", tf.float32),
                                        ("fro", tf.float64), ("nuclear", tf.float32),
                                        ("nuclear", tf.float64)])
def test_conditional_gradient_minimize_sparse_resource_variable(ord, dtype):
    """TF Addons' ``test_minimize_sparse_resource_variable_*``: the square of
    ``lookup(w, [0]) @ [[4], [5]]``, whose gradient is ``[[112, 140]]``."""
    var = tf.Variable([[1.0, 2.0]], dtype=dtype)
    x = tf.constant([[4.0], [5.0]], dtype)
    grad = embedding_gradient(var, [0], lambda rows: tf.square(tf.matmul(rows, x)))
    run(cg(0.1, 0.1, ord), [var], [grad])
    expected = frank_wolfe([[1.0, 2.0]], [[[32 + 80.0, 40 + 100.0]]], 0.1, 0.1, ord)
    np.testing.assert_allclose(var.numpy(), expected, rtol=TOLERANCE[dtype],
                               atol=TOLERANCE[dtype])


@pytest.mark.parametrize("ord", ["fro", "nuclear"])
@pytest.mark.parametrize("dtype", [tf.float32, tf.float64])
def test_conditional_gradient_sparse(ord, dtype):
    """TF Addons' ``test_sparse_frobenius`` / ``test_sparse_nuclear``, with its
    sparse apply (``lazy = true``): the rows each gradient touches, two steps; the
    top singular vectors are TF Addons' constants."""
    lr, lambda_ = 0.1, 0.1
    var0, var1 = tf.Variable(tf.zeros([4, 2], dtype)), tf.Variable(tf.ones([4, 2], dtype))
    grads = [tf.IndexedSlices(tf.constant([[0.1, 0.1]], dtype), tf.constant([1]),
                              tf.constant([4, 2])),
             tf.IndexedSlices(tf.constant([[0.01, 0.01], [0.01, 0.01]], dtype),
                              tf.constant([2, 3]), tf.constant([4, 2]))]
    if ord == "fro":
        s0 = 0.1 / np.sqrt(2 * 0.1**2)
        s1 = 0.01 / np.sqrt(4 * 0.01**2)
    else:
        s0, s1 = 0.7071067, 4.9999994e-01
    pipe = gradpipe.build({"transforms": [cg(lr, lambda_, ord, lazy=True)]})
    for steps in (1, 2):
        run({}, [var0, var1], grads, pipe=pipe)
        np.testing.assert_allclose(var0.numpy()[0], [0.0, 0.0])
        for value, start, s in ((var0.numpy()[1], 0.0, s0), (var1.numpy()[2], 1.0, s1)):
            expected = start
            for _ in range(steps):
                expected = expected * lr - (1 - lr) * lambda_ * s
            np.testing.assert_allclose(value, [expected] * 2, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(var1.numpy()[0], [1.0, 1.0])  # not touched


@pytest.mark.parametrize("ord", ["fro", "nuclear"])
def test_conditional_gradient_embedding_lookup_with_2d_indices(ord):
    """TF Addons' ``test_minimize_with_2D_indicies_for_embedding_lookup_*``: with
    its sparse apply (``lazy = true``) row 0 stays ones; stepped as the dense sum
    (the default, a deliberate departure) every row is scaled by the rate."""
    lr, lambda_ = 0.1, 0.1
    dense = [[0.0, 0.0], [1.0, 1.0]]
    for lazy, row_0 in ((True, [1.0, 1.0]), (False, [lr, lr])):
        var = tf.Variable(tf.ones([2, 2]))
        grad = embedding_gradient(var, [[1]], tf.reduce_sum)
        run(cg(lr, lambda_, ord, lazy=lazy), [var], [grad])
        row_1 = frank_wolfe(np.ones([2, 2]), [dense], lr, lambda_, ord)[1]
        np.testing.assert_allclose(var.numpy(), [row_0, row_1], rtol=1e-6, atol=1e-6)


def test_conditional_gradient_nuclear_reads_a_tensor_as_one_matrix():
    """Rank 3: TF Addons' SVD is batched over the first axis and its reshape of
    ``u[:, 0]`` then fails; here the tensor is the matrix ``[6, 4]``."""
    rng = np.random.default_rng(7)
    start, grad = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 3, 4))
    _, u, _ = tf.linalg.svd(tf.constant(grad), full_matrices=False)
    with pytest.raises(tf.errors.InvalidArgumentError):
        tf.reshape(u[:, 0], [2, 1])  # TF Addons' _top_singular_vector, at rank 3
    var = tf.Variable(start, dtype=tf.float32)
    run(cg(0.5, 2.0, "nuclear"), [var], [tf.constant(grad, tf.float32)])
    np.testing.assert_allclose(var.numpy(), frank_wolfe(start, [grad], 0.5, 2.0, "nuclear"),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [[3], [2, 3]])
def test_conditional_gradient_nuclear_of_a_zero_gradient_is_zero(shape):
    """A zero gradient scales the variable by the rate, as ``fro`` does; the SVD
    of a zero matrix returns unit vectors, which TF Addons would step toward."""
    _, u, v = tf.linalg.svd(tf.zeros([2, 3]), full_matrices=False)
    assert np.any(tf.matmul(u[:, :1], v[:, :1], transpose_b=True).numpy() != 0)
    start = np.arange(1.0, 1.0 + np.prod(shape)).reshape(shape)
    var = tf.Variable(start, dtype=tf.float32)
    run(cg(0.5, 1.0, "nuclear"), [var], [tf.zeros(shape)])
    np.testing.assert_array_equal(var.numpy(), 0.5 * start)


def test_conditional_gradient_epsilon_zero_is_zero():
    """TF Addons' ``epsilon or backend.epsilon()`` makes 0 into 1e-7; here 0 is 0:
    a gradient of norm 5e-7 steps by its unit direction, ``[0.6, 0.8]``."""
    var = tf.Variable([0.0, 0.0])
    run(cg(0.5, 1.0, epsilon=0.0), [var], [tf.constant([3e-7, 4e-7])])
    np.testing.assert_allclose(var.numpy(), [-0.3, -0.4], rtol=1e-6)
