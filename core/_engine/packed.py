"""Packed state: many variables' state in one vector (multi-tensor apply).

With many small variables a step is bound by the number of ops it launches,
not by memory bandwidth: a per-variable chain costs some twenty ops per
variable. When every transform of the chain is elementwise (its update at one
element depends only on that element and on scalars shared by all), the chain
gives the same result on all gradients concatenated into one vector. No
transform is taken at its word: ``elementwise_mismatch`` runs each packed and
variable by variable on the same numbers before its state is packed.
The engine then keeps each state tensor as one packed ``tf.Variable``, runs
the chain once on the packed gradients (one XLA function where that is
allowed) and subtracts each variable's slice of the packed update: three ops
per variable. benchmarks/HISTORY.md measures it.

Checkpoints do not change: each variable's slice of a packed slot is saved
under the name its own slot variable would have (:class:`SlotView`), so a
packed and an unpacked pipeline restore each other's checkpoints.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

# The per-variable path of an unpacked leaf name: replaced by each variable's path.
PACKED_PATH = "*"


class PackedLayout:
    """Where each variable's elements lie in the packed vector."""

    def __init__(self, variables: Sequence[Any]) -> None:
        self.shapes = [v.shape for v in variables]
        self.sizes = [int(s.num_elements()) for s in self.shapes]
        self.offsets = [0, *itertools.accumulate(self.sizes)][:-1]
        self.total = sum(self.sizes)

    def pack(self, tensors: Sequence[Any]) -> tf.Tensor:
        """One float32 vector of ``tensors`` (``None``: zeros; sparse: made dense)."""
        parts = [tf.zeros([n]) if t is None else _flat(tf.convert_to_tensor(t))
                 for t, n in zip(tensors, self.sizes)]
        return tf.concat(parts, 0)

    def unpack(self, packed: Any) -> list[tf.Tensor]:
        return [part if shape.rank == 1 else tf.reshape(part, shape)
                for part, shape in zip(tf.split(packed, self.sizes), self.shapes)]

    def present(self, tensors: Sequence[Any]) -> tf.Tensor | None:
        """A mask of the elements whose gradient exists, ``None`` if all do."""
        if all(t is not None for t in tensors):
            return None
        return tf.concat([tf.fill([n], t is not None)
                          for t, n in zip(tensors, self.sizes)], 0)


def _flat(t: tf.Tensor) -> tf.Tensor:
    """A float32 vector of ``t``; no op at all for one already (a launch counts here)."""
    t = tf.cast(t, tf.float32)
    return t if t.shape.rank == 1 else tf.reshape(t, [-1])


class NameOfPackedVariables(AttributeError):
    """A transform read a variable's name, which packed variables do not have."""


class PackedVariables:
    """What an elementwise transform gets as ``variables`` when packed: one float32
    vector of all of them, read (concatenated) only if converted. It has no name:
    a transform that reads one (to exclude biases by a pattern, say) treats
    variables differently by name, and must not be packed."""

    def __init__(self, layout: PackedLayout, variables: Sequence[Any]) -> None:
        self._layout = layout
        self._variables = list(variables)
        self.shape = tf.TensorShape([layout.total])
        self.dtype = tf.float32

    @property
    def name(self) -> str:
        raise NameOfPackedVariables("packed variables have no name")

    path = name

    def read_value(self) -> tf.Tensor:
        return self._layout.pack([v.read_value() for v in self._variables])

    value = read_value


class SlotView(tf.__internal__.tracking.Trackable):
    """One variable's slice of a packed slot, saved as its own slot variable would be.

    Reads like a ``tf.Variable`` (``numpy()``, ``read_value()``, ``shape``);
    ``assign`` writes the slice.
    """

    def __init__(self, packed: tf.Variable, offset: int, shape: tf.TensorShape,
                 name: str) -> None:
        self._packed = packed
        self._offset = offset
        self._size = int(shape.num_elements())
        self.shape = shape
        self.dtype = packed.dtype
        self.name = name

    def _slice(self) -> Any:
        return self._packed[self._offset:self._offset + self._size]

    def read_value(self) -> tf.Tensor:
        return tf.reshape(self._slice(), self.shape)

    value = read_value

    def numpy(self) -> Any:
        return self.read_value().numpy()

    def assign(self, value: Any) -> Any:
        flat = tf.reshape(tf.cast(value, self.dtype), [self._size])
        return self._slice().assign(flat)

    def __repr__(self) -> str:
        return f"<SlotView {self.name!r} shape={self.shape} of a packed slot>"

    # -- what tf.train.Checkpoint calls: the key tf.Variable uses ------------

    def _serialize_to_tensors(self) -> dict[str, tf.Tensor]:
        return {"VARIABLE_VALUE": self.read_value()}

    def _restore_from_tensors(self, restored_tensors: dict[str, Any]) -> Any:
        return self.assign(restored_tensors["VARIABLE_VALUE"])


