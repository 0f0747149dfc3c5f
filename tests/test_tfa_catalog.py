"""TF Addons' AdaBelief, RectifiedAdam, NovoGrad, Yogi, LAMB and LazyAdam as gradpipe
rules, proven with TF Addons' own tests.

TF Addons (tensorflow/addons, last commit d208d752) does not import on TF 2.21, so its
tests are ported: the same variables, gradients, hyperparameters, step counts, golden
values and tolerances, against the gradpipe TOML of each class (``TOML`` below). TFA's
numpy references are rewritten here in float64, from the dtype's own starting values
and gradients; for AdaBelief, RectifiedAdam and NovoGrad, whose tests hold golden
values only, a numpy rewrite of TFA's update (its order of operations) is added.

Ported, from ``tensorflow_addons/optimizers/tests/``:

* ``adabelief_test.py``: ``test_dense_sample``, ``test_sparse_sample``,
  ``*_with_weight_decay``, ``*_with_warmup``, ``*_with_lookahead``, ``test_schedulers``;
  ``*_with_amsgrad`` and ``*_with_rectify`` as differences.
* ``rectified_adam_test.py``: ``test_dense_sample``, ``test_sparse_sample``,
  ``test_dense_sample_with_weight_decay``, ``*_with_warmup``, ``*_with_lookahead``,
  ``test_schedulers``; ``*_with_amsgrad`` (equal to the plain goldens on these inputs)
  and ``test_sparse_sample_with_weight_decay`` as differences.
* ``novograd_test.py``: ``test_dense_sample``, ``test_dense_sample_with_weight_decay``,
  ``test_sparse_sample`` (float32, float64); ``*_with_grad_averaging`` and
  ``test_sparse_sample_with_weight_decay`` as differences.
* ``yogi_test.py``: ``test_basic``, ``test_sparse`` (``beta1 = 0``; float16, float32,
  float64), ``test_sparse_repeated_indices``; ``test_basic_momentum`` (TFA's first
  moment starts at 0, gradpipe's at ``initial_accumulator_value``) as a difference.
  Not ported: the ``l1``/``l2`` and ``tanh`` variants (no gradpipe key).
* ``lamb_test.py``: ``test_sparse``, ``test_tensor_learning_rate``, ``test_sharing``,
  ``test_resource`` (one case: the same maths), ``test_basic_with_learning_rate_inverse_
  time_decay``; ``test_basic_with_learning_rate_decay`` (``weight_decay``) as a
  difference.
* ``lazy_adam_test.py``: ``test_sparse``, ``test_basic``, ``test_tensor_learning_rate``,
  ``test_sharing`` (one case), ``test_sparse_repeated_indices``; beyond TFA, a row
  touched, left, and touched again.

Tolerances: TFA's own (``atol = 2e-4`` for the goldens of ``run_dense_sample`` /
``run_sparse_sample``; ``assert_allclose_according_to_type``: rtol = atol = 1e-3 for
float16, 1e-6 for float32 and float64). Against the numpy rewrites of AdaBelief and
RectifiedAdam, 100 to 200 float32 steps: ``atol = 2e-5`` (measured: at most 9e-6).

The pipelines run with ``[pipeline] check_updates = false`` (its probes cost a second
per rule and dtype): that check only skips a step whose updates are not finite, and
every step here is finite. The long runs (100-200 steps) are traced once.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import attrs
import numpy as np
import pytest
import tensorflow as tf
import tomllib

import gradpipe
from conftest import assert_close

# -- the gradpipe TOML of each TFA class, at TFA's defaults ----------------------------

TOML = {
    "AdaBelief": """
[[transforms]]              # tfa.optimizers.AdaBelief(rectify=False)
kind = "adabelief"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-14             # TFA adds its one epsilon under the root and outside it
epsilon_root = 1e-14
weight_decay = 0.0          # TFA: lr * (step + weight_decay * w), as here
""",
    "RectifiedAdam": """
[[transforms]]              # tfa.optimizers.RectifiedAdam()
kind = "radam"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-7
threshold = 5.0             # sma_threshold
""",
    "NovoGrad": """
[[transforms]]              # tfa.optimizers.NovoGrad()
kind = "novograd"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-7
weight_decay = 0.0          # inside the momentum, as TFA's
""",
    "Yogi": """
[[transforms]]              # tfa.optimizers.Yogi() (both moments start at 1e-6 here)
kind = "yogi"
learning_rate = 0.01
beta_1 = 0.9                # TFA: beta1
beta_2 = 0.999              # TFA: beta2
epsilon = 0.001
initial_accumulator_value = 1e-6
""",
    "LAMB": """
[[transforms]]              # tfa.optimizers.LAMB() (weight_decay = 0)
kind = "lamb"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-6
""",
    "LazyAdam": """
