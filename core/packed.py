"""Packed state: many variables' state in one vector (multi-tensor apply).

With many small variables a step is bound by the number of ops it launches,
not by memory bandwidth: a per-variable chain costs some twenty ops per
variable. When every transform of the chain is ``elementwise`` (its update at
one element depends only on that element and on scalars shared by all), the
chain gives the same result on all gradients concatenated into one vector.
The engine then keeps each state tensor as one packed ``tf.Variable``, runs
the chain once on the packed gradients (one XLA function where that is
allowed) and subtracts each variable's slice of the packed update: three ops
per variable. docs/performance.md measures it.

Checkpoints do not change: each variable's slice of a packed slot is saved
under the name its own slot variable would have (:class:`SlotView`), so a
packed and an unpacked pipeline restore each other's checkpoints.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

# The per-variable path of an unpacked leaf name: replaced by each variable's path.
PACKED_PATH = "*"

# "auto" packs where the per-variable step would not be compiled for its many or
# small variables, as long as there are enough of them for the op count to matter.
AUTO_PACK_MIN_VARIABLES = 16


def packing_blocker(pipe: Any, variables: Sequence[Any]) -> str:
    """Why ``variables`` cannot be packed for ``pipe`` ("" if they can)."""
    spec = pipe.spec
    not_elementwise = [t.name for t in spec.transforms
                       if not getattr(t.config, "elementwise", False)]
    if not_elementwise:
        return f"transforms {', '.join(not_elementwise)} do not declare elementwise"
    if pipe._pre_reduce:
        return "clip_before_reduce clips each replica's gradients separately"
    if pipe.strategy.num_replicas_in_sync > 1 or tf.distribute.has_strategy():
        return "the step runs under a distribution strategy"
    if spec.options.accumulation_steps > 1:
        return "accumulation_steps > 1 keeps one accumulator per variable"
    if spec.options.freeze or any(t.extra.get("variables") or t.extra.get("exclude")
                                  for t in spec.transforms):
        return "freeze, variables or exclude select among the variables"
    if any(v.dtype != tf.float32 for v in variables):
        return "not every variable is float32"
    if any(v.shape.num_elements() is None for v in variables):
        return "a variable has an unknown shape"
    return ""


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


class PackedVariables:
    """What an ``elementwise`` transform gets as ``variables`` when packed: one
    float32 vector of all of them, read (concatenated) only if converted."""

    def __init__(self, layout: PackedLayout, variables: Sequence[Any]) -> None:
        self._layout = layout
        self._variables = list(variables)
        self.shape = tf.TensorShape([layout.total])
        self.dtype = tf.float32
        self.name = "packed_variables"

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
