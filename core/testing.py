"""The plugin contract suite: the checks every registered component must pass.

Plugin distributions run it from their own tests::

    import pytest
    from gradpipe.testing import check_component, contract_cases

    @pytest.mark.parametrize("kind, name", contract_cases(dist="gradpipe-mything"))
    def test_contract(kind, name):
        check_component(kind, name)

A component whose config has required keys declares a working example as a
class attribute, ``example: ClassVar[dict] = {"clip_norm": 1.0}``. Failures
raise :class:`ContractError` with a message naming the component and the check.
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import tomllib

from .errors import ConfigError
from .registry import get_registry

CHECKED_KINDS = ("transform", "schedule", "loss_scale", "convergence")


class ContractError(AssertionError):
    """A component breaks the gradpipe plugin contract."""


def contract_cases(kinds: tuple[str, ...] = CHECKED_KINDS, dist: str | None = None
                   ) -> list[tuple[str, str]]:
    """``(kind, name)`` of every registered component (of one distribution)."""
    registry = get_registry().load_all()
    return sorted((kind, name) for (kind, name), comp in registry.components.items()
                  if kind in kinds and (dist is None or comp.provider.dist == dist))


def example_table(kind: str, name: str) -> dict[str, Any]:
    comp = get_registry().get(kind, name)
    example = dict(getattr(comp.config_cls, "example", {}))
    missing = [f.name for f in attrs.fields(comp.config_cls)
               if f.default is attrs.NOTHING and f.name not in example]
    if missing:
        raise ContractError(f"{kind} {name!r}: its config has required keys "
                            f"{missing} but no example; declare "
                            "`example: ClassVar[dict] = {...}` on the config class")
    return {"kind": name, **example}


def check_component(kind: str, name: str) -> None:
    """Run every check that applies to ``kind``."""
    table = example_table(kind, name)
    _check_round_trip(kind, name, table)
    _check_invalid_values(kind, name, table)
    {"transform": _check_transform, "schedule": _check_schedule,
     "loss_scale": _check_loss_scale, "convergence": _check_convergence}[kind](name, table)


def _pipeline(kind: str, table: dict[str, Any]) -> dict[str, Any]:
    if kind == "transform":
        comp = get_registry().get("transform", table["kind"])
        chain = [table] if getattr(comp.config_cls, "update_rule", False) else \
            [table, {"kind": "sgd", "learning_rate": 0.01}]
        if getattr(comp.config_cls, "after_update_rule", False):
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


def _check_round_trip(kind: str, name: str, table: dict[str, Any]) -> None:
    from .api import parse

    spec = parse(_pipeline(kind, table))
    again = parse(tomllib.loads(spec.to_toml()))
    if again != spec:
        raise ContractError(f"{kind} {name!r}: the config does not round-trip through "
                            f"TOML:\n{spec.to_toml()}")


def _check_invalid_values(kind: str, name: str, table: dict[str, Any]) -> None:
    """A value of the wrong type for each key is a ConfigError naming the key."""
    from .api import parse

    cls = get_registry().get(kind, name).config_cls
    for field in attrs.fields(cls):
        wrong: Any = {"__not": "a value"}  # a table fits no plain key; as a schedule it fails
        try:
            parse(_pipeline(kind, {**table, field.name: wrong}))
        except ConfigError as exc:
            if not any(p.path.endswith(field.name) or f".{field.name}." in p.path
                       for p in exc.problems):
                raise ContractError(f"{kind} {name!r}: a bad {field.name!r} was reported "
                                    f"under another key: {exc}") from None
            continue
        raise ContractError(f"{kind} {name!r}: {field.name} = {wrong!r} was accepted")


def _variables(tf: Any) -> list[Any]:
    return [tf.Variable([[1.0, -2.0], [0.5, 3.0]], name="kernel"),
            tf.Variable([0.1, -0.2, 0.3], dtype=tf.float64, name="bias"),
            tf.Variable([1.0], name="unused")]


def _grads(tf: Any, step: int) -> list[Any]:
    scale = 1.0 + 0.5 * step
    return [tf.constant([[0.3, -0.1], [0.2, 0.4]]) * scale,
            tf.constant([0.05, -0.1, 0.2], tf.float64) * scale, None]


def _check_transform(name: str, table: dict[str, Any]) -> None:
    import tensorflow as tf

    from .build import create

    transform = create("transform", table)
    variables = _variables(tf)
    state = transform.init(variables)
    try:
        updates, new_state = transform.update(_grads(tf, 0), state, variables)
    except Exception as exc:
        raise ContractError(f"transform {name!r}: update() failed eagerly: "
                            f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(updates, (list, tuple)) or len(updates) != len(variables):
        raise ContractError(f"transform {name!r}: update() must return one update per "
                            f"variable ({len(variables)}), got {updates!r:.200}")
    for var, grad, update in zip(variables, _grads(tf, 0), updates):
        if grad is None:
            if update is not None:
                raise ContractError(f"transform {name!r}: a None gradient must stay None")
            continue
        dense = tf.convert_to_tensor(update)
        if dense.dtype != var.dtype or dense.shape != var.shape:
            raise ContractError(f"transform {name!r}: the update of {var.name} has "
                                f"{dense.dtype.name}{dense.shape}, the variable "
                                f"{var.dtype.name}{var.shape}")
    try:
        tf.nest.assert_same_structure(state, new_state)
    except (ValueError, TypeError) as exc:
        raise ContractError(f"transform {name!r}: the state changed structure: {exc}") \
            from None
    _check_fast_path_declarations(name, table)
    _check_pipeline_steps("transform", name, table)


def _run(table: dict[str, Any], grads: list[Any], patch: Any = None) -> Any:
    """Weights, state and applied flags after ``tf.function`` steps of ``table``."""
    import tensorflow as tf

    from .api import build

    variables = _variables(tf)[:1]
    pipe = build(table)
    pipe.build(variables)
    if patch is not None:
        patch(pipe)
    step = tf.function(lambda g: pipe.apply_gradients([(g, variables[0])]))
    applied = [bool(step(tf.constant(g, tf.float32))) for g in grads]
    state = [v.numpy() for v in pipe.named_variables().values()]
    return [variables[0].numpy(), *state], applied


def _check_fast_path_declarations(name: str, table: dict[str, Any]) -> None:
    """What ``xla_compatible``, ``preserves_finite`` and ``apply`` promise holds."""
    import numpy as np

    from .build import component_spec, create

    config_table = _pipeline("transform", table)
    config = component_spec("transform", table).config
    grads = [[[0.3, -0.1], [0.2, 0.4]], [[-0.2, 0.5], [0.1, -0.3]], [[0.4, 0.2], [-0.1, 0.1]]]
    if getattr(config, "xla_compatible", False):
        # with a skipped step: XLA runs a predicated chain unconditionally
        grads.insert(2, [[math.nan, 0.1], [0.2, 0.3]])
        plain, _ = _run({**config_table, "pipeline": {"jit_compile": False}}, grads)
        fused, _ = _run({**config_table, "pipeline": {"jit_compile": True}}, grads)
        if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(plain, fused)):
            raise ContractError(f"transform {name!r} declares xla_compatible, but its "
                                f"results differ under XLA (a skipped step included: "
                                f"with predicated = True, is its state passed through "
                                f"select_applied?): {plain} vs {fused}")
    if getattr(config, "preserves_finite", False):
        huge = [[[1e18, -3e18], [2e18, 1e18]], [[1e30, 1e-30], [-1e30, 0.0]]] * 2
        values, applied = _run(config_table, huge)
        if not all(np.isfinite(v).all() for v in values):
            raise ContractError(f"transform {name!r} declares preserves_finite, but "
                                f"finite gradients left non-finite values ({applied=})")
    if getattr(config, "elementwise", False):
        _check_elementwise(name, config_table)
    if create("transform", table).apply is not None:
        def functional(pipe: Any) -> None:
            for i, t in enumerate(pipe._transforms):
                pipe._transforms[i] = t._replace(apply=None)

        options = {**config_table, "pipeline": {"jit_compile": False}}
        in_place, _ = _run(options, grads)
        reference, _ = _run(options, grads, functional)
        if not all(np.array_equal(a, b) for a, b in zip(in_place, reference)):
            raise ContractError(f"transform {name!r}: apply() and update() disagree: "
                                f"{in_place} vs {reference}")


def _check_elementwise(name: str, config_table: dict[str, Any]) -> None:
    """Run on all variables packed into one vector, the transform gives what it
    gives variable by variable: three variables of different shapes, a skipped step
    and a missing gradient included."""
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
        pipe = build({**config_table, "pipeline": {"pack_variables": packed,
                                                   "jit_compile": False}})
        for grads in steps:
            pipe.apply_gradients((None if g is None else tf.constant(g), v)
                                 for g, v in zip(grads, variables))
        results.append([v.numpy() for v in variables] +
                       [np.asarray(v.numpy()) for v in pipe.named_variables().values()])
    if not all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(*results)):
        raise ContractError(f"transform {name!r} declares elementwise, but packed into "
                            f"one vector its results differ from those variable by "
                            f"variable: {results[0]} vs {results[1]}")


def _check_pipeline_steps(kind: str, name: str, table: dict[str, Any]) -> None:
    """Eager and tf.function agree, the second step does not retrace, rules converge."""
    import numpy as np
    import tensorflow as tf

    from .api import build

    runs = []
    for compiled in (False, True):
        variables = _variables(tf)[:2]
        pipe = build(_pipeline(kind, table))
        pipe.build(variables)

        def step(i: Any, pipe: Any = pipe, variables: list[Any] = variables) -> Any:
            grads = [g * tf.cast(1.0 + 0.5 * tf.cast(i, tf.float32), g.dtype)
                     for g in _grads(tf, 0)[:2]]
            return pipe.apply_gradients(zip(grads, variables))

        fn: Any = tf.function(step) if compiled else step
        try:
            for i in range(3):
                fn(tf.constant(i))
        except Exception as exc:
            where = "inside tf.function" if compiled else "eagerly"
            raise ContractError(f"{kind} {name!r}: a step failed {where}: "
                                f"{type(exc).__name__}: {exc}. Components must use "
                                "TensorFlow ops only: no .numpy(), no Python branching "
                                "on tensor values") from exc
        if compiled and fn.experimental_get_tracing_count() != 1:
            raise ContractError(f"{kind} {name!r}: the step was traced "
                                f"{fn.experimental_get_tracing_count()} times; a later "
                                "step must not retrace")
        runs.append([v.numpy() for v in variables])
    for eager, graph in zip(*runs):
        if not np.allclose(eager, graph, rtol=1e-5, atol=1e-6):
            raise ContractError(f"{kind} {name!r}: eager and tf.function results differ: "
                                f"{eager} vs {graph}")
    comp = get_registry().get("transform", table["kind"]) if kind == "transform" else None
    if comp is not None and getattr(comp.config_cls, "update_rule", False):
        for problem, factor in (("quadratic", 1e-2), ("rosenbrock", 0.5)):
            _check_converges(name, table, problem, factor)


def _check_converges(name: str, table: dict[str, Any], problem: str, factor: float) -> None:
    import tensorflow as tf

    from .api import build
    from .build import create

    task = create("problem", {"kind": problem, **({"dim": 5} if problem == "quadratic"
                                                  else {})})
    pipe = build({"transforms": [table]})
    variables = list(task.variables)
    first = float(task.loss())
    result = pipe.minimize(task.loss, variables, 1500)
    final = float(task.loss())
    if not (math.isfinite(final) and final <= factor * first):
        raise ContractError(f"update rule {name!r} does not converge on {problem} with its "
                            f"example {table}: loss {first:.4g} -> {final:.4g} in "
                            f"{result.steps} steps (needs <= {factor} x initial); tune the "
                            "example's learning rate")
    del tf


def _check_schedule(name: str, table: dict[str, Any]) -> None:
    import numpy as np
    import tensorflow as tf

    from .build import create

    schedule = create("schedule", table)
    steps = tf.constant([0, 1, 10, 1000], tf.int64)
    values = schedule(steps)
    if values.dtype != tf.float32 or values.shape != steps.shape:
        raise ContractError(f"schedule {name!r}: schedule(steps) must give float32 values "
                            f"of the steps' shape, got {values.dtype.name}{values.shape}")
    fn = tf.function(schedule)
    graph = [float(fn(tf.constant(s, tf.int64))) for s in (0, 1, 10, 1000)]
    if fn.experimental_get_tracing_count() != 1:
        raise ContractError(f"schedule {name!r}: changing the step retraced")
    if not np.allclose(values.numpy(), graph, rtol=1e-6):
        raise ContractError(f"schedule {name!r}: eager and tf.function values differ")


def _check_loss_scale(name: str, table: dict[str, Any]) -> None:
    import tensorflow as tf

    from .build import create

    scaler = create("loss_scale", table)
    scale = tf.convert_to_tensor(scaler())
    if scale.dtype != tf.float32 or scale.shape != ():
        raise ContractError(f"loss scaler {name!r}: scaler() must be a float32 scalar")
    result = scaler.update([tf.constant([1.0]), None])
    if not (isinstance(result, tuple) and len(result) == 2):
        raise ContractError(f"loss scaler {name!r}: update() must return "
                            "(update_op, should_apply_gradients)")
    if bool(scaler.update([tf.constant([math.inf])])[1]) and name != "fixed":
        raise ContractError(f"loss scaler {name!r}: an Inf gradient must not be applied")
    again = type(scaler).from_config(scaler.get_config())
    if again.get_config() != scaler.get_config():
        raise ContractError(f"loss scaler {name!r}: get_config/from_config do not "
                            "round-trip")
    _check_pipeline_steps("loss_scale", name, table)


def _check_convergence(name: str, table: dict[str, Any]) -> None:
    import tensorflow as tf

    from .build import create

    criterion = create("convergence", table)
    loss, grads, params = tf.constant(1.0), [tf.constant([0.5])], [tf.constant([1.0])]
    state = criterion.bootstrap(loss, grads, params)
    if state is None:
        raise ContractError(f"criterion {name!r}: bootstrap() returned None; use () for "
                            "an empty state")
    converged, new_state = criterion.one_step(tf.constant(1), loss * 0.5, grads, params, state)
    tf.nest.assert_same_structure(state, new_state)
    if tf.convert_to_tensor(converged).dtype != tf.bool:
        raise ContractError(f"criterion {name!r}: has_converged must be a bool tensor")
    for attribute in ("min_num_steps", "name"):
        if not hasattr(criterion, attribute):
            raise ContractError(f"criterion {name!r}: lacks {attribute}")
