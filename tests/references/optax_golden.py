"""Write ``optax_golden.json``: twelve steps of each optax rule gradpipe follows,
run by optax itself, for ``tests/test_optax_rules.py`` to compare against.

    pip install optax jax    # not a test dependency: about 600 MB
    python tests/references/optax_golden.py

Each case is an optax alias with its keyword arguments, in optax's own names.
The problem: two parameters, ``a`` (3 values, the parabola of optax's
``alias_test.py``) and ``b`` (2 x 2, a quadratic of four curvatures), their
gradients computed from the current parameters at each step, so the whole
trajectory depends on the rule. The file records the optax and JAX versions,
and each alias's defaults.
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
    # only the defaults of rprop (optax's steps lag one step: its pull request 1725)
    # and of noisy_sgd (JAX's random stream is JAX's own)
    aliases = {alias for alias, _ in CASES.values()} | {"rprop", "noisy_sgd"}
    golden["defaults"] = {alias: defaults(alias) for alias in sorted(aliases)}
    path = Path(__file__).with_name("optax_golden.json")
    path.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {path} ({len(CASES)} cases, optax {optax.__version__})")


if __name__ == "__main__":
    main()
