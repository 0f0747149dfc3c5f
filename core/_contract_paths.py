"""Whatever path the engine picks, a transform gives the same results.

Part of the contract suite (:mod:`gradpipe.testing`): compiled and plain, in
place (a registered kernel) and functional, packed into one vector and
variable by variable. Also the fixtures the suite's checks share.
"""

from __future__ import annotations

import math
from typing import Any

from .errors import GradpipeError
from .registry import get_registry


class ContractError(AssertionError):
    """A component breaks the gradpipe plugin contract."""


def pipeline_for(kind: str, table: dict[str, Any]) -> dict[str, Any]:
    if kind == "transform":
        comp = get_registry().get("transform", table["kind"])
        chain = [table] if comp.capabilities.update_rule else \
            [table, {"kind": "sgd", "learning_rate": 0.01}]
        if comp.capabilities.after_update_rule:
            chain = [{"kind": "sgd", "learning_rate": 0.01}, table]
        return {"transforms": chain}
    base: dict[str, Any] = {"transforms": [{"kind": "sgd"}]}
    if kind == "schedule":
        base["schedules"] = {"s": table}
    elif kind == "convergence":
        base["convergence"] = [table]
    else:
        base[kind] = table  # loss_scale
    return base


def probe_variables(tf: Any) -> list[Any]:
    return [tf.Variable([[1.0, -2.0], [0.5, 3.0]], name="kernel"),
            tf.Variable([0.1, -0.2, 0.3], dtype=tf.float64, name="bias"),
            tf.Variable([1.0], name="unused")]


def probe_grads(tf: Any, step: int) -> list[Any]:
    scale = 1.0 + 0.5 * step
    return [tf.constant([[0.3, -0.1], [0.2, 0.4]]) * scale,
            tf.constant([0.05, -0.1, 0.2], tf.float64) * scale, None]


def _run(table: dict[str, Any], grads: list[Any]) -> Any:
    """Weights and state, applied flags, and the pipeline after ``tf.function`` steps
    of ``table``."""
    import tensorflow as tf

    from .api import build

    variables = probe_variables(tf)[:1]
    pipe = build(table)
    pipe.build(variables)
    step = tf.function(lambda g: pipe.apply_gradients([(g, variables[0])]))
    applied = [bool(step(tf.constant(g, tf.float32))) for g in grads]
    state = [v.numpy() for v in pipe.named_variables().values()]
    return [variables[0].numpy(), *state], applied, pipe


def check_paths_agree(name: str, table: dict[str, Any]) -> None:
    """Whatever path the engine picks, the transform gives the same results and never
    leaves a non-finite value: compiled (where XLA compiles it) and plain, in place
    (with a registered kernel) and functional, packed into one vector (where the
    engine packs it) and variable by variable; huge but finite gradients included."""
    import numpy as np

    from .components import component_spec

    config_table = pipeline_for("transform", table)
    grads = [[[0.3, -0.1], [0.2, 0.4]], [[-0.2, 0.5], [0.1, -0.3]],
             [[math.nan, 0.1], [0.2, 0.3]], [[0.4, 0.2], [-0.1, 0.1]]]
    plain, _, _ = _run({**config_table, "pipeline": {"jit_compile": False}}, grads)
    try:
        fused, _, pipe = _run({**config_table, "pipeline": {"jit_compile": True}}, grads)
    except Exception as exc:  # XLA cannot compile it: "auto" will not
        if "compile" not in str(exc).lower() and "xla" not in str(exc).lower():
            raise
    else:  # random draws differ under XLA: "auto" keeps the plain path then
        if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(plain, fused)) \
                and "draws random numbers" not in pipe.plan.compile.reason:
            raise ContractError(f"transform {name!r}: its results differ under XLA (a "
                                f"skipped step included): {plain} vs {fused}")
    huge = [[[1e18, -3e18], [2e18, 1e18]], [[1e30, 1e-30], [-1e30, 0.0]]] * 2
    values, applied, _ = _run(config_table, huge)
    if not all(np.isfinite(v).all() for v in values):
        raise ContractError(f"transform {name!r}: finite gradients left non-finite values "
                            f"({applied=}); the engine should have skipped those steps")
    spec = component_spec("transform", table)
    _check_packed(name, config_table)
    kernel = get_registry().get("transform", name).kernel
    if kernel is not None:
        _check_kernel(name, spec, kernel)


def _check_kernel(name: str, spec: Any, kernel: Any) -> None:
    """The registered kernel does in place exactly what ``update`` and ``var -= update``
    do, bit for bit, over three steps (one gradient missing in one of them)."""
    import numpy as np
    import tensorflow as tf

    from .components import create

    transform = create("transform", {"kind": name, **_table_of(spec)})
    apply = kernel(spec.config)
    results = []
    for in_place in (False, True):
        variables = probe_variables(tf)[:2]
        state = tf.nest.map_structure(
            lambda t: tf.Variable(tf.convert_to_tensor(t)), transform.init(variables))
        for step in range(3):
            grads = probe_grads(tf, step)[:2]
            if step == 1:
                grads[1] = None
            if in_place:
                apply(grads, state, variables)
                continue
            current = tf.nest.map_structure(lambda v: v.read_value(), state)
            updates, new = transform.update(grads, current, variables)
            tf.nest.map_structure(lambda v, n: v.assign(n), state, new)
            for var, u in zip(variables, updates):
                if u is not None:
                    var.assign_sub(tf.cast(u, var.dtype))
        results.append([v.numpy() for v in variables] +
                       [v.numpy() for v in tf.nest.flatten(state)])
    if not all(np.array_equal(a, b) for a, b in zip(*results)):
        raise ContractError(f"transform {name!r}: its kernel and update() disagree: "
                            f"{results[1]} vs {results[0]}")


def _table_of(spec: Any) -> dict[str, Any]:
    mapping = spec.to_mapping()
    mapping.pop("kind")
    return mapping


def _check_packed(name: str, config_table: dict[str, Any]) -> None:
    """Where the engine packs the transform (its own check at build found it
    elementwise), packed into one vector it gives what it gives variable by
    variable: three variables of different shapes, a skipped step and a missing
    gradient included."""
    import numpy as np
    import tensorflow as tf

    from .api import build

    rng = np.random.default_rng(0)
    shapes = [(2, 3), (4,), (1, 2, 2)]
    steps: list[list[Any]] = [[rng.normal(size=s).astype("f4") for s in shapes]
                              for _ in range(4)]
    steps[1][0][0, 1] = math.nan
    steps[2][2] = None
    results = []
    for packed in (False, True):
        variables = [tf.Variable(np.linspace(-1, 1, math.prod(s), dtype="f4").reshape(s))
                     for s in shapes]
        try:
            pipe = build({**config_table, "pipeline": {"pack_variables": packed,
                                                       "jit_compile": False}})
            pipe.build(variables)
        except GradpipeError:  # the engine found it not elementwise: never packed
            return
        for grads in steps:
            pipe.apply_gradients((None if g is None else tf.constant(g), v)
                                 for g, v in zip(grads, variables))
        results.append([v.numpy() for v in variables] +
                       [np.asarray(v.numpy()) for v in pipe.named_variables().values()])
    if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*results)):
        raise ContractError(f"transform {name!r}: packed into one vector its results "
                            f"differ from those variable by variable: {results[0]} vs "
                            f"{results[1]}")
