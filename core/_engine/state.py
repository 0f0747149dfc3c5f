"""Where a pipeline keeps its state: named ``tf.Variable``s, masks, accumulators.

Transforms are pure functions; this store owns one ``tf.Variable`` per state
tensor, named after the transform and the variable it belongs to
(``slots/1_adam/mu/sequential.dense.kernel``, see :mod:`gradpipe.names`).
``tf.train.Checkpoint`` saves each under that name, never by position, and a
restore pairs the saved names with this model's the way a ``.keras`` load
does, so a second instance of a model (``sequential_1.dense_2.kernel``)
restores exactly, built before the restore or after it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import attrs
import tensorflow as tf

from ..distribute import in_its_scope, is_parameter_server
from ..errors import GradpipeError
from ..names import leaf_names, matched_layout, variable_path
from ..spec import PipelineSpec
from .packed import PACKED_PATH, PackedLayout, PackedVariables, SlotView
from .shards import Shards, StepLock, tf_variable, variable_key
from .step_ops import exactly_one_after


@attrs.define(kw_only=True)
class Counters:
    """The pipeline's counters (owned and checkpointed by the Pipeline)."""

    iterations: tf.Variable
    skipped: tf.Variable
    micro_steps: tf.Variable


class _Untracked:
    """Holds references that must not become part of the pipeline's checkpoint."""

    def __init__(self, items: list[Any]) -> None:
        self.items = items