for _cls in (SlotView, PackedVariables):
    tf.register_tensor_conversion_function(
        _cls, lambda x, dtype=None, name=None, as_ref=False: x.read_value())


def elementwise_mismatch(transform: Any, context: Any) -> str:
    """Whether ``transform`` gives packed what it gives variable by variable: "" if it
    does, else how it differs. Three small variables of different shapes and
    names, four steps of gradients at scales 1e-3, 1, 1 and 1e3 (two alike, where a
    rule's history weighs as much as the gradient: an accumulator kept per axis
    shows), one gradient missing: a transform that reads a variable's own norm,
    size, shape or name gives other numbers packed, and is run variable by
    variable."""
    from ..transform import build_scope

    rng = np.random.default_rng(0)
    shapes = {"dense/kernel": (2, 3), "dense/bias": (5,), "embedding/embeddings": (1, 2, 2)}
    variables = [tf.Variable(np.linspace(-1, 1, int(np.prod(s)), dtype="f4").reshape(s),
                             name=name) for name, s in shapes.items()]
    layout = PackedLayout(variables)
    steps: list[list[Any]] = [[rng.normal(size=s).astype("f4") * scale
                               for s in shapes.values()] for scale in (1e-3, 1.0, 1.0, 1e3)]
    steps[1][1] = None  # a variable without a gradient
    try:
        with build_scope(context):
            split = transform.init(variables)
            packed = transform.init([tf.zeros([layout.total])])
            wrong = [t.shape for t in tf.nest.flatten(packed)
                     if tf.convert_to_tensor(t).shape.rank not in (0, None)
                     and tf.convert_to_tensor(t).shape != [layout.total]]
            if wrong:
                return (f"keeps state of shape {wrong[0]} for one packed vector of "
                        f"{layout.total}")
            stand_in = [PackedVariables(layout, variables)]
            for grads in steps:
                context.shared.clear()
                ours, split = transform.update(
                    [None if g is None else tf.constant(g) for g in grads], split, variables)
                context.shared.clear()
                theirs, new = transform.update(
                    [layout.pack([None if g is None else tf.constant(g) for g in grads])],
                    packed, stand_in)
                present = layout.present(grads)  # as the step does: no gradient, no change
                packed = new if present is None else tf.nest.map_structure(
                    lambda n, o, p=present: tf.where(p, n, o) if n.shape == [layout.total]
                    else n, new, packed)
                for a, b, name in zip(ours, layout.unpack(theirs[0]), shapes):
                    if a is not None and not np.allclose(tf.convert_to_tensor(a), b,
                                                         rtol=1e-5, atol=1e-6):
                        return ("is not elementwise: packed into one vector it gives "
                                f"{name} other updates than variable by variable")
            if _rows_differ(transform, context, split, variables, rng):
                return ("updates only the rows a sparse gradient touches (lazy), which "
                        "packed into one vector would be made dense")
    except NameOfPackedVariables:
        return "reads the variables' names, which packed into one vector they lack"
    except Exception as exc:
        return (f"failed run packed into one vector: {type(exc).__name__}: "
                f"{str(exc)[:200]}")
    finally:
        context.shared.clear()
    return ""


def _rows_differ(transform: Any, context: Any, state: Any, variables: list[Any],
                 rng: Any) -> bool:
    """Whether a sparse gradient (rows) gives other updates or state than the same
    gradient made dense: a lazy rule, whose maths a packed step would change (sgd
    without momentum keeps rows too, but gives the same numbers)."""
    shape = variables[0].shape
    rows = tf.IndexedSlices(tf.constant(rng.normal(size=(1, shape[1])).astype("f4")),
                            tf.constant([1], tf.int64), tf.constant(shape, tf.int64))
    outputs = []
    for g in (rows, tf.convert_to_tensor(rows)):
        context.shared.clear()
        try:
            updates, new = transform.update([g] + [None] * (len(variables) - 1), state,
                                            variables)
        except Exception:  # maths for dense gradients only: the step gives it dense ones
            return False
        outputs.append([tf.convert_to_tensor(t) for t in tf.nest.flatten([updates[0], new])
                        if t is not None])
    return any(not np.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(*outputs))
