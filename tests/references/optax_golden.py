"""Write ``optax_golden.json``: twelve steps of each optax rule gradpipe follows,
run by optax itself, for ``tests/test_optax_rules.py`` to compare against.

    pip install optax jax    # not a test dependency: about 600 MB
    python tests/references/optax_golden.py

Each case is an optax alias with its keyword arguments, in optax's own names.
The problem: two parameters, ``a`` (3 values, the parabola of optax's
``alias_test.py``) and ``b`` (2 x 2, a quadratic of four curvatures), their
gradients computed from the current parameters at each step, so the whole
trajectory depends on the rule. The file records the optax and JAX versions,
and each alias's defaults. It also records, for docs/coming-from-optax.md, the
aliases that page writes as another rule or a chain (``mapped``: the optax call,
the gradpipe chain and its tolerance, optax's steps) and its schedules (optax's
value at each of the first 120 steps).
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax

STEPS = 12
A0, A_TARGET = [-1.0, 10.0, 1.0], [1.0, -1.0, 1.0]
B0, B_CURVATURE = [[0.5, -2.0], [3.0, 0.25]], [[1.0, 10.0], [0.1, 3.0]]

CASES = {
    "adabelief": ("adabelief", {"learning_rate": 0.1}),
    "adabelief_nesterov": ("adabelief", {"learning_rate": 0.1, "nesterov": True,
                                         "eps": 1e-8, "eps_root": 0.0}),
    "amsgrad": ("amsgrad", {"learning_rate": 0.1}),
    "amsgrad_paper": ("amsgrad", {"learning_rate": 0.1, "bias_correction_mu": False,
                                  "bias_correction_nu": False, "eps_root": 1e-8}),
    "yogi": ("yogi", {"learning_rate": 0.1}),
    "yogi_betas": ("yogi", {"learning_rate": 0.05, "b1": 0.5, "b2": 0.9, "eps": 1e-6}),
    "radam": ("radam", {"learning_rate": 0.1}),
    "radam_nesterov_threshold": ("radam", {"learning_rate": 0.1, "nesterov": True,
                                           "threshold": 4.5, "b2": 0.9}),
    "sign_sgd": ("sign_sgd", {"learning_rate": 0.1}),
    "signum": ("signum", {"learning_rate": 0.1}),
    "signum_beta": ("signum", {"learning_rate": 0.1, "beta": 0.5}),
    "nadamw": ("nadamw", {"learning_rate": 0.1}),
    "nadamw_masked": ("nadamw", {"learning_rate": 0.1, "weight_decay": 0.1,
                                 "mask": {"a": True, "b": False}}),
    "adamaxw": ("adamaxw", {"learning_rate": 0.1}),
    "adamaxw_decay": ("adamaxw", {"learning_rate": 0.1, "weight_decay": 0.1, "b2": 0.5}),
    "adan": ("adan", {"learning_rate": 0.1}),
    "adan_decay": ("adan", {"learning_rate": 0.1, "weight_decay": 0.1, "b3": 0.9,
                            "mask": {"a": False, "b": True}}),
    "optimistic_gradient_descent": ("optimistic_gradient_descent", {"learning_rate": 0.1}),
    "optimistic_gradient_descent_weights": ("optimistic_gradient_descent", {
        "learning_rate": 0.1, "alpha": 0.7, "beta": 0.1}),
    "fromage": ("fromage", {"learning_rate": 0.1}),
    "fromage_min_norm": ("fromage", {"learning_rate": 0.3, "min_norm": 0.5}),
    "novograd": ("novograd", {"learning_rate": 0.1}),
    "novograd_decay": ("novograd", {"learning_rate": 0.1, "weight_decay": 0.01, "b1": 0.5,
                                    "b2": 0.9}),
    "sm3": ("sm3", {"learning_rate": 0.1}),
    "sm3_momentum": ("sm3", {"learning_rate": 0.3, "momentum": 0.5}),
}

# optax aliases that gradpipe writes as another rule or a chain (docs/coming-from-optax.md):
# the optax call, the gradpipe chain that page gives for it, and the tolerance it holds to
# (rtol, atol; Keras's adam adds epsilon before the bias correction, optax after it, which
# tells where a gradient is near epsilon: adamw's decay alone, on an element at its minimum)
ADAM_EPS = (1e-5, 3e-7)
MAPPED = {
    "adam": ("adam", {"learning_rate": 0.1}, [{"kind": "adam", "learning_rate": 0.1,
                                               "epsilon": 1e-8}], ADAM_EPS),
    "adamw": ("adamw", {"learning_rate": 0.1, "weight_decay": 0.1}, [
        {"kind": "adamw", "learning_rate": 0.1, "epsilon": 1e-8, "weight_decay": 0.1}], ADAM_EPS),
    "adamw_at_a_minimum": ("adamw", {"learning_rate": 0.1}, [
        {"kind": "adamw", "learning_rate": 0.1, "epsilon": 1e-8, "weight_decay": 1e-4}],
        (1e-5, 3e-3)),
    # optax's adamw exactly: its epsilon after the bias correction, as nadamw's
    "adamw_exact_at_a_minimum": ("adamw", {"learning_rate": 0.1}, [
        {"kind": "nadamw", "learning_rate": 0.1, "nesterov": False}], (2e-6, 3e-7)),
    "adagrad": ("adagrad", {"learning_rate": 0.1}, [{"kind": "adagrad", "learning_rate": 0.1}],
                (2e-6, 3e-7)),
    "rmsprop": ("rmsprop", {"learning_rate": 0.01}, [
        {"kind": "rmsprop", "learning_rate": 0.01, "epsilon": 1e-8}], (2e-6, 3e-7)),
    "rmsprop_centered_momentum": ("rmsprop", {"learning_rate": 0.01, "centered": True,
                                              "momentum": 0.9}, [
        {"kind": "rmsprop", "learning_rate": 0.01, "epsilon": 1e-8, "centered": True,
         "momentum": 0.9}], (2e-6, 3e-7)),
    "adadelta_decay": ("adadelta", {"learning_rate": 1.0, "weight_decay": 0.1}, [
        {"kind": "l2", "l2": 0.1},
        {"kind": "adadelta", "learning_rate": 1.0, "rho": 0.9, "epsilon": 1e-6}], (2e-6, 3e-7)),
    "sgd_nesterov": ("sgd", {"learning_rate": 0.01, "momentum": 0.9, "nesterov": True}, [
        {"kind": "sgd", "learning_rate": 0.01, "momentum": 0.9, "nesterov": True}], (2e-6, 3e-7)),
    "lion": ("lion", {"learning_rate": 0.1}, [
        {"kind": "lion", "learning_rate": 0.1},
        {"kind": "weight_decay", "weight_decay": 1e-3, "learning_rate": 0.1}], (2e-6, 3e-7)),
    "lion_decay": ("lion", {"learning_rate": 0.03, "weight_decay": 0.5, "b1": 0.5}, [
        {"kind": "lion", "learning_rate": 0.03, "beta_1": 0.5},
        {"kind": "weight_decay", "weight_decay": 0.5, "learning_rate": 0.03}], (2e-6, 3e-7)),
    "nadam": ("nadam", {"learning_rate": 0.1}, [
        {"kind": "nadamw", "learning_rate": 0.1, "weight_decay": 0.0}], (2e-6, 3e-7)),
    "adamax": ("adamax", {"learning_rate": 0.1}, [
        {"kind": "adamaxw", "learning_rate": 0.1, "weight_decay": 0.0}], (2e-6, 3e-7)),
    "lamb": ("lamb", {"learning_rate": 0.1}, [
        {"kind": "lamb", "learning_rate": 0.1, "epsilon": 1e-6}], (2e-6, 3e-7)),
    "lars_decay_nesterov": ("lars", {"learning_rate": 0.1, "weight_decay": 0.1,
                                     "nesterov": True}, [
        {"kind": "lars", "learning_rate": 0.1, "weight_decay": 0.1, "nesterov": True}],
        (2e-6, 3e-7)),
    "optimistic_adam_v2": ("optimistic_adam_v2", {"learning_rate": 0.1, "alpha": 0.7,
                                                  "beta": 0.1}, [
        {"kind": "nadamw", "learning_rate": 1.0, "weight_decay": 0.0},
        {"kind": "optimistic_gradient_descent", "learning_rate": 0.1, "alpha": 0.7,
         "beta": 0.1}], ADAM_EPS),
}

# optax schedules as that page writes them: the call it shows, optax's function and
# arguments, and the gradpipe schedule table
SCHEDULES = {
    "linear_schedule(0.1, 0.01, 50, transition_begin=20)": (
        "linear_schedule", [0.1, 0.01, 50], {"transition_begin": 20},
        {"kind": "linear", "start": 0.1, "end": 0.01, "steps": 50, "begin": 20}),
    "polynomial_schedule(0.1, 0.01, 2.0, 50, transition_begin=20)": (
        "polynomial_schedule", [0.1, 0.01, 2.0, 50], {"transition_begin": 20},
        {"kind": "poly_decay", "learning_rate": 0.1, "min_lr": 0.01, "power": 2.0,
         "decay_steps": 50, "begin_decay_at": 20}),
    "cosine_decay_schedule(0.1, 60, 0.1)": (
        "cosine_decay_schedule", [0.1, 60, 0.1], {},
        {"kind": "CosineDecay", "initial_learning_rate": 0.1, "decay_steps": 60, "alpha": 0.1}),
    "warmup_cosine_decay_schedule(0.0, 0.1, 10, 80, end_value=0.001)": (
        "warmup_cosine_decay_schedule", [0.0, 0.1, 10, 80], {"end_value": 0.001},
        {"kind": "cosine", "learning_rate": 0.1, "warmup_steps": 10, "decay_steps": 70,
         "warmup_init": 0.0, "min_lr": 0.001}),
    "exponential_decay(0.1, 10, 0.5, 5, staircase=True, end_value=0.01)": (
        "exponential_decay", [0.1, 10, 0.5, 5], {"staircase": True, "end_value": 0.01},
        {"kind": "exp_decay", "learning_rate": 0.1, "decay_steps": 10, "decay_rate": 0.5,
         "begin_decay_at": 5, "use_staircase_decay": True, "min_lr": 0.01}),
    "piecewise_constant_schedule(0.1, {20: 0.5, 40: 0.1})": (
        "piecewise_constant_schedule", [0.1, {20: 0.5, 40: 0.1}], {},
        {"kind": "PiecewiseConstantDecay", "boundaries": [19, 39],
         "values": [0.1, 0.05, 0.005]}),
    "join_schedules([linear_schedule(0.0, 0.1, 10), cosine_decay_schedule(0.1, 50)], [10])": (
        "join_schedules", [[("linear_schedule", [0.0, 0.1, 10]),
                            ("cosine_decay_schedule", [0.1, 50])], [10]], {},
        {"kind": "sequence", "boundaries": [10], "schedules": [
            {"kind": "linear", "start": 0.0, "end": 0.1, "steps": 10},
            {"kind": "CosineDecay", "initial_learning_rate": 0.1, "decay_steps": 50}]}),
    "warmup_exponential_decay_schedule(0.0, 0.1, 10, 10, 0.5)": (
        "warmup_exponential_decay_schedule", [0.0, 0.1, 10, 10, 0.5], {},
        {"kind": "warmup", "warmup_steps": 10, "init_value": 0.0, "after": {
            "kind": "ExponentialDecay", "initial_learning_rate": 0.1, "decay_steps": 10,
            "decay_rate": 0.5}}),
}
SCHEDULE_STEPS = 120


def schedule_values(name: str, args: list, kwargs: dict) -> list[float]:
    if name == "join_schedules":  # its schedules, each (function, arguments)
        args = [[getattr(optax, f)(*a) for f, a in args[0]], args[1]]
    schedule = getattr(optax, name)(*args, **kwargs)
    return [float(schedule(step)) for step in range(SCHEDULE_STEPS)]


def gradients(params):
    return {"a": 2.0 * (params["a"] - jnp.array(A_TARGET)),
            "b": 2.0 * jnp.array(B_CURVATURE) * params["b"]}


def trajectory(alias: str, kwargs: dict) -> list[dict]:
    opt = getattr(optax, alias)(**kwargs)
    params = {"a": jnp.array(A0, jnp.float32), "b": jnp.array(B0, jnp.float32)}
    state = opt.init(params)

    @jax.jit  # as optax's own tests and its users run it: eager JAX rounds b ** t
    def step(params, state):  # differently, which radam's rho = 1999 - 1993 shows
        updates, state = opt.update(gradients(params), state, params)
        return optax.apply_updates(params, updates), state

    steps = []
    for _ in range(STEPS):
        params, state = step(params, state)
        steps.append({k: np.asarray(v).tolist() for k, v in params.items()})
    return steps


def defaults(alias: str) -> dict:
    """The alias's keyword defaults that are plain numbers or flags."""
    import inspect

    parameters = inspect.signature(getattr(optax, alias)).parameters
    return {name: p.default for name, p in parameters.items()
            if isinstance(p.default, (bool, int, float)) and name not in ("seed", "key")}


