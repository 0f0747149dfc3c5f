"""How a compiled step runs: variable by variable, or as one XLA function, or not.

Decided at build, once: where the chain is separable, each distinct
per-variable function is traced now (``PerVariable``); else the whole step is
one function. Under ``jit_compile = "auto"`` the functions the step would run
are lowered to XLA here, so a step XLA cannot compile is planned uncompiled
with the reason, instead of failing at its first call.
"""

from __future__ import annotations

from typing import Any

import attrs
import tensorflow as tf

from ..errors import GradpipeError
from ..names import scope_name
from ..transform import accelerator_visible
from .per_variable import PerVariable
from .plan import COMPILED_INSTEAD, Choice, Plan, uncompiled
from .separable import per_variable_blocker, probe_transform
from .xla_trial import compiled_or_why_not, one_kernel_alone, random_draws


def compile_choices(plan: Plan, step: Any, transforms: list[Any], context: Any, *,
                    variables: list[Any], masks: list[list[bool]], frozen: list[bool],
                    replicas: int) -> Plan:
    """Decide how a compiled step runs: variable by variable where the chain is
    separable (each distinct function traced now, once), else one function for
    all; and, under "auto", whether XLA compiles what the step would run."""
    spec = step.spec
    if spec.options.jit_compile == "auto" and one_kernel_alone(step, plan):
        return uncompiled(plan, f'"auto": {spec.transforms[-1].name} alone updates each '
                                "variable in one fused kernel, which XLA does not beat")
    names = {scope_name(i, t.name): t.name for i, t in enumerate(spec.transforms)}
    probes: dict[int, tuple[str, bool, bool]] = {}

    def separable(i: int) -> str:
        # The first transform's input is the step's gradients, whose global norm the
        # step has: under "auto" a global clip there is separable given that norm.
        # jit_compile = true compiles such a chain whole instead: its steps are the
        # fastest (clip + adam, 50 x 400k floats, 2 cores: 25 ms against 39), its
        # compile the slowest (7.7 s against 0.95 s to the first step).
        given = i == 0 and spec.options.jit_compile == "auto"
        probes[i] = probe_transform(transforms[i], context, given_input_norm=given)
        return probes[i][0]

    why_not = per_variable_blocker(spec, plan, variables, masks, frozen, replicas, separable)
    if not why_not:
        try:
            per_variable = PerVariable(step, hands_norm=probes.get(0, ("", False, False))[2])
        except GradpipeError as exc:
            why_not = str(exc)
    trials: list[tuple[Any, tuple[Any, ...]]]
    if not why_not:
        count = per_variable.trace(spec.options.check_updates,
                                   reads_names=any(p[1] for p in probes.values()))
        trials = per_variable.trials()
        given = (f", {spec.transforms[0].name} given the gradients' global norm"
                 if per_variable.hands_norm else "")
        plan = attrs.evolve(
            plan, per_variable=Choice(True, f"{count} XLA function{'s' * (count > 1)} for "
                                      f"{len(variables)} variable{'s' * (len(variables) > 1)}"
                                      ", one per distinct shape and maths, each traced "
                                      f"once{given}"),
            sequence=Choice(False, "each variable is updated by a function of its own"))
        step.per_variable = per_variable
    elif whole_step_too_slow_to_compile(spec, plan):
        count = len(variables)
        if not plan.pack.on and COMPILED_INSTEAD in plan.pack.reason:
            mean = sum(v.shape.num_elements() or 0 for v in variables) / count
            plan = attrs.evolve(plan, pack=Choice(False, f'"auto": {count} variables of '
                                                  f"{mean:,.0f} elements on average: large "
                                                  "enough to update one by one"))
        return uncompiled(plan, f'"auto": not variable by variable ({why_not}), so one XLA '
                                f"function for all {count} variable{'s' * (count > 1)}, whose "
                                "compile on a CPU grows with them and costs more than it "
                                "saves for most runs (jit_compile = true compiles it)")
    else:
        plan = attrs.evolve(plan, per_variable=Choice(False, why_not))
        trials = [(step.compiled, _whole_step_arguments(step.state))]
    if spec.options.jit_compile == "auto":
        lowered: set[str] = set()
        why = next((w for f, args in trials
                    if (w := compiled_or_why_not(f, args, names, lowered))), "")
        if why:
            step.per_variable = None
            return uncompiled(plan, f'"auto": {why}')
    elif draws := next((d for f, args in trials if (d := random_draws(f, args, names))), ""):
        plan = attrs.evolve(plan, compile=Choice(True, f"jit_compile = true, although {draws}"))
    return plan


def whole_step_too_slow_to_compile(spec: Any, plan: Plan) -> bool:
    """Under "auto", on a CPU, a step that is neither packed nor compiled variable by
    variable is left uncompiled. Its one XLA function holds every variable, and its
    compile grows with them. Measured with a global clip compiled whole (before it
    was handed the gradients' norm), 50 variables of 400k floats, 2 cores: Adam's
    first step took 7.7 s against 1.2 s uncompiled (Keras: 1.3 s), AdamW's 54 s
    against 3.5 s (Keras: 1.5 s), to make each later step about 48 ms shorter; a
    5-variable text classifier's first epoch 4 s against 1.8 s, for no faster step.
    Keras, too, compiles no train step on a CPU by default."""
    return spec.options.jit_compile == "auto" and not plan.pack.on and \
        not accelerator_visible()


def _whole_step_arguments(store: Any) -> tuple[Any, ...]:
    """What the step hands its one XLA function, as specs: for lowering it at build
    (tensors of the gradients' size would take the parameters' memory again)."""
    packing = store.packing
    if packing is not None:
        return [tf.TensorSpec([packing.total], tf.float32)], None
    return [tf.TensorSpec(v.shape, v.dtype) for v in store.model_variables], None
