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

from ._contract_paths import (
    ContractError,
    check_paths_agree,
    pipeline_for,
    probe_grads,
    probe_variables,
)
from .entry_points import index_problems
from .errors import ConfigError
from .hints import did_you_mean
from .hookspecs import PROJECT_NAME
from .registry import get_registry

__all__ = ["CHECKED_KINDS", "ContractError", "check_component", "contract_cases",
           "example_table"]

CHECKED_KINDS = ("transform", "schedule", "loss_scale", "convergence")


def contract_cases(kinds: tuple[str, ...] = CHECKED_KINDS, dist: str | None = None
                   ) -> list[tuple[str, str]]:
    """``(kind, name)`` of every registered component (of one distribution).

    With ``dist``, a distribution that provides none of ``kinds`` is a
    :class:`ContractError` (its plugin failed to load, or the name is misspelt),
    never an empty list: pytest would skip the contract tests and pass green.
    """
    registry = get_registry().load_all()
    cases = sorted((kind, name) for (kind, name), comp in registry.components.items()
                   if kind in kinds and (dist is None or comp.provider.dist == dist))
    if dist is not None and not cases:
        raise ContractError(_no_cases_reason(registry, dist, kinds))
    if dist is not None:
        provided = {key for key, comp in registry.components.items()
                    if comp.provider.dist == dist}
        problems = index_problems(f"{PROJECT_NAME}.components", dist, provided)
        if problems:
            raise ContractError(f"distribution {dist!r}: " + "; ".join(problems))
    return cases


def _no_cases_reason(registry: Any, dist: str, kinds: tuple[str, ...]) -> str:
    mine = [r for r in registry.plugins if r.provider.dist == dist]
    failed = [r for r in mine if r.status != "loaded"]
    if failed:
        record = failed[0]
        where = f" at {record.location}" if record.location else ""
        return (f"distribution {dist!r} provides no components: its plugin "
                f"{record.provider} failed to load{where}: {record.error}")
    if mine:
        return (f"distribution {dist!r} registers no component of the checked kinds "
                f"({', '.join(kinds)})")
    dists = sorted({r.provider.dist for r in registry.plugins})
    return (f"no installed plugin comes from distribution {dist!r}"
            f"{did_you_mean(dist, dists)}; is it installed (pip install -e .)? "
            f"Installed: {', '.join(dists)}")


def example_table(kind: str, name: str) -> dict[str, Any]:
    """The component's ``example`` as a TOML table (registration checked that it sets
    every required key, with values of the right types)."""
    comp = get_registry().get(kind, name)
    return {"kind": name, **getattr(comp.config_cls, "example", {})}


def check_component(kind: str, name: str) -> None:
    """Run every check that applies to ``kind``."""
    table = example_table(kind, name)
    _check_round_trip(kind, name, table)
    _check_invalid_values(kind, name, table)
    {"transform": _check_transform, "schedule": _check_schedule,
     "loss_scale": _check_loss_scale, "convergence": _check_convergence}[kind](name, table)


def _check_round_trip(kind: str, name: str, table: dict[str, Any]) -> None:
    from .api import parse

    spec = parse(pipeline_for(kind, table))
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
            parse(pipeline_for(kind, {**table, field.name: wrong}))
        except ConfigError as exc:
            if not any(p.path.endswith(field.name) or f".{field.name}." in p.path
                       for p in exc.problems):
                raise ContractError(f"{kind} {name!r}: a bad {field.name!r} was reported "
                                    f"under another key: {exc}") from None
            continue
        raise ContractError(f"{kind} {name!r}: {field.name} = {wrong!r} was accepted")


def _check_transform(name: str, table: dict[str, Any]) -> None:
    import tensorflow as tf

    from .components import create

    transform = create("transform", table)
    variables = probe_variables(tf)
    state = transform.init(variables)
    try:
        updates, new_state = transform.update(probe_grads(tf, 0), state, variables)
    except Exception as exc:
        raise ContractError(f"transform {name!r}: update() failed eagerly: "
                            f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(updates, (list, tuple)) or len(updates) != len(variables):
        raise ContractError(f"transform {name!r}: update() must return one update per "
                            f"variable ({len(variables)}), got {updates!r:.200}")
    for var, grad, update in zip(variables, probe_grads(tf, 0), updates):
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
    _check_pipeline_steps("transform", name, table)
    check_paths_agree(name, table)
    if get_registry().get("transform", table["kind"]).capabilities.update_rule:
        for problem, factor in (("quadratic", 1e-2), ("rosenbrock", 0.5)):
            _check_converges(name, table, problem, factor)


def _check_pipeline_steps(kind: str, name: str, table: dict[str, Any]) -> None:
    """Eager and tf.function agree, the second step does not retrace, rules converge."""
    import numpy as np
    import tensorflow as tf

    from .api import build

    runs = []
    for compiled in (False, True):
        variables = probe_variables(tf)[:2]
        pipe = build(pipeline_for(kind, table))
        pipe.build(variables)

        def step(i: Any, pipe: Any = pipe, variables: list[Any] = variables) -> Any:
            grads = [g * tf.cast(1.0 + 0.5 * tf.cast(i, tf.float32), g.dtype)
                     for g in probe_grads(tf, 0)[:2]]
            return pipe.apply_gradients(zip(grads, variables))

        fn: Any = tf.function(step) if compiled else step
        try:
            for i in range(3):
                fn(tf.constant(i))
        except Exception as exc:
            where = "inside tf.function" if compiled else "eagerly"
            raise ContractError(f"{kind} {name!r}: a step failed {where}: "
                                f"{type(exc).__name__}: {str(exc).strip()}. Components "
                                "must use TensorFlow ops only: no .numpy(), no Python "
                                "branching on tensor values") from exc
        if compiled and fn.experimental_get_tracing_count() != 1:
            raise ContractError(f"{kind} {name!r}: the step was traced "
                                f"{fn.experimental_get_tracing_count()} times; a later "
                                "step must not retrace")
        runs.append([v.numpy() for v in variables])
    for eager, graph in zip(*runs):
        if not np.allclose(eager, graph, rtol=1e-5, atol=1e-6):
            raise ContractError(f"{kind} {name!r}: eager and tf.function results differ: "
                                f"{eager} vs {graph}. A value kept in Python between "
                                "steps (a counter, a flag) is read once when the step is "
                                "traced: keep it in the transform's state")


def _check_converges(name: str, table: dict[str, Any], problem: str, factor: float) -> None:
    import tensorflow as tf

    from .api import build
    from .components import create

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
                            f"{result.steps} steps (needs <= {factor} x initial); check "
                            "its maths and the order of its state's fields, or tune the "
                            "example's learning rate")
    del tf


def _check_schedule(name: str, table: dict[str, Any]) -> None:
    import numpy as np
    import tensorflow as tf

    from .components import create

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

    from .components import create

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

    from .components import create

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
