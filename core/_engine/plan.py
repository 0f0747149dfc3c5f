"""How a step runs: every decision in one place, each with its reason.

``make_plan`` decides when the pipeline is built, from its spec, its
components, the variables and the placement; ``pipe.plan`` prints the result.
Nothing is taken on a component's word where the engine can find it out: XLA
is tried at build (:mod:`gradpipe._engine.xla_trial`), a transform's outputs are proved
finite only for gradpipe's own maths (:mod:`gradpipe._engine.proofs`) and
checked otherwise, and a transform's state is packed into one vector only
once it gave the same numbers run packed and variable by variable.

A few conditions are known only when a step is traced (sparse gradients, a
summary writer, the replicas of a strategy); ``fusion_blocker`` says whether
they leave the fused paths (XLA, in-place kernels) open.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import tensorflow as tf

from ..distribute import is_parameter_server
from ..errors import GradpipeError
from ..spec import PipelineSpec
from ..transform import accelerator_visible
from .proof_table import bounds_updates, proof_summary
from .state_reads import Ranged, is_bounded, ranged_leaves, read_text, takes_values
from .summaries import writer_may_record
from .xla_pays import distinct_shapes, xla_pays

# "auto" packs where the per-variable step would not be compiled for its many or
# small variables, as long as there are enough of them for the op count to matter.
AUTO_PACK_MIN_VARIABLES = 16
# A bound spares the compiled step the pass that a check fuses before its first
# write. On the plain path every output exists before the writes anyway, so below
# this many elements a check's one sum costs no more at each step (radam on 4
# variables of 4k to 262k elements, 2 cores: 1.03 to 3.08 ms bounded, 1.11 to 3.32
# checked, noise either way) and its first step ~1.3 s less: no trace of the maths
# to bound, no trial of the bound at build (2.0 s against 0.7 s).
BOUND_MIN_ELEMENTS_NOT_COMPILED = 1 << 20
# Why "auto" did not pack large variables; compile_choices rewrites it where the step
# then turns out not to be compiled variable by variable after all.
COMPILED_INSTEAD = "compiled variable by variable instead"


@attrs.frozen
class Choice:
    """One decision: ``on`` or not, and why."""

    on: bool
    reason: str

    def __str__(self) -> str:
        return f"{'yes' if self.on else 'no'}: {self.reason}"


@attrs.frozen(kw_only=True)
class Plan:
    """How this pipeline's step runs. ``str(plan)`` is a table with the reasons.

    Attributes:
        compile: the update is one XLA function (``[pipeline] jit_compile``).
        pack: the state of all variables is one vector each (``pack_variables``).
        in_place: the last rule's fused kernel updates variables and slots in
            place, where the step is not compiled.
        sequence: compiled on a CPU, large variables are updated one after another.
        per_variable: compiled, each variable is updated by an XLA function of its
            own, one per distinct shape and maths (``gradpipe._engine.per_variable``).
        clip_before_reduce: transforms run on each replica's gradients.
        checks: for each transform, how its outputs are known to be finite.
        bounded: the transforms whose outputs are known finite from the bounds of
            their maths (``gradpipe._engine.bounds``), not from a check.
        ranged: those of ``bounded`` that hold some of their state within its
            range (its least and largest element), not its norm, each with those
            leaves (``state_reads.Ranged``: true for all).
        valued: those of ``bounded`` whose bounds take the norms and sums their
            maths computes at their values, not within their intervals.
        rows: which variables a sparse gradient (an embedding lookup's) updates by
            rows, and why the others are made dense; found when the plan is first
            read (``pipe.plan``), not at build.
        servers: under parameter servers, which variables are split over them and
            how their shards are updated (``None`` elsewhere).
    """

    compile: Choice
    pack: Choice
    in_place: Choice
    sequence: Choice
    clip_before_reduce: tuple[int, ...]
    checks: tuple[str, ...]
    bounded: tuple[int, ...] = ()
    ranged: tuple[tuple[int, Ranged], ...] = ()
    valued: tuple[int, ...] = ()
    per_variable: Choice = Choice(False, "the step is not compiled")
    rows: Choice | None = None
    servers: Choice | None = None

    def __str__(self) -> str:
        rows = [("XLA", str(self.compile)), ("packed state", str(self.pack)),
                ("in place", str(self.in_place)), ("per variable", str(self.per_variable)),
                ("in sequence", str(self.sequence))]
        if self.rows is not None:
            rows.append(("by rows", str(self.rows)))
        if self.servers is not None:
            rows.append(("sharded", str(self.servers)))
        if self.clip_before_reduce:
            rows.append(("per replica", "transforms " + ", ".join(
                f"[{i}]" for i in self.clip_before_reduce) + " clip before the reduction"))
        rows += [("finite" if i == 0 else "", check) for i, check in enumerate(self.checks)]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {text}" for name, text in rows)


def clip_before_reduce(spec: PipelineSpec, requested: bool) -> tuple[int, ...]:
    """The leading clipping transforms, where the placement clips per replica."""
    leading: list[int] = []
    if requested:
        for i, t in enumerate(spec.transforms):
            if not t.capabilities.gradient_clipping:
                break
            leading.append(i)
    return tuple(leading)


def _checks(spec: PipelineSpec, proved: list[bool], pre_reduce: tuple[int, ...],
            how_bounded: Callable[[int], str] | None, *, compiled: bool, elements: int
            ) -> tuple[tuple[str, ...], tuple[int, ...], tuple[tuple[int, Ranged], ...],
                       tuple[int, ...]]:
    """How each transform's outputs are known finite, which are bounded, which of
    those read some of their state's range and which take their norms at their
    values (``how_bounded(i)``: what it reads, ``state_reads``, or why not; not
    asked where a step of ``elements`` is not compiled and small)."""
    out: list[str] = []
    bounded: list[int] = []
    ranged: list[tuple[int, Ranged]] = []
    valued: list[int] = []
    if not compiled and elements < BOUND_MIN_ELEMENTS_NOT_COMPILED:
        small = (f"the step is not compiled and its {elements:,} elements are fewer than "
                 f"the {BOUND_MIN_ELEMENTS_NOT_COMPILED:,} where a bound pays")

        def how_bounded(i: int) -> str:
            return small
    for i, (t, proof) in enumerate(zip(spec.transforms, proved)):
        where = f"{t.name} at {t.path}: "
        if i in pre_reduce:
            out.append(where + "runs before the reduction, whose result is checked")
        elif not spec.options.check_updates:
            out.append(where + "not checked (check_updates = false)")
        elif proof:
            out.append(where + proof_summary(t.name, t.config))
        elif how_bounded is not None and is_bounded(why := how_bounded(i)):
            bounded.append(i)
            if leaves := ranged_leaves(why):
                ranged.append((i, leaves))
            if takes_values(why):
                valued.append(i)
            before = spec.transforms[i - 1] if i else None
            given = (f"{before.name} at {before.path}" if before is not None and (
                i - 1 in bounded or bounds_updates(before)) else "")
            out.append(where + f"bounded: its traced maths, from {read_text(why, given)} "
                               "(checked where a bound fails)")
        else:
            reason = f" ({why})" if how_bounded is not None else ""
            out.append(where + f"checked: one sum over its updates and new state{reason}")
    return tuple(out), tuple(bounded), tuple(ranged), tuple(valued)


def make_plan(spec: PipelineSpec, *, variables: list[Any], masks: list[list[bool]],
              frozen: list[bool], proved: list[bool], has_kernel: bool,
              replicas: int, clip_per_replica: bool, servers: Choice | None = None,
              elementwise_probe: Any = None,
              how_bounded: Callable[[int], str] | None = None) -> Plan:
    """Decide how the step runs (XLA is decided for good by ``compiled_or_why_not``).

    ``proved``: per transform, whether its outputs are proved finite;
    ``has_kernel``: the last transform has a fused in-place kernel;
    ``elementwise_probe(i)``: "" if transform ``i`` gives the same numbers packed,
    else why not (run only where packing is otherwise chosen);
    ``servers``: under parameter servers, how sharded variables are updated.
    """
    options = spec.options
    pre_reduce = clip_before_reduce(spec, clip_per_replica)
    sizes = [v.shape.num_elements() for v in variables]
    masters = any(v.dtype in (tf.float16, tf.bfloat16) for v in variables)
    last = len(spec.transforms) - 1
    guarded = options.check_updates
    kernel_usable = has_kernel and (proved[last] or not guarded)
    pack = _pack(spec, variables, sizes, pre_reduce, replicas, kernel_usable,
                 elementwise_probe, on_servers=servers is not None)
    in_place = _in_place(has_kernel, kernel_usable, last in pre_reduce, all(masks[last]),
                         any(frozen), masters, pack.on)
    mode = options.jit_compile
    if mode is not True and mode is not False:
        if servers is not None:
            compile_ = Choice(False, "the variables live on parameter servers: XLA "
                                     "compiles for one device")
        elif replicas > 1:
            compile_ = Choice(False, f"{replicas} replicas: XLA compiles for one device")
        elif pack.on:
            compile_ = Choice(True, "packed: one small XLA function fuses the chain")
        else:
            compile_ = Choice(*xla_pays(sizes, in_place.on, distinct_shapes(variables),
                                        hint=True))
        compile_ = attrs.evolve(compile_, reason=f'"auto": {compile_.reason}')
    else:
        compile_ = Choice(bool(mode), f"jit_compile = {'true' if mode else 'false'}")
    if compile_.on and in_place.on:  # a compiled step never runs the kernel
        in_place = _KERNEL_IDLE
    checks, bounded, ranged, valued = _checks(spec, proved, pre_reduce, how_bounded,
                                              compiled=compile_.on, elements=sum(
                                                  s or 0 for s in sizes))
    return Plan(compile=compile_, pack=pack, in_place=in_place,
                sequence=_sequence(compile_.on, pack.on),
                clip_before_reduce=pre_reduce, checks=checks, bounded=bounded,
                ranged=ranged, valued=valued, servers=servers)


def _pack(spec: PipelineSpec, variables: list[Any], sizes: list[int | None],
          pre_reduce: tuple[int, ...], replicas: int, kernel_usable: bool,
          elementwise_probe: Any, on_servers: bool) -> Choice:
    mode = spec.options.pack_variables
    if mode is False:
        return Choice(False, "pack_variables = false")
    blocker = _pack_blocker(spec, variables, pre_reduce, replicas, on_servers)
    unpaid = ""  # why "auto" would not compile the variables one by one
    if not blocker and mode is not True:
        if len(variables) < AUTO_PACK_MIN_VARIABLES:
            many = "" if len(variables) == 1 else "s"
            return Choice(False, f'"auto": {len(variables)} variable{many}, fewer than the '
                                 f"{AUTO_PACK_MIN_VARIABLES} where packing pays")
        pays, unpaid = xla_pays(sizes, kernel_usable, distinct_shapes(variables))
        if pays:
            return Choice(False, f'"auto": {COMPILED_INSTEAD}: {unpaid}')
    if not blocker and elementwise_probe is not None:
        blocker = next((f"transform {t.name} {why}" for i, t in enumerate(spec.transforms)
                        if (why := elementwise_probe(i))), "")
    if blocker:
        if mode is True:
            raise GradpipeError(f"[pipeline] pack_variables = true, but {blocker}")
        return Choice(False, blocker)
    return Choice(True, "pack_variables = true" if mode is True else
                  f'"auto": {len(variables)} variables, not compiled one by one: {unpaid}')


def _pack_blocker(spec: PipelineSpec, variables: list[Any], pre_reduce: tuple[int, ...],
                  replicas: int, on_servers: bool) -> str:
    """Why ``variables`` cannot be packed ("" if they can)."""
    if pre_reduce:
        return "clip_before_reduce clips each replica's gradients separately"
    if replicas > 1 or tf.distribute.has_strategy():
        return "the step runs under a distribution strategy"
    if on_servers:
        return "the variables live on parameter servers"
    if spec.options.accumulation_steps > 1:
        return "accumulation_steps > 1 keeps one accumulator per variable"
    if spec.options.freeze or any(t.extra.get("variables") or t.extra.get("exclude")
                                  for t in spec.transforms):
        return "freeze, variables or exclude select among the variables"
    if any(v.dtype not in (tf.float32, tf.float16, tf.bfloat16) for v in variables):
        return "not every variable is float32 (or half precision, with float32 masters)"
    if any(v.shape.num_elements() is None for v in variables):
        return "a variable has an unknown shape"
    return ""


def _in_place(has_kernel: bool, usable: bool, pre_reduced: bool, sees_all: bool,
              frozen: bool, masters: bool, packed: bool) -> Choice:
    why = ("the last transform has no fused kernel" if not has_kernel else
           "the last transform's outputs are checked, which an in-place kernel would "
           "write before they could be" if not usable else
           "the last transform runs before the reduction" if pre_reduced else
           "the last transform sees only some variables" if not sees_all else
           "some variables are frozen" if frozen else
           "half-precision variables are updated through float32 masters" if masters else
           "the state is packed" if packed else "")
    return Choice(False, why) if why else _KERNEL_ON


_KERNEL_IDLE = Choice(False, "the step is compiled; the last rule's fused kernel serves "
                             "only an uncompiled step")
_KERNEL_ON = Choice(True, "the last rule's fused kernel, where the step is not compiled "
                          "and its gradients allow (dense, one replica, no summary writer)")


def kernel_idle(plan: Plan) -> bool:
    """Whether the last rule's fused kernel would serve the step were it not compiled."""
    return plan.in_place is _KERNEL_IDLE


def uncompiled(plan: Plan, why: str) -> Plan:
    """``plan`` with its step not compiled after all (``why``), the in-place kernel
    back where compiling had idled it."""
    off = "the step is not compiled"
    return attrs.evolve(plan, compile=Choice(False, why), sequence=Choice(False, off),
                        per_variable=Choice(False, off),
                        in_place=_KERNEL_ON if plan.in_place is _KERNEL_IDLE else plan.in_place)


def _sequence(compiled: bool, packed: bool) -> Choice:
    if not compiled or packed:
        return Choice(False, "the step is not compiled variable by variable")
    if accelerator_visible():
        return Choice(False, "an accelerator is set up; measured on CPU only")
    return Choice(True, "compiled on a CPU: large variables one after another")


def replicated(replicas: int) -> bool:
    """Whether a step traced now runs on replicas of a strategy. Not under parameter
    servers: each worker runs its own step, as one process would, on variables that
    live on the servers."""
    if replicas > 1:
        return True
    return tf.distribute.has_strategy() and not is_parameter_server(
        tf.distribute.get_strategy())


def fusion_blocker(grads: list[Any], replicas: int) -> str:
    """Why a step traced now may not take a fused path ("" if it may): a strategy's
    replicas, sparse gradients and summary ops keep the plain path."""
    if replicated(replicas):
        return "a distribution strategy"
    if any(isinstance(g, tf.IndexedSlices) for g in grads):
        return "sparse gradients"
    if writer_may_record():
        return "a summary writer"
    return ""