def main() -> None:
    golden = {"optax": optax.__version__, "jax": jax.__version__, "steps": STEPS,
              "a0": A0, "a_target": A_TARGET, "b0": B0, "b_curvature": B_CURVATURE,
              "cases": {}}
    for name, (alias, kwargs) in CASES.items():
        golden["cases"][name] = {"alias": alias, "kwargs": kwargs,
                                 "params": trajectory(alias, kwargs)}
    golden["mapped"] = {name: {"alias": alias, "kwargs": kwargs, "transforms": chain,
                               "tolerance": list(tolerance),
                               "params": trajectory(alias, kwargs)}
                        for name, (alias, kwargs, chain, tolerance) in MAPPED.items()}
    golden["schedules"] = {call: {"table": table, "values": schedule_values(name, args, kw)}
                           for call, (name, args, kw, table) in SCHEDULES.items()}
    # only the defaults of rprop (optax's steps lag one step: its pull request 1725)
    # and of noisy_sgd (JAX's random stream is JAX's own)
    aliases = {alias for alias, _ in CASES.values()} | {"rprop", "noisy_sgd"}
    golden["defaults"] = {alias: defaults(alias) for alias in sorted(aliases)}
    path = Path(__file__).with_name("optax_golden.json")
    path.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {path} ({len(CASES)} cases, {len(MAPPED)} mapped, optax {optax.__version__})")


if __name__ == "__main__":
    main()