class StateStore(tf.Module):
    """Per-transform state variables and gradient accumulators."""

    def __init__(self, spec: PipelineSpec) -> None:
        super().__init__(name="state")
        self._spec = spec
        self._vars = _Untracked([])
        self._model_vars = _Untracked([])
        self._params = _Untracked([])
        self.slots: dict[str, dict[str, tf.Variable]] = {}
        # What read() and write() use: the slots, or the packed vectors (untracked:
        # a checkpoint holds their SlotViews instead).
        self._leaves = _Untracked([{}])
        self.packing: PackedLayout | None = None
        self._pending = _Untracked([None])  # scratch, not state: never checkpointed
        self.present: tf.Tensor | None = None
        self.accumulators: dict[str, tf.Variable] = {}
        self.masters: dict[str, tf.Variable] = {}
        self._layout = _Untracked([])
        self._owners: dict[str, dict[str, int | None]] = {}  # leaf -> its variable
        self.masks: list[list[bool]] = []
        self.frozen: list[bool] = []
        # What a checkpoint holds, by stable name (see _trackable_children).
        self._named = _Untracked([{}])
        # A layout restored before the state existed: matched when build() makes it.
        self.pending_restore: dict[str, list[int]] | None = None
        self.built = False
        self.lock: StepLock | None = None
        self._shards = _Untracked([None])  # the build's Shards: align() splits by them

    @property
    def by_name(self) -> dict[str, Any]:
        """Every per-variable state variable (slots, accumulators, masters) by name."""
        return self._named.items[0]

    @property
    def variables(self) -> list[Any]:
        """What transforms see and update: float32 masters stand in for half variables;
        packed, one stand-in for all (:class:`~gradpipe._engine.packed.PackedVariables`)."""
        return self._vars.items

    @property
    def _leaf_variables(self) -> dict[str, dict[str, tf.Variable]]:
        """Per transform key, the variables read() and write() use, by leaf name."""
        return self._leaves.items[0]

    @property
    def pending(self) -> tf.Variable:
        """Packed: where the step leaves its update for ``_subtract_packed``."""
        return self._pending.items[0]

    @property
    def parameters(self) -> list[Any]:
        """The variables the step updates, one per model variable (masters included)."""
        return self._params.items if self.packing else self.variables

    @property
    def model_variables(self) -> list[Any]:
        return self._model_vars.items

    @property
    def compute_dtypes(self) -> list[Any]:
        return [v.dtype for v in self.variables]

    def build(self, shards: Shards, *, transforms: list[Any], strategy: Any,
              masks: list[list[bool]], frozen: list[bool], pack: bool) -> None:
        """Create the state of ``transforms`` for ``shards.variables`` in ``strategy``'s
        scope, each variable's beside it on a parameter server; ``masks``/``frozen`` say
        which variables each transform sees and which are never updated
        (:mod:`gradpipe._engine.selection`), ``pack`` whether the state is one
        vector each (the plan decides)."""
        if self.built:
            return
        self._shards = _Untracked([shards])
        variables, raw_paths, paths = shards.variables, shards.paths, shards.stems
        self._index = {variable_key(v): i for i, v in enumerate(variables)}
        variables = [tf_variable(v) for v in variables]
        colocated = is_parameter_server(strategy)
        if colocated:  # one step at a time: see shards.StepLock
            self.lock = StepLock(variables[0])

        def beside(var: Any) -> Any:
            """On parameter servers, state is created on its variable's server."""
            return (strategy.extended.colocate_vars_with(var) if colocated and var is not None
                    else contextlib.nullcontext())
        self._model_vars.items = list(variables)
        self.masks, self.frozen = masks, frozen
        with in_its_scope(strategy):
            # OpenSeq2Seq MixedPrecisionOptimizerWrapper: half-precision variables get
            # float32 master copies; the update runs on the master and is cast back.
            compute = []
            for path, raw, var in zip(paths, raw_paths, variables):
                if var.dtype in (tf.float16, tf.bfloat16):
                    # Named like the model variable, so patterns match it the same way.
                    with beside(var):
                        self.masters[path] = tf.Variable(
                            tf.cast(var.read_value(), tf.float32), trainable=False, name=raw)
                    compute.append(self.masters[path])
                else:
                    compute.append(var)
            self._vars.items = compute
            variables = compute
            if pack:
                self.packing = PackedLayout(variables)
                self._params.items = list(variables)
                self._vars.items = [PackedVariables(self.packing, variables)]
                self.masks = [[True] for _ in self.masks]
                self.frozen = [False]
                self._pending.items[0] = tf.Variable(
                    tf.zeros([self.packing.total]), trainable=False, name="packed_update")
            for i, (spec, transform) in enumerate(zip(self._spec.transforms, transforms)):
                key = f"{i}_{spec.name}"
                if self.packing:
                    state = transform.init([tf.zeros([self.packing.total])])
                    names, owners = leaf_names(state, [PACKED_PATH])
                else:
                    state = transform.init(self._selected(i, variables))
                    names, owners = leaf_names(state, paths)
                self._owners[key] = dict(zip(names, owners))
                leaves, slots = {}, {}
                for name, leaf, owner in zip(names, tf.nest.flatten(state), owners):
                    initial = tf.convert_to_tensor(leaf)
                    with beside(None if owner is None else variables[owner]):
                        leaves[name] = tf.Variable(initial, trainable=False,
                                                   name=f"{key}/{name}".replace("/", "_"))
                    if PACKED_PATH in name:
                        slots.update(self._views(key, name, leaves[name], paths))
                    else:
                        slots[name] = leaves[name]
                self.slots[key] = slots
                self._leaf_variables[key] = leaves
                # Keep init()'s structure, not its tensors: a slot adopts its initial
                # tensor's buffer, which XLA's first step replaces; a tensor held
                # here would keep that old buffer, a copy of the slot, alive.
                structure = tf.nest.pack_sequence_as(state, list(range(len(names))))
                self._layout.items.append((key, structure, names))
            if self._spec.options.accumulation_steps > 1:
                for path, var in zip(paths, variables):
                    with beside(var):
                        self.accumulators[path] = tf.Variable(
                            tf.zeros(var.shape, _master_dtype(var.dtype)),
                            trainable=False, name=f"accumulator_{path}")
        for key, slots in self.slots.items():
            grouped = shards.grouped(slots, self._owners[key])
            self.by_name.update({f"slots/{key}/{name}": var for name, var in grouped.items()})
        self.by_name.update({f"accumulators/{p}": v for p, v in self.accumulators.items()})
        self.by_name.update({f"masters/{p}": v for p, v in self.masters.items()})
        self.built = True

    def _selected(self, i: int, variables: list[Any]) -> list[Any]:
        """What transform ``i``'s ``init`` is given: the variables it selects, and for
        each other one an empty tensor of its dtype, so that a rule limited to some
        variables (``variables``, ``exclude``) keeps no slots for the rest. Its
        ``update`` sees ``None`` gradients for them and passes their state on."""
        return [var if seen else tf.zeros([0], var.dtype)
                for var, seen in zip(variables, self.masks[i])]

    def _views(self, key: str, name: str, packed: tf.Variable,
               paths: list[str]) -> dict[str, SlotView]:
        """Each variable's slice of a packed slot, named as its own slot would be."""
        layout = self.packing
        assert layout is not None
        if packed.shape != [layout.total]:
            raise GradpipeError(
                f"transform {key!r}: init() of the packed vector gave {name!r} the "
                f"shape {packed.shape}, not [{layout.total}]")
        views = (SlotView(packed, offset, shape, name.replace(PACKED_PATH, path))
                 for path, offset, shape in zip(paths, layout.offsets, layout.shapes))
        return {view.name: view for view in views}

    # -- checkpoints: saved by name, restored by matching names ----------------

    def _trackable_children(self, save_type: str = "checkpoint", **kwargs: Any
                            ) -> dict[str, Any]:
        return dict(self.by_name)

    def _lookup_dependency(self, name: str, cached_dependencies: Any = None) -> Any:
        # Never by the saved name alone: TensorFlow then defers each saved entry
        # (_deferred_dependencies), and restore_by_name pairs all of them at once
        # once the pipeline's layout, restored after every lookup, is known.
        del name, cached_dependencies
        return None

    def restore_by_name(self, saved: dict[str, list[int]], expected: dict[str, list[int]],
                        where: str) -> None:
        """Restore the deferred saved entries into this state, names matched.

        ``saved`` and ``expected`` are the name -> shape layouts of the whole
        pipeline. Anything that does not pair (a name, a shape, an entry of an
        older layout) is a ``GradpipeError`` naming it, raised before any value
        is restored: never a silent fresh start.
        """
        pending = self._deferred_dependencies
        try:
            matched, difference = matched_layout(expected, saved)
            if difference:
                raise GradpipeError(f"{where} was written by a different pipeline: "
                                    f"{difference}")
            absent = sorted(name for old, name in matched.items()
                            if name in self.by_name and old not in pending)
            if absent:
                raise GradpipeError(
                    f"{where} lists {', '.join(absent)} in its layout but holds no value "
                    "for them: it was written in another layout of the state (an older "
                    "gradpipe); restore it with that version")
            for old, name in matched.items():
                if name in self.by_name:
                    self._handle_deferred_dependencies(name=old, trackable=self.by_name[name])
        except GradpipeError:
            # the error says what was not restored: TF need not list each value again
            for position in (p for positions in pending.values() for p in positions):
                position.checkpoint.expect_partial = True
            raise
        finally:
            pending.clear()

    def align(self, pairs: Sequence[tuple[Any, Any]]) -> list[Any]:
        """Gradients in the order of the built variables; ``None`` where absent."""
        grads: list[Any] = [None] * len(self._index)
        for g, v in self._shards.items[0].split(pairs):
            index = self._index.get(variable_key(v))
            if index is None:
                raise GradpipeError(
                    f"variable {variable_path(v)!r} was not among the variables this "
                    "pipeline was built for; build a new pipeline (or keras_optimizer()) "
                    "for a new model")
            grads[index] = g
        return grads

    def read(self, i: int, sparse: set[int] | frozenset[int] = frozenset()) -> Any:
        """Transform ``i``'s state as tensors; the slots of the variables in ``sparse``
        (whose gradients are IndexedSlices) as their ``tf.Variable``s. A transform
        ``tf.gather``s those rows from the variable itself: gathered from a read of
        the whole slot, the later write of the rows would copy the whole slot first
        (TF copies a variable's buffer that a live tensor still shares)."""
        key, structure, names = self._layout.items[i]
        leaves, owners = self._leaf_variables[key], self._owners[key]
        return tf.nest.pack_sequence_as(structure, [
            leaves[n] if owners[n] in sparse else leaves[n].read_value() for n in names])

    def layout_items(self) -> list[tuple[str, Any, list[str]]]:
        """``(key, structure, slot names)`` of every transform, in chain order."""
        return list(self._layout.items)

    def owners(self, i: int) -> list[int | None]:
        """For each of transform ``i``'s leaves, in ``layout_items`` order, the index of
        the variable it belongs to (``None``: shared by all)."""
        key, _, names = self._layout.items[i]
        return [self._owners[key][n] for n in names]

    def leaf_variables(self, i: int) -> dict[str, tf.Variable]:
        """Transform ``i``'s state variables by leaf name (unpacked state)."""
        return dict(self._leaf_variables[self._layout.items[i][0]])

    def slot_variables(self, i: int) -> Any:
        """Transform ``i``'s state as its ``tf.Variable``s, in ``init``'s structure."""
        key, structure, names = self._layout.items[i]
        leaves = self._leaf_variables[key]
        return tf.nest.pack_sequence_as(structure, [leaves[n] for n in names])

    def write(self, new_states: dict[int, Any], after: dict[int, tf.Tensor] | None = None,
              kept: set[int] | None = None) -> list[Any]:
        """Assign the new state of each transform in ``new_states`` (index -> state).

        ``after``: variable index -> a scalar of its new value. Each slot of such a
        variable is then written after it, by a data dependency: compiled, the
        variable's update reads the old slot, and a slot written first would have
        XLA copy it (one copy of every slot per step). Not the leaves whose ids are
        in ``kept``: the transform computed its updates from those."""
        ops = []
        for i, state in new_states.items():
            key, structure, names = self._layout.items[i]
            try:
                tf.nest.assert_same_structure(structure, state)
            except (ValueError, TypeError) as exc:
                raise GradpipeError(
                    f"transform {key!r} returned a state whose structure differs from "
                    f"its init(): {exc}") from None
            leaves = self._leaf_variables[key]
            for name, value in zip(names, tf.nest.flatten(state)):
                leaf = leaves[name]
                if isinstance(value, tf.IndexedSlices):  # new rows: only they are written
                    ops.append(leaf.scatter_update(tf.IndexedSlices(
                        tf.cast(value.values, leaf.dtype), value.indices, value.dense_shape)))
                    continue
                owner = self._owners[key][name]
                previous = None if after is None or owner is None else after.get(owner)
                if id(value) in (kept or ()):
                    previous = None  # its variable's update reads it as written
                value = tf.cast(value, leaf.dtype)
                if previous is not None and leaf.dtype.is_floating:
                    value = value * exactly_one_after(previous, leaf.dtype)
                if self.present is not None and PACKED_PATH in name:
                    # elements without a gradient keep their state, as unpacked
                    value = tf.where(self.present, value, leaf.read_value())
                ops.append(leaf.assign(value))
        return ops

    def per_variable(self, updates: list[Any]) -> tuple[list[Any], list[Any]]:
        """``(parameters, updates)`` one per variable, unpacking a packed update."""
        return self.parameters, (updates if self.packing is None
                                 else self.packing.unpack(updates[0]))

    def refresh_from_masters(self, updates: list[Any]) -> list[Any]:
        """Copy updated float32 masters into their half-precision variables."""
        ops = []
        for var, compute, update in zip(self.model_variables, self.variables, updates):
            if compute is not var and update is not None:
                ops.append(var.assign(tf.saturate_cast(compute.read_value(), var.dtype)))
        return ops


def _master_dtype(dtype: Any) -> Any:
    return tf.float32 if dtype in (tf.float16, tf.bfloat16) else dtype