[[transforms]]              # tfa.optimizers.LazyAdam()
kind = "adam"
learning_rate = 0.001
beta_1 = 0.9
beta_2 = 0.999
epsilon = 1e-7
lazy = true
""",
}

# Where TFA's default differs from gradpipe's: key -> (TFA's, gradpipe's).
DEFAULT_DIFFERENCES = {
    "AdaBelief": {"epsilon": (1e-14, 1e-16), "epsilon_root": (1e-14, 1e-16)},
    "RectifiedAdam": {"epsilon": (1e-7, 1e-8)},
    "NovoGrad": {"beta_2": (0.999, 0.25), "epsilon": (1e-7, 1e-6)},
    "Yogi": {"learning_rate": (0.01, 0.001)},
    "LAMB": {"epsilon": (1e-6, 1e-7)},
    "LazyAdam": {"lazy": (True, False)},
}

# Each TFA constructor argument (``name`` and the legacy ``**kwargs`` left out): the
# (transform, key) that expresses it, or None where gradpipe cannot.
ARGUMENTS: dict[str, dict[str, tuple[str, str] | None]] = {
    "AdaBelief": {"learning_rate": ("adabelief", "learning_rate"),
                  "beta_1": ("adabelief", "beta_1"), "beta_2": ("adabelief", "beta_2"),
                  "epsilon": ("adabelief", "epsilon"),  # and epsilon_root, the same value
                  "weight_decay": ("adabelief", "weight_decay"), "amsgrad": None,
                  "rectify": None, "sma_threshold": None,
                  # total_steps > 0: a schedule (tfa_warmup), for whole W = total * proportion
                  "total_steps": ("adabelief", "learning_rate"),
                  "warmup_proportion": ("adabelief", "learning_rate"),
                  "min_lr": ("adabelief", "learning_rate")},
    "RectifiedAdam": {"learning_rate": ("radam", "learning_rate"),
                      "beta_1": ("radam", "beta_1"), "beta_2": ("radam", "beta_2"),
                      "epsilon": ("radam", "epsilon"),
                      "weight_decay": ("weight_decay", "weight_decay"), "amsgrad": None,
                      "sma_threshold": ("radam", "threshold"),
                      "total_steps": ("radam", "learning_rate"),
                      "warmup_proportion": ("radam", "learning_rate"),
                      "min_lr": ("radam", "learning_rate")},
    "NovoGrad": {"learning_rate": ("novograd", "learning_rate"),
                 "beta_1": ("novograd", "beta_1"), "beta_2": ("novograd", "beta_2"),
                 "epsilon": ("novograd", "epsilon"),
                 "weight_decay": ("novograd", "weight_decay"),
                 "grad_averaging": None, "amsgrad": None},
    "Yogi": {"learning_rate": ("yogi", "learning_rate"), "beta1": ("yogi", "beta_1"),
             "beta2": ("yogi", "beta_2"), "epsilon": ("yogi", "epsilon"),
             "l1_regularization_strength": None, "l2_regularization_strength": None,
             "initial_accumulator_value": ("yogi", "initial_accumulator_value"),
             "activation": None},
    "LAMB": {"learning_rate": ("lamb", "learning_rate"), "beta_1": ("lamb", "beta_1"),
             "beta_2": ("lamb", "beta_2"), "epsilon": ("lamb", "epsilon"),
             "weight_decay": None, "exclude_from_weight_decay": None,
             "exclude_from_layer_adaptation": None},
    "LazyAdam": {"learning_rate": ("adam", "learning_rate"), "beta_1": ("adam", "beta_1"),
                 "beta_2": ("adam", "beta_2"), "epsilon": ("adam", "epsilon"),
                 "amsgrad": ("adam", "amsgrad")},  # TFA: False only
}


def chain(name: str, *extra: dict, **keys) -> list[dict]:
    """The transforms of ``TOML[name]``, ``keys`` set on its rule, ``extra`` after it."""
    transforms = tomllib.loads(TOML[name])["transforms"]
    return [{**transforms[0], **keys}, *extra]


@pytest.mark.parametrize("name", sorted(TOML))
def test_toml_is_tfas_defaults(name):
    """Each TOML builds; its keys differ from gradpipe's defaults exactly where
    ``DEFAULT_DIFFERENCES`` says; every key ``ARGUMENTS`` names exists."""
    table = chain(name)[0]
    config = gradpipe.parse({"transforms": [{"kind": table["kind"]}]}).transforms[0].config
    differing = {key: (value, getattr(config, key)) for key, value in table.items()
                 if key != "kind" and getattr(config, key) != value}
    assert differing == DEFAULT_DIFFERENCES[name]
    gradpipe.build({"transforms": chain(name)})
    for target in filter(None, ARGUMENTS[name].values()):
        kind, key = target
        table = {"kind": kind, "weight_decay": 0.1} if kind == "weight_decay" else {"kind": kind}
        config = gradpipe.parse({"transforms": [{"kind": "sgd"}, table]}).transforms[1].config
        assert key in {f.name for f in attrs.fields(type(config))}, (name, key)


# -- TFA's test inputs ---------------------------------------------------------------

class Sample(NamedTuple):
    """Starting values and the gradient of each variable (the same every step);
    ``rows``: the rows a sparse gradient holds (None: dense)."""

    values: list
    grads: list
    rows: list | None = None

    def tensors(self, dtype=tf.float32) -> list:
        if self.rows is None:
            return [tf.constant(np.asarray(g, dtype.as_numpy_dtype)) for g in self.grads]
        return [tf.IndexedSlices(tf.constant(np.asarray(g, dtype.as_numpy_dtype)[r]),
                                 tf.constant(r), tf.constant([len(g)]))
                for g, r in zip(self.grads, self.rows)]

    def touched(self) -> list | None:
        if self.rows is None:
            return None
        return [np.isin(np.arange(len(g)), r) for g, r in zip(self.grads, self.rows)]


# adabelief_test.py / rectified_adam_test.py run_dense_sample, run_sparse_sample
DENSE = Sample([[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.2], [0.03, 0.04]])
SPARSE = Sample([[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.0], [0.0, 0.04]], [[0], [1]])
# novograd_test.py
NOVO_DENSE = Sample([[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.2], [0.3, 0.4]])
NOVO_SPARSE = Sample([[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.0], [0.0, 0.4]], [[0], [1]])
# yogi_test.py, lamb_test.py, lazy_adam_test.py do_test_basic / test_basic
BASIC = Sample([[1.0, 2.0], [3.0, 4.0]], [[0.1, 0.1], [0.01, 0.01]])
YOGI_SPARSE = BASIC._replace(rows=[[0, 1], [0, 1]])
# lamb_test.py / lazy_adam_test.py test_sparse
SPARSE3 = Sample([[1.0, 1.0, 2.0], [3.0, 3.0, 4.0]], [[0.1, 0.0, 0.1], [0.01, 0.0, 0.01]],
                 [[0, 2], [0, 2]])

DTYPES = [tf.float16, tf.float32, tf.float64]
# TFA's test_utils.assert_allclose_according_to_type
BY_TYPE = {tf.float16: {"rtol": 1e-3, "atol": 1e-3}, tf.float32: {"rtol": 1e-6, "atol": 1e-6},
           tf.float64: {"rtol": 1e-6, "atol": 1e-6}}
GOLDEN = {"rtol": 0.0, "atol": 2e-4}  # TFA's run_dense_sample / run_sparse_sample
REWRITE = {"rtol": 0.0, "atol": 2e-5}  # 100-200 float32 steps against float64


def build(transforms: list[dict]) -> gradpipe.Pipeline:
    """The pipeline of ``transforms``; ``check_updates`` off (see the module's doc)."""
    return gradpipe.build({"pipeline": {"check_updates": False}, "transforms": transforms})


def run(transforms: list[dict], sample: Sample, steps: int, dtype=tf.float32,
        long: bool = False) -> list[np.ndarray]:
    """The variables after ``steps`` applications of the sample's gradients; ``long``:
    in one traced step."""
    variables = [tf.Variable(np.asarray(v, dtype.as_numpy_dtype)) for v in sample.values]
    grads = sample.tensors(dtype)
    pipe = build(transforms)

    def step():
        pipe.apply_gradients(zip(grads, variables))

    if long:
        step = tf.function(step)
    for _ in range(steps):
        step()
    return [v.numpy() for v in variables]


def reference(update, sample: Sample, steps: int, dtype=tf.float32,
              fills: tuple = (0.0, 0.0), **hyper) -> list[np.ndarray]:
    """TFA's update ``update(w, g, t, *slots, **hyper)`` for t = 1..steps, per variable,
    in float64 from the dtype's values, its slots starting at ``fills``; a callable
    hyperparameter is called with t."""
    out = []
    touched = sample.touched()
    for i, (w, g) in enumerate(zip(sample.values, sample.grads)):
        w, g = (np.asarray(x, dtype.as_numpy_dtype).astype(np.float64) for x in (w, g))
        state = [np.full_like(w, fill) for fill in fills]
        for t in range(1, steps + 1):
            kw = {k: v(t) if callable(v) else v for k, v in hyper.items()}
            if touched is not None:
                kw["touched"] = touched[i]
            w, *state = update(w, g, t, *state, **kw)
        out.append(w)
    return out


# -- numpy rewrites of TFA's updates ------------------------------------------------
# t counts from 1 (TFA's local_step). ``touched``: the rows of a sparse gradient; TFA's
# sparse AdaBelief and RectifiedAdam decay both moments on every row and move only those.

def rectifier(t: int, beta_2: float) -> float | None:
    """RAdam's ``r_t``, None while ``sma_t`` < 5 (TFA's sma_threshold)."""
    sma_inf = 2.0 / (1.0 - beta_2) - 1.0
    sma = sma_inf - 2.0 * t * beta_2**t / (1.0 - beta_2**t)
    if sma < 5.0:
        return None
    return float(np.sqrt((sma - 4.0) * (sma - 2.0) * sma_inf
                         / ((sma_inf - 4.0) * (sma_inf - 2.0) * sma)))


def adabelief_tfa(w, g, t, m, s, s_max, *, lr=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-14,
                  weight_decay=0.0, rectify=False, amsgrad=False, touched=None):
    rows = np.ones(w.shape, bool) if touched is None else touched
    m = beta_1 * m + (1.0 - beta_1) * g
    s = beta_2 * s + np.where(rows, (1.0 - beta_2) * (g - m) ** 2 + epsilon, 0.0)
    s_max = np.maximum(s_max, s)
    root = np.sqrt((s_max if amsgrad else s) / (1.0 - beta_2**t))
    m_hat = m / (1.0 - beta_1**t)
    r = rectifier(t, beta_2) if rectify else 1.0
    step = m_hat if r is None else r * m_hat / (root + epsilon)
    step = step + weight_decay * w
    return np.where(rows, w - lr * step, w), m, s, s_max


def radam_tfa(w, g, t, m, v, *, lr=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
              weight_decay=0.0, touched=None):
    rows = np.ones(w.shape, bool) if touched is None else touched
    m = beta_1 * m + (1.0 - beta_1) * g
    v = beta_2 * v + (1.0 - beta_2) * g * g
    m_hat = m / (1.0 - beta_1**t)
    r = rectifier(t, beta_2)
    step = m_hat if r is None else r * m_hat / (np.sqrt(v / (1.0 - beta_2**t)) + epsilon)
    return np.where(rows, w - lr * (step + weight_decay * w), w), m, v


def novograd_tfa(w, g, t, m, v, *, lr, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 weight_decay=0.0, grad_averaging=False, touched=None):
    """TFA's NovoGrad: ``v`` one number per variable (the norm of the first gradient,
    squared, on step 1); Keras momentum ``m = beta_1 m - lr u``, ``w += m``."""
    rows = np.ones(w.shape, bool) if touched is None else touched
    norm2 = float(np.sum(np.where(rows, g, 0.0) ** 2))
    v = np.full_like(w, norm2 if t == 1 else beta_2 * v[0] + (1.0 - beta_2) * norm2)
    u = g / (np.sqrt(v) + epsilon) + weight_decay * w
    if grad_averaging and t > 1:
        u = u * (1.0 - beta_1)
    m = np.where(rows, beta_1 * m - lr * u, m)
    return np.where(rows, w + m, w), m, v


def yogi_tfa(w, g, t, m, v, *, lr=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-3):
    """yogi_test.py's reference (no l1/l2): the bias correction folded into the rate,
    epsilon added to the uncorrected root."""
    rate = lr * np.sqrt(1.0 - beta_2**t) / (1.0 - beta_1**t)
    m = beta_1 * m + (1.0 - beta_1) * g
    v = v + (1.0 - beta_2) * np.sign(g * g - v) * g * g
    return w - rate * m / (np.sqrt(v) + epsilon), m, v


def lamb_tfa(w, g, t, m, v, *, lr=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
             weight_decay=0.0):
    """lamb_test.py's reference: the decay joins the direction before the trust ratio."""
    m = beta_1 * m + (1.0 - beta_1) * g
    v = beta_2 * v + (1.0 - beta_2) * g * g
    u = (m / (1.0 - beta_1**t)) / (np.sqrt(v / (1.0 - beta_2**t)) + epsilon) + weight_decay * w
    w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
    ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
    return w - ratio * lr * u, m, v


def lazy_adam_tfa(w, g, t, m, v, *, lr=1e-3, beta_1=0.9, beta_2=0.999, epsilon=1e-7,
                  touched=None):
    """lazy_adam_test.py's Adam reference; with ``touched``, LazyAdam's sparse step:
    the other rows' moments and values stay."""
    rows = np.ones(w.shape, bool) if touched is None else touched
    rate = lr * np.sqrt(1.0 - beta_2**t) / (1.0 - beta_1**t)
    m_new = beta_1 * m + (1.0 - beta_1) * g
    v_new = beta_2 * v + (1.0 - beta_2) * g * g
    w_new = w - rate * m_new / (np.sqrt(v_new) + epsilon)
    return (np.where(rows, w_new, w), np.where(rows, m_new, m), np.where(rows, v_new, v))


# -- schedules: TFA's arguments as gradpipe schedules ---------------------------------

def tfa_warmup(lr: float, total_steps: int, warmup_proportion: float, min_lr: float) -> dict:
    """TFA's ``total_steps`` warm-up: ``lr t / W`` up to ``t = W = total_steps *
    warmup_proportion`` (t from 1), then linear to ``min_lr`` over ``total_steps - W``
    steps. gradpipe's step s is t - 1; W must be a whole number, at least 2."""
    warm = total_steps * warmup_proportion
    assert warm == int(warm) >= 2
    return {"kind": "warmup", "warmup_steps": int(warm) - 1, "init_value": lr / warm,
            "after": {"kind": "linear", "start": lr, "end": min_lr,
                      "steps": total_steps - int(warm)}}


def tfa_warmup_rate(lr, total_steps, warmup_proportion, min_lr):
    """The same, as TFA computes it at step t."""
    warm = total_steps * warmup_proportion
    decay = max(total_steps - warm, 1)
    return lambda t: (lr * t / warm if t <= warm
                      else lr + (min_lr - lr) * min(t - warm, decay) / decay)


# test_schedulers: ExponentialDecay(1e-3, 50, 0.5), InverseTimeDecay(2e-3, 25, 0.25),
# both called at TFA's iterations (t - 1), as gradpipe's at its step
EXPONENTIAL = {"kind": "ExponentialDecay", "initial_learning_rate": 1e-3,
               "decay_steps": 50, "decay_rate": 0.5}
INVERSE_TIME = {"kind": "InverseTimeDecay", "initial_learning_rate": 2e-3,
                "decay_steps": 25, "decay_rate": 0.25}


def exponential_rate(t):
    return 1e-3 * 0.5 ** ((t - 1) / 50)


def inverse_time_rate(t):
    return 2e-3 / (1 + 0.25 * (t - 1) / 25)


LOOKAHEAD = {"kind": "lookahead", "sync_period": 6, "slow_step_size": 0.45}

# -- AdaBelief (rectify=False) and RectifiedAdam: golden values and the rewrite -------

# case: (sample, steps, chain keys, extra tables, rewrite's hyper (None: golden only), golden)
ADABELIEF = {
    "dense_sample": (DENSE, 100, {}, [], {}, [[0.66723955, 1.6672393], [2.6672382, 3.6672382]]),
    "sparse_sample": (SPARSE, 200, {"lazy": True}, [], {},
                      [[0.0538936, 2.0], [3.0, 3.0538926]]),
    "dense_sample_with_weight_decay": (
        DENSE, 100, {"weight_decay": 0.01}, [], {"weight_decay": 0.01},
        [[0.66637343, 1.6653734], [2.6643748, 3.6633751]]),
    # lazy: only the touched rows decay, as TFA's
    "sparse_sample_with_weight_decay": (
        SPARSE, 200, {"weight_decay": 0.01, "lazy": True}, [], {"weight_decay": 0.01},
        [[0.05264655, 2.0], [3.0, 3.0466535]]),
    "dense_sample_with_warmup": (
        DENSE, 100, {"learning_rate": tfa_warmup(1e-3, 100, 0.1, 1e-5)}, [],
        {"lr": tfa_warmup_rate(1e-3, 100, 0.1, 1e-5)},
        [[0.85635465, 1.8563547], [2.8563545, 3.8563545]]),
    "sparse_sample_with_warmup": (
        SPARSE, 200, {"learning_rate": tfa_warmup(1e-3, 100, 0.1, 1e-5), "lazy": True}, [],
        {"lr": tfa_warmup_rate(1e-3, 100, 0.1, 1e-5)}, [[0.8502214, 2.0], [3.0, 3.85022]]),
    "schedulers": (
        DENSE, 100, {"learning_rate": EXPONENTIAL, "weight_decay": INVERSE_TIME}, [],
        {"lr": exponential_rate, "weight_decay": inverse_time_rate},
        [[0.84216374, 1.8420818], [2.8420012, 3.841918]]),
    "dense_sample_with_lookahead": (DENSE, 100, {"beta_1": 0.95}, [LOOKAHEAD], None,
                                    [[0.88910455, 1.889104], [2.8891046, 3.8891046]]),
    "sparse_sample_with_lookahead": (SPARSE, 150, {"beta_1": 0.95, "lazy": True}, [LOOKAHEAD],
                                     None, [[0.8114481, 2.0], [3.0, 3.8114486]]),
}


def decay(weight_decay, learning_rate=1e-3) -> dict:
    """TFA RectifiedAdam's ``lr * weight_decay * w``: the ``weight_decay`` transform."""
    return {"kind": "weight_decay", "weight_decay": weight_decay, "learning_rate": learning_rate}


RADAM = {
    "dense_sample": (DENSE, 100, {}, [], {}, [[0.985769, 1.985269], [2.986119, 3.986068]]),
    "sparse_sample": (SPARSE, 200, {"lazy": True}, [], {}, [[0.959333, 2.0], [3.0, 3.959632]]),
    "dense_sample_with_weight_decay": (DENSE, 100, {}, [decay(0.01)], {"weight_decay": 0.01},
                                       [[0.984775, 1.983276], [2.983125, 3.982076]]),
    "dense_sample_with_warmup": (
        DENSE, 100, {"learning_rate": tfa_warmup(1e-3, 100, 0.1, 1e-5)}, [],
        {"lr": tfa_warmup_rate(1e-3, 100, 0.1, 1e-5)},
        [[0.994062, 1.993912], [2.994167, 3.994152]]),
    "sparse_sample_with_warmup": (
        SPARSE, 200, {"learning_rate": tfa_warmup(1e-3, 200, 0.1, 1e-5), "lazy": True}, [],
        {"lr": tfa_warmup_rate(1e-3, 200, 0.1, 1e-5)}, [[0.982629, 2.0], [3.0, 3.982674]]),
    "schedulers": (DENSE, 100, {"learning_rate": EXPONENTIAL},
                   [decay(INVERSE_TIME, EXPONENTIAL)],
                   {"lr": exponential_rate, "weight_decay": inverse_time_rate},
                   [[0.993192, 1.992625], [2.993369, 3.993239]]),
    "dense_sample_with_lookahead": (DENSE, 100, {"beta_1": 0.95}, [LOOKAHEAD], None,
                                    [[0.993126, 1.992901], [2.993283, 3.993261]]),
    "sparse_sample_with_lookahead": (SPARSE, 150, {"beta_1": 0.95, "lazy": True}, [LOOKAHEAD],
                                     None, [[0.988156, 2.0], [3.0, 3.988291]]),
}
THREE = (0.0, 0.0, 0.0)  # AdaBelief's m, s and the maximum of s
GOLDEN_CASES: dict[str, tuple[dict, Any, tuple]] = {"AdaBelief": (ADABELIEF, adabelief_tfa, THREE),
                "RectifiedAdam": (RADAM, radam_tfa, (0.0, 0.0))}


@functools.cache
def trajectory(name: str, case: str) -> tuple:
    sample, steps, keys, extra, _, _ = GOLDEN_CASES[name][0][case]
    return tuple(run(chain(name, *extra, **keys), sample, steps, long=True))


@pytest.mark.parametrize("name, case", [(n, c) for n, (cases, _, _) in GOLDEN_CASES.items()
                                        for c in cases])
def test_matches_tfa_goldens(name, case):
    """TFA's golden values (atol 2e-4), and the numpy rewrite of TFA's update with the
    same arguments (atol 2e-5), over TFA's steps."""
    cases, update, fills = GOLDEN_CASES[name]
    sample, steps, _, _, hyper, golden = cases[case]
    after = trajectory(name, case)
    assert_close(after, golden, **GOLDEN)
    if hyper is not None:
        expected = reference(update, sample, steps, fills=fills, **hyper)
        assert_close(expected, golden, **GOLDEN)
        assert_close(after, expected, **REWRITE)


def test_adabelief_rectify_and_amsgrad_are_not_expressible():
    """TFA's default ``rectify=True`` (``test_sparse_sample_with_rectify``; the test named
    ``test_dense_sample_with_rectify`` runs the sparse sample too) and ``amsgrad=True``
    (whose test says it has no effect: it has, the belief ``(g - m)^2`` shrinks). The
    rewrite reproduces TFA's goldens; gradpipe's ``adabelief`` is 0.730 and 5.3e-3 away."""
    rectified = [[0.7836679, 2.0], [3.0, 3.7839665]]
    assert_close(reference(adabelief_tfa, SPARSE, 200, fills=THREE, rectify=True),
                 rectified, **GOLDEN)
    assert np.abs(np.subtract(trajectory("AdaBelief", "sparse_sample"), rectified)).max() \
        == pytest.approx(0.730, abs=1e-3)
    for case, sample, steps, golden in [
            ("dense_sample", DENSE, 100, [[0.67249274, 1.6724932], [2.6724923, 3.6724923]]),
            ("sparse_sample", SPARSE, 200, [[0.09575394, 2.0], [3.0, 3.0957537]])]:
        assert_close(reference(adabelief_tfa, sample, steps, fills=THREE, amsgrad=True),
                     golden, **GOLDEN)
        gap = np.abs(np.subtract(trajectory("AdaBelief", case), golden)).max()
        assert gap == pytest.approx({"dense_sample": 5.25e-3, "sparse_sample": 4.19e-2}[case],
                                    rel=0.02)


def test_radam_differences():
    """``amsgrad=True``: TFA's goldens are its plain ones (the second moment only grows
    under a fixed gradient), so plain ``radam`` meets them; it has no ``amsgrad`` key.
    ``test_sparse_sample_with_weight_decay``: TFA decays only the touched rows; the
    ``weight_decay`` transform decays all (2.0 and 3.0 become 1.99600 and 2.99399)."""
    for case in ("dense_sample", "sparse_sample"):
        assert_close(trajectory("RectifiedAdam", case), RADAM[case][-1], **GOLDEN)
    after = run(chain("RectifiedAdam", decay(0.01), lazy=True), SPARSE, 200, long=True)
    golden = [[0.957368, 2.0], [3.0, 3.951673]]
    assert_close([after[0][0], after[1][1]], [golden[0][0], golden[1][1]], **GOLDEN)
    assert_close([after[0][1], after[1][0]], [2.0 * (1 - 1e-5) ** 200, 3.0 * (1 - 1e-5) ** 200],
                 **REWRITE)


@pytest.mark.parametrize("name", ["AdaBelief", "RectifiedAdam"])
def test_sparse_rows_left_out(name):
    """Beyond TFA's tests: TFA's sparse step decays every row's moments but moves only
    the touched rows. Row 0 touched at every step (gradient 0.1), row 1 at steps 1 and
    11 only (0.2): ``lazy = true`` keeps row 1's moments, so its 11th step differs from TFA's
    by 2.3e-4 (AdaBelief), 1.0e-5 (RectifiedAdam); ``lazy = false`` moves row 1 every
    step: 3.5e-3 and 2.7e-4 away."""
    update, fills = GOLDEN_CASES[name][1:]
    grad = np.array([0.1, 0.2])

    def rows(t):  # row 0 twice, 0.1 + 0: one gradient shape, one trace
        return [0, 1] if t in (1, 11) else [0, 0]

    w, state = np.array([1.0, 2.0]), [np.full(2, f) for f in fills]
    for t in range(1, 12):
        touched = np.isin([0, 1], rows(t))
        w, *state = update(w, np.where(touched, grad, 0.0), t, *state, touched=touched)
    gaps = {}
    for lazy in (True, False):
        var = tf.Variable([1.0, 2.0])
        pipe = build(chain(name, lazy=lazy))
        for t in range(1, 12):
            values = grad if t in (1, 11) else [0.1, 0.0]
            pipe.apply_gradients([(tf.IndexedSlices(tf.constant(values, tf.float32),
                                                    tf.constant(rows(t)), tf.constant([2])),
                                   var)])
        assert var.numpy()[0] == pytest.approx(w[0], abs=1e-6)
        gaps[lazy] = abs(var.numpy()[1] - w[1])
    expected = {"AdaBelief": (2.35e-4, 3.49e-3), "RectifiedAdam": (9.9e-6, 2.73e-4)}[name]
    assert gaps[True] == pytest.approx(expected[0], rel=0.05)
    assert gaps[False] == pytest.approx(expected[1], rel=0.05)


# -- NovoGrad --------------------------------------------------------------------------

NOVOGRAD = {"learning_rate": 0.1, "epsilon": 1e-8}  # NovoGrad(lr=0.1, epsilon=1e-8)
NOVOGRAD_CASES: dict[str, tuple[Any, ...]] = {
    "dense_sample": (NOVO_DENSE, 1, {}, [[0.9552786425, 1.9105572849],
                                         [2.9400000012, 3.9200000016]]),
    "dense_sample_with_weight_decay": (NOVO_DENSE, 1, {"weight_decay": 0.1},
                                       [[0.945278642, 1.8905572849],
                                        [2.9100000012, 3.8800000016]]),
    "sparse_sample": (NOVO_SPARSE, 2, {}, [[0.71, 2.0], [3.0, 3.71]]),
}


@pytest.mark.parametrize("dtype", [tf.float32, tf.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", sorted(NOVOGRAD_CASES))
def test_novograd_matches_tfa(case, dtype):
    """TFA's goldens (dense: atol 2e-4; sparse: numpy's default rtol 1e-7, as TFA), and
    the rewrite of TFA's update (rtol = atol = 1e-6)."""
    sample, steps, keys, golden = NOVOGRAD_CASES[case]
    after = run(chain("NovoGrad", **NOVOGRAD, **keys), sample, steps, dtype)
    assert_close(after, golden, **(GOLDEN if sample.rows is None else {"rtol": 1e-7, "atol": 0}))
    expected = reference(novograd_tfa, sample, steps, dtype, lr=0.1, **keys)
    assert_close(after, expected, **BY_TYPE[dtype])


def test_novograd_differences():
    """Not expressible: ``grad_averaging`` (TFA's goldens 0.0805 and 0.0900 away), TFA's
    sparse weight decay of the touched rows only (gradpipe decays all: 0.0867 away), and
    TFA's learning rate inside the momentum (Keras momentum: ``m = b1 m - lr u``), where
    gradpipe (optax) scales the whole momentum by the current rate: the same for a
    constant rate; ExponentialDecay(0.1, 1, 0.5) over 5 steps of the dense sample:
    0.311 apart."""
    for sample, golden, gap in [
            (NOVO_DENSE, [[0.9105572849, 1.8211145698], [2.8800000024, 3.8400000032]], 0.0805),
            (NOVO_SPARSE, [[0.8, 2.0], [3.0, 3.8]], 0.0900)]:
        assert_close(reference(novograd_tfa, sample, 2, lr=0.1, grad_averaging=True), golden,
                     rtol=1e-7, atol=1e-7)
        after = run(chain("NovoGrad", **NOVOGRAD), sample, 2)
        assert np.abs(np.subtract(after, golden)).max() == pytest.approx(gap, rel=0.01)
    after = run(chain("NovoGrad", **NOVOGRAD, weight_decay=0.1), NOVO_SPARSE, 2)
    assert_close([after[0][0], after[1][1]], [0.6821, 3.5954], rtol=1e-6, atol=0)
    assert_close([after[0][1], after[1][0]], [1.9422, 2.9133], rtol=1e-6, atol=0)
    schedule = {"kind": "ExponentialDecay", "initial_learning_rate": 0.1, "decay_steps": 1,
                "decay_rate": 0.5}
    after = run(chain("NovoGrad", **{**NOVOGRAD, "learning_rate": schedule}), NOVO_DENSE, 5)
    expected = reference(novograd_tfa, NOVO_DENSE, 5, lr=lambda t: 0.1 * 0.5 ** (t - 1))
    assert np.abs(np.subtract(after, expected)).max() == pytest.approx(0.311, rel=0.01)


# -- Yogi, LAMB, LazyAdam: TFA's numpy references, step by step ---------------------

YOGI_BETA1_0 = {"beta_1": 0.0, "initial_accumulator_value": 1.0}  # Yogi(beta1=0.0, iav=1.0)
LAMB_INVERSE_TIME: dict[str, Any] = {"epsilon": 1e-7, "learning_rate": {
    "kind": "InverseTimeDecay", "initial_learning_rate": 0.001, "decay_steps": 1.0,
    "decay_rate": 0.5}}

# case: (TOML name, keys, sample, TFA's update, its arguments, its slots' start)
STEPWISE: dict[str, tuple[Any, ...]] = {
    "yogi/test_basic": ("Yogi", YOGI_BETA1_0, BASIC, yogi_tfa, {"beta_1": 0.0}, (0.0, 1.0)),
    "yogi/test_sparse": ("Yogi", YOGI_BETA1_0, YOGI_SPARSE, yogi_tfa, {"beta_1": 0.0}, (0.0, 1.0)),
    "lamb/test_sparse": ("LAMB", {}, SPARSE3, lamb_tfa, {}, (0.0, 0.0)),
    "lamb/test_tensor_learning_rate": ("LAMB", {}, BASIC, lamb_tfa, {}, (0.0, 0.0)),
    "lamb/test_basic_with_learning_rate_inverse_time_decay": (
        "LAMB", LAMB_INVERSE_TIME, BASIC, lamb_tfa,
        {"epsilon": 1e-7, "lr": lambda t: 0.001 / (1 + 0.5 * (t - 1))}, (0.0, 0.0)),
    "lazy_adam/test_sparse": ("LazyAdam", {}, SPARSE3, lazy_adam_tfa, {}, (0.0, 0.0)),
    "lazy_adam/test_basic": ("LazyAdam", {}, BASIC, lazy_adam_tfa, {}, (0.0, 0.0)),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("case", sorted(STEPWISE))
def test_matches_tfa_references(case, dtype):
    """Three steps, each compared with TFA's numpy reference at TFA's tolerance."""
    name, keys, sample, update, hyper, fills = STEPWISE[case]
    variables = [tf.Variable(np.asarray(v, dtype.as_numpy_dtype)) for v in sample.values]
    grads = sample.tensors(dtype)
    pipe = build(chain(name, **keys))
    for t in range(1, 4):
        pipe.apply_gradients(zip(grads, variables))
        # TFA's sparse LAMB and Yogi (every row touched here) step as their dense sums
        plain = sample if update is lazy_adam_tfa else sample._replace(rows=None)
        expected = reference(update, plain, t, dtype, fills, **hyper)
        assert_close([v.numpy() for v in variables], expected, **BY_TYPE[dtype])


@pytest.mark.parametrize("dtype", DTYPES, ids=["float16", "float32", "float64"])
@pytest.mark.parametrize("name", ["Yogi", "LazyAdam"])
def test_repeated_indices_are_summed(name, dtype):
    """``test_sparse_repeated_indices``: rows [1, 1] of 0.1 step as row 1 of 0.2 (TFA's
    base optimizer sums duplicates first; so does gradpipe), numpy's default rtol."""
    after = []
    for values, rows in (([0.1, 0.1], [1, 1]), ([0.2], [1])):
        var = tf.Variable(np.array([[1.0], [2.0]], dtype.as_numpy_dtype))
        grad = tf.IndexedSlices(tf.constant(np.array(values, dtype.as_numpy_dtype)[:, None]),
                                tf.constant(rows), tf.constant([2, 1]))
        pipe = build(chain(name))
        for _ in range(3):
            pipe.apply_gradients([(grad, var)])
        after.append(var.numpy())
    np.testing.assert_allclose(after[0], after[1], rtol=1e-7)


def test_lazy_adam_row_touched_again():
    """Beyond TFA's tests (whose untouched row has a zero gradient throughout): rows 0
    and 2 at step 1, row 0 at steps 2-4, rows 0-2 at step 5, row 1 never before: the
    rows left out keep their moments and values, as TFA's LazyAdam, to 1e-6."""
    pattern = [[0, 2], [0], [0], [0], [0, 1, 2]]
    grad = np.array([0.1, -0.3, 0.2])
    var = tf.Variable([1.0, 2.0, 3.0])
    pipe = build(chain("LazyAdam"))
    w, m, v = np.array([1.0, 2.0, 3.0]), np.zeros(3), np.zeros(3)
    for t, rows in enumerate(pattern, start=1):
        pipe.apply_gradients([(tf.IndexedSlices(tf.constant(grad[rows], tf.float32),
                                                tf.constant(rows), tf.constant([3])), var)])
        w, m, v = lazy_adam_tfa(w, grad, t, m, v, touched=np.isin([0, 1, 2], rows))
        assert_close(var.numpy(), w, rtol=1e-6, atol=1e-6)


def test_yogi_differences():
    """TFA's first moment starts at 0, gradpipe's (optax's) at ``initial_accumulator_
    value``; TFA adds epsilon to ``sqrt(v)`` before the bias correction (optax after:
    TFA's epsilon is optax's ``epsilon / sqrt(1 - b2^t)``, 0.0316 on step 1). First
    step on the basic sample (gradients 0.1 and 0.01), gradpipe's over TFA's:
    ``test_basic_momentum`` (beta1 0.9, iav 1.0): 91.1 and 901; ``Yogi()``'s defaults:
    1.289 and 1.897."""
    for keys, ratios in (({"initial_accumulator_value": 1.0}, (91.1, 901.0)),
                         ({}, (1.289, 1.897))):
        fill = keys.get("initial_accumulator_value", 1e-6)
        after = run(chain("Yogi", **keys), BASIC, 1)
        for w, g, moved, ratio in zip(BASIC.values, BASIC.grads, after, ratios):
            w, g = np.array(w), np.array(g)
            tfa, _, _ = yogi_tfa(w, g, 1, np.zeros(2), np.full(2, fill))
            np.testing.assert_allclose((w - moved) / (w - tfa), ratio, rtol=2e-3)


def test_lamb_weight_decay_is_not_expressible():
    """TFA's LAMB adds ``weight_decay * w`` to the direction before the trust ratio
    (``test_basic_with_learning_rate_decay``: decay=0.5, weight_decay=0.01, 3 steps).
    ``lamb`` alone is 3.7e-5 from it; ``lamb`` then the ``weight_decay`` transform,
    outside the ratio, 1.0e-4."""
    rate = LAMB_INVERSE_TIME["learning_rate"]
    expected = reference(lamb_tfa, BASIC, 3, epsilon=1e-7, weight_decay=0.01,
                         lr=lambda t: 0.001 / (1 + 0.5 * (t - 1)))
    for extra, gap in (([], 3.71e-5), ([decay(0.01, rate)], 1.02e-4)):
        after = run(chain("LAMB", *extra, **LAMB_INVERSE_TIME), BASIC, 3)
        assert np.abs(np.subtract(after, expected)).max() == pytest.approx(gap, rel=0.02)
