"""The transform interface and hyperparameters that follow schedules.

A transform is a pair of pure functions over TensorFlow tensors (optax style):

* ``init(variables) -> state``
* ``update(grads, state, variables) -> (updates, state)``

The engine owns a ``tf.Variable`` for each state tensor, so a transform never
creates variables and can run eagerly, in ``tf.function``, under XLA and in a
replica context alike.

A float hyperparameter may be a schedule. ``hyper(cfg.learning_rate)`` turns
the config value into a zero-argument callable that returns the value at the
pipeline's current step as a float32 tensor. The step source is bound when the
component is built (``build_scope``), so evaluating it inside a traced step
reads a ``tf.Variable`` and a changing step never retraces.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

from .fields import ScheduleRef, is_constant


class Transform(NamedTuple):
    """A gradient transform: ``init(variables)`` and ``update(grads, state, variables)``."""

    init: Callable[[Sequence[Any]], Any]
    update: Callable[[Sequence[Any], Any, Sequence[Any]], tuple[list[Any], Any]]


def no_state(variables: Sequence[Any]) -> tuple[()]:
    """``init`` of a stateless transform."""
    del variables
    return ()


def map_grads(fn: Callable[..., Any], grads: Sequence[Any], *rest: Sequence[Any]) -> list[Any]:
    """Apply ``fn(g, *others)`` to every non-``None`` gradient; keep ``None`` as is.

    A gradient comes as it is, a ``tf.IndexedSlices`` too (an embedding's): where ``fn``
    fails on one, the engine makes them dense first (the plan's ``by rows`` says so)."""
    return [None if g is None else fn(g, *others) for g, *others in zip(grads, *rest)]


class _BuildScope(threading.local):
    def __init__(self) -> None:
        self.stack: list[BuildContext] = []


_SCOPE = _BuildScope()


class BuildContext:
    """What a component factory can reach while it is being built.

    Attributes:
        step: zero-argument callable returning the current step (a tensor).
        resolve_schedule: turns a schedule spec or reference into a schedule.
        shared: values shared between the transforms of one pipeline, such as
            the global gradient norm, keyed by name.
    """

    def __init__(self, step: Callable[[], Any],
                 resolve_schedule: Callable[[Any], Callable[[Any], Any]]) -> None:
        self.step = step
        self.resolve_schedule = resolve_schedule
        self.shared: dict[str, Any] = {}


@contextlib.contextmanager
def build_scope(context: BuildContext) -> Iterator[BuildContext]:
    _SCOPE.stack.append(context)
    try:
        yield context
    finally:
        _SCOPE.stack.pop()


def current_context() -> BuildContext:
    if not _SCOPE.stack:
        return _default_context()
    return _SCOPE.stack[-1]


def _default_context() -> BuildContext:
    def step() -> Any:
        import tensorflow as tf

        return tf.constant(0, tf.int64)

    def resolve(value: Any) -> Callable[[Any], Any]:
        from .components import build_component

        if isinstance(value, ScheduleRef):
            from .errors import GradpipeError

            raise GradpipeError(
                f"schedule reference {value} can only be resolved inside a pipeline"
            )
        return build_component(value)

    return BuildContext(step, resolve)


class SettableRate(float):
    """A constant ``learning_rate`` that training may set (Keras's
    ``optimizer.learning_rate = x``), as the engine hands it to an update rule's
    factory: it is the number the file gave, for every check of the config,
    and :func:`hyper` turns it into a read of the pipeline's variable."""

    read: Callable[[], Any] | None
    read_by_hyper: bool

    def __new__(cls, value: float, read: Callable[[], Any] | None = None) -> SettableRate:
        rate = super().__new__(cls, value)
        rate.read = read
        rate.read_by_hyper = False
        return rate


def hyper(value: Any) -> Callable[[], Any]:
    """A callable returning ``value`` at the current step as a float32 scalar.

    ``value`` is what a ``hyperparameter()`` field holds: a number, a
    ``"@name"`` reference or an inline schedule. Call it inside ``update``.
    The callable's ``constant`` is the number where the value can never change,
    else ``None`` (a schedule, or a learning rate training may set).
    """
    import tensorflow as tf

    if isinstance(value, SettableRate) and value.read is not None:
        value.read_by_hyper = True
        read = value.read

        def current() -> Any:
            return read()

        current.constant = None  # type: ignore[attr-defined]
        return current
    if is_constant(value):
        constant = float(value)

        def fixed() -> Any:
            return tf.constant(constant, tf.float32)

        fixed.constant = constant  # type: ignore[attr-defined]
        return fixed
    context = current_context()
    schedule = context.resolve_schedule(value)
    step = context.step

    def evaluate() -> Any:
        return tf.cast(schedule(step()), tf.float32)

    evaluate.schedule = schedule  # type: ignore[attr-defined]
    evaluate.constant = None  # type: ignore[attr-defined]
    return evaluate


def one_minus(value: Callable[[], Any], dtype: Any) -> Any:
    """``1 - value`` in ``dtype``; for a constant, computed in Python float64 first.

    Keras computes ``1 - beta`` in Python, so doing the same keeps parity exact.
    """
    import tensorflow as tf

    constant = getattr(value, "constant", None)
    if constant is not None:
        return tf.constant(1.0 - constant, dtype)
    return 1 - tf.cast(value(), dtype)


def schedule(value: Any) -> Callable[[Any], Any]:
    """The schedule ``step -> value`` that a ``schedule_field`` (or hyperparameter) holds.

    Schedule factories use it to build the schedules they wrap (``warmup``,
    ``sequence``). A plain number becomes a constant schedule.
    """
    if is_constant(value):
        constant = float(value)

        def fixed(step: Any) -> Any:
            import tensorflow as tf

            return tf.fill(tf.shape(step), tf.constant(constant, tf.float32))

        return fixed
    return current_context().resolve_schedule(value)


def shared() -> dict[str, Any]:
    """Per-pipeline values transforms share at trace time (e.g. the global norm)."""
    return current_context().shared


# -- what a step knows about its gradients (call these inside ``update``) ------
#
# The engine traces each step inside the pipeline's build scope and clears
# ``shared`` first, so these values live for one trace of one step.

def squared_norm(grads: Sequence[Any]) -> Any:
    """Sum of squares, in float32, of every non-``None`` tensor in ``grads``.

    Reuses a value already known for these exact tensors (the engine computes it
    with its finite check, in the same pass over the gradients), so a transform
    that needs the global norm of its input costs no extra pass.
    """
    known = current_context().shared.get("squared_norms", {}).get(_key(grads))
    if known is not None:
        return known[1]
    value = sum_of_squares(grads)
    record_squared_norm(grads, value)
    return value


def sum_of_squares(tensors: Sequence[Any], *, nan_unless_finite: bool = False) -> Any:
    """Float32 sum of squares of every non-``None`` tensor (IndexedSlices: as if dense).

    One read of each tensor, with no temporary of its size. Outside XLA that is
    TF's fused ``L2Loss`` kernel (halving is exact). Inside an XLA function on CPU
    (the compiled step, or a train step the user compiles) see
    ``_folded_sum_of_squares``; there a tensor computed in the same function is
    materialised first, as XLA's own reduction would materialise it.

    ``nan_unless_finite`` (inside XLA only, see ``in_xla_function``): a square is
    NaN where its element is not finite, so the sum is NaN exactly where an element
    is not finite, and otherwise the same (``inf`` only where it overflows): a
    finite check in the same loop, with no conditional.
    """
    import tensorflow as tf

    values = [_dense_values(g) for g in tensors if g is not None]
    if not values:
        return tf.constant(0.0)

    def squares(x: Any) -> Any:  # cast where squared: XLA fuses it into the summing loop
        x = tf.cast(x, tf.float32)
        if not nan_unless_finite:
            return tf.square(x)
        # not ``x*x + x*0``: XLA folds ``(y * c) * 0`` into ``y * 0``, which is 0 for a
        # finite ``y`` whose product with ``c`` overflows, so that sum missed an inf
        return tf.where(tf.math.is_finite(x), tf.square(x), float("nan"))

    if in_xla_function():
        if not accelerator_visible():
            return tf.add_n([_folded_sum_of_squares(v, squares) for v in values])
        if nan_unless_finite:
            return tf.add_n([tf.reduce_sum(squares(v)) for v in values])
    return 2.0 * tf.add_n([tf.nn.l2_loss(tf.cast(v, tf.float32)) for v in values])


# A tensor of at least FOLD_ROWS * FOLD_MIN_ROW elements is folded before it is summed;
# the folded row is then summed FOLD_WIDTH elements at a time by a matrix-vector product.
FOLD_ROWS = 16
FOLD_MIN_ROW = 128
FOLD_WIDTH = 32


def _folded_sum_of_squares(value: Any, squares: Callable[[Any], Any]) -> Any:
    """XLA's CPU reduction is one sequential loop of dependent additions (3-4 GB/s
    against 15-20 for its elementwise loops). So the tensor is first folded: read
    as a ``[FOLD_ROWS, row]`` view, squared and summed over its rows (4 ops to
    compile; a split into slices, added, took three a slice), a loop XLA
    vectorises and splits across threads, which writes a row of 1/FOLD_ROWS of the
    tensor. That row, read as a ``[k, FOLD_WIDTH]`` matrix, is multiplied by a
    vector of ones into ``k`` partial sums, and only those are reduced (with the
    row's last ``row % FOLD_WIDTH`` elements): benchmarks/HISTORY.md."""
    import tensorflow as tf

    flat = tf.reshape(value, [-1])
    size = flat.shape[0]
    if size is None or size < FOLD_ROWS * FOLD_MIN_ROW:
        return tf.reduce_sum(squares(flat))
    row = size // FOLD_ROWS
    folded = tf.reduce_sum(tf.reshape(squares(flat[:FOLD_ROWS * row]), [FOLD_ROWS, row]), 0)
    k = row // FOLD_WIDTH
    partial_sums = tf.linalg.matvec(tf.reshape(folded[:k * FOLD_WIDTH], [k, FOLD_WIDTH]),
                                    tf.ones([FOLD_WIDTH]))
    rest = flat[FOLD_ROWS * row:]  # fewer than FOLD_ROWS elements
    return (tf.reduce_sum(partial_sums) + tf.reduce_sum(folded[k * FOLD_WIDTH:])
            + tf.reduce_sum(squares(rest)))


def accelerator_visible() -> bool:
    """A GPU or TPU is set up: XLA's reductions there are parallel trees, and the
    fold, measured only on CPU, is left out."""
    import tensorflow as tf

    return any(tf.config.list_logical_devices(kind) for kind in ("GPU", "TPU"))


def in_xla_function() -> bool:
    """Whether ops built now will be compiled by XLA (``jit_compile=True``)."""
    try:  # TF's own test for this is internal: without it, L2Loss everywhere
        from tensorflow.python.framework import ops
        from tensorflow.python.ops import control_flow_util
    except ImportError:
        return False

    return bool(control_flow_util.GraphOrParentsInXlaContext(ops.get_default_graph()))


def keep_where_skipped(new: Any, old: Any) -> Any:
    """``new`` where this step applies, ``old`` where the engine skips it (nests).

    Optional, for speed only: the engine keeps every transform's state on a
    skipped step by itself. A transform that computes its updates *from* the
    state this returns lets the compiled step write each slot once and read it
    back once (``adam`` and ``sgd`` do). Outside a compiled step it is ``new``.
    """
    context = current_context().shared
    applies = context.get(APPLIES)
    if applies is None:
        return new
    import tensorflow as tf

    kept = context.setdefault(KEPT, {})

    def keep(n: Any, o: Any) -> Any:
        selected = tf.where(applies, n, o)
        kept[id(selected)] = o  # the engine checks ``o`` is the state it handed in
        return selected

    return tf.nest.map_structure(keep, new, old)


#: ``shared`` keys of the compiled step: whether it applies, and the tensors
#: ``keep_where_skipped`` returned (id -> the old value each keeps).
APPLIES, KEPT = "gradpipe.applies", "gradpipe.kept"


def record_squared_norm(grads: Sequence[Any], value: Any) -> None:
    """Record the sum of squares of ``grads`` (or an upper bound of it) for reuse."""
    norms = current_context().shared.setdefault("squared_norms", {})
    norms[_key(grads)] = (list(grads), value)  # the list keeps the ids in the key alive


def dedupe(g: Any) -> Any:
    """IndexedSlices with unique, summed rows (what densifying would give)."""
    import tensorflow as tf

    unique, positions = tf.unique(g.indices)
    values = tf.math.unsorted_segment_sum(g.values, positions, tf.shape(unique)[0])
    return tf.IndexedSlices(values, unique, g.dense_shape)


def _key(grads: Sequence[Any]) -> tuple[int, ...]:
    return tuple(id(g) for g in grads)


def _dense_values(g: Any) -> Any:
    import tensorflow as tf

    return dedupe(g).values if isinstance(g, tf.IndexedSlices) else g
