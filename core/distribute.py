"""Cross-replica reduction with CrossShardOptimizer semantics, for placements.

``reduction = "mean"`` divides the loss by the number of replicas (or by the
group size) and then *sums* gradients, so the sum is the mean; ``"sum"`` does
not divide. Gradients are reduced once, in one batched call, inside the
replica context, before the loss scaler and the transforms see them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .errors import PlacementError


def validate_group_assignment(groups: Any, num_replicas: int | None = None
                              ) -> list[list[int]] | None:
    """Check ``group_assignment`` as CrossShardOptimizer does, and reject duplicates.

    Returns ``None`` for no grouping (``None`` or ``[]``), else the groups.
    """
    if not groups:
        return None
    if not isinstance(groups, list) or not all(isinstance(g, list) for g in groups):
        raise PlacementError("Argument `group_assignment` must be a list of lists. "
                             f"Received: {groups!r}")
    if any(not all(isinstance(i, int) and not isinstance(i, bool) for i in g)
           for g in groups):
        raise PlacementError("Argument `group_assignment` must hold integer replica ids. "
                             f"Received: {groups!r}")
    sizes = {len(g) for g in groups}
    if len(sizes) != 1:
        raise PlacementError("The size of each subgroup in `group_assignment` must be "
                             f"equal. Received: {groups!r}")
    flat = [i for g in groups for i in g]
    if len(flat) != len(set(flat)):
        duplicates = sorted({i for i in flat if flat.count(i) > 1})
        raise PlacementError(  # the reference only compares sets and lets these through
            f"Argument `group_assignment` lists replica ids {duplicates} more than once. "
            f"Received: {groups!r}")
    if num_replicas is not None and set(flat) != set(range(num_replicas)):
        raise PlacementError("Argument `group_assignment` must be a permutation of "
                             f"range({num_replicas}). Received: {groups!r}")
    return groups


def group_matrix(groups: list[list[int]]) -> list[list[float]]:
    """``M[i][j] = 1`` when replica ``j`` is in replica ``i``'s group."""
    n = sum(len(g) for g in groups)
    matrix = [[0.0] * n for _ in range(n)]
    for group in groups:
        for i in group:
            for j in group:
                matrix[i][j] = 1.0
    return matrix


def all_reduce_sum(grads: Sequence[Any], groups: list[list[int]] | None = None,
                   tpu: bool = False) -> list[Any]:
    """SUM all-reduce of the non-None gradients, once; per group when groups are given.

    Outside a replica context, or with one replica, gradients pass unchanged.
    On TPU, groups use ``cross_replica_sum(g, group_assignment)``; elsewhere each
    replica gathers every replica's value and sums its own group's rows.
    """
    import tensorflow as tf

    ctx = tf.distribute.get_replica_context()
    if ctx is None or ctx.num_replicas_in_sync == 1:
        return list(grads)
    present = [g for g in grads if g is not None]
    if groups is None or len(groups) == 1:
        reduced = iter(ctx.all_reduce(tf.distribute.ReduceOp.SUM, present))
    elif tpu:
        reduced = iter([tf.compat.v1.tpu.cross_replica_sum(tf.convert_to_tensor(g), groups)
                        for g in present])
    else:
        weights = tf.gather(tf.constant(group_matrix(groups)), ctx.replica_id_in_sync_group)
        summed = []
        for g in present:
            g = tf.convert_to_tensor(g)
            gathered = ctx.all_gather(g[tf.newaxis], axis=0)  # [replicas, ...]
            summed.append(tf.tensordot(tf.cast(weights, g.dtype), gathered, axes=1))
        reduced = iter(summed)
    return [None if g is None else next(reduced) for g in grads]


def shards_of(var: Any) -> list[Any] | None:
    """The shards of a variable split over parameter servers (a ``ShardedVariable``,
    or a Keras 3 variable that holds one), in row order; ``None`` for any other."""
    import tensorflow as tf

    sharded = tf.__internal__.distribute.ShardedVariable
    inner = var if isinstance(var, sharded) else getattr(var, "_value", None)
    return list(inner.variables) if isinstance(inner, sharded) else None


def gradient_sources(variables: Sequence[Any]) -> list[Any]:
    """What to give ``GradientTape.gradient`` for ``variables``: each variable that is
    split over parameter servers replaced by its shards, the others as they are.

    ``tape.gradient`` cannot differentiate a Keras 3 variable whose value is
    sharded, but it can its shards; an embedding lookup gives each shard the
    rows it owns. Pass the result to ``pipe.apply_gradients`` too::

        sources = gradpipe.distribute.gradient_sources(model.trainable_variables)
        grads = tape.gradient(loss, sources)
        pipe.apply_gradients(zip(grads, sources))
    """
    out: list[Any] = []
    for var in variables:
        out.extend(shards_of(var) or [var])
    return out


def is_parameter_server(strategy: Any) -> bool:
    """Whether ``strategy`` keeps variables on parameter servers."""
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.experimental.ParameterServerStrategy)


def in_its_scope(strategy: Any) -> Any:
    """``strategy.scope()``, or a PlacementError where another strategy's scope is
    open: a pipeline made outside a strategy's scope and built inside it (TensorFlow
    says only "Must not nest tf.distribute.Strategy scopes")."""
    import tensorflow as tf

    current = tf.distribute.get_strategy()
    if tf.distribute.has_strategy() and current is not strategy:
        raise PlacementError(
            f"this pipeline was made for {type(strategy).__name__} (the strategy in "
            f"force when it was made) but is built in {type(current).__name__}'s scope: "
            "make the pipeline (gradpipe.build or gradpipe.load, and keras_optimizer()) "
            "inside `with strategy.scope():`, as Keras asks of its own optimizers")
    return strategy.scope()


def build_eagerly_once(build: Callable[[], None]) -> None:
    """Run ``build`` (which creates state variables) eagerly, never inside a trace;
    from inside ``strategy.run``, once for all replicas, in the cross-replica context
    that creating mirrored variables needs. Keras 3 optimizers build in this spot.

    A ``tf.function`` whose first trace creates variables traces itself a second
    time (a Keras train step: about 0.1 s more to the first step of a small model,
    as Keras's own optimizers pay). These variables are made eagerly, initialised
    before the trace goes on, so they are created outside its bookkeeping: the train
    step is traced once."""
    import tensorflow as tf

    def unlifted(next_creator: Callable[..., Any], **options: Any) -> Any:
        return next_creator(**{**options, "experimental_enable_variable_lifting": False})

    @tf.autograph.experimental.do_not_convert  # called from a converted train step
    def eagerly(*_: Any) -> None:
        with tf.init_scope(), tf.variable_creator_scope(unlifted):
            build()

    if tf.distribute.has_strategy() and not tf.distribute.in_cross_replica_context():
        tf.distribute.get_replica_context().merge_call(eagerly)
    else:
        eagerly()


class Placement:
    """A strategy plus how gradients are reduced across its replicas.

    Attributes:
        strategy: the ``tf.distribute.Strategy``.
        reduction: ``mean`` or ``sum``.
        groups: validated ``group_assignment`` or ``None``.
        description: what was chosen, in words (``auto`` reports it).
    """

    tpu = False

    def __init__(self, strategy: Any, reduction: str = "mean",
                 group_assignment: Any = None, description: str = "",
                 clip_before_reduce: bool = False) -> None:
        self.strategy = strategy
        self.reduction = reduction
        self.num_replicas = int(strategy.num_replicas_in_sync)
        self.groups = validate_group_assignment(group_assignment, self.num_replicas)
        self.description = description or type(strategy).__name__
        self.clip_before_reduce = clip_before_reduce

    @property
    def group_size(self) -> int:
        return len(self.groups[0]) if self.groups else self.num_replicas

    @property
    def loss_divisor(self) -> int:
        return self.group_size if self.reduction == "mean" else 1

    def check_replicated_step(self, jit_compile: Any) -> None:
        """Refuse what several replicas cannot run: a step compiled for one device,
        or groups that would give mirrored copies different updates."""
        if jit_compile is True:
            raise PlacementError(
                "[pipeline] jit_compile = true compiles the update for one device; "
                f"this placement has {self.num_replicas} replicas. Compile the whole "
                "replica step instead, or turn jit_compile off")
        if self.groups is not None and len(self.groups) > 1:
            raise PlacementError(
                f"group_assignment {self.groups} reduces each group on its own, so the "
                "mirrored copies of every variable would receive different updates and "
                "diverge. tf.distribute keeps one value per variable across all "
                "replicas, so a pipeline refuses several groups; use one group (or "
                "none), or call placement.reduce(grads) yourself where each group owns "
                "its variables")

    def reduce(self, grads: Sequence[Any]) -> list[Any]:
        return all_reduce_sum(grads, self.groups, tpu=self.tpu)


def split_cpu(count: int) -> None:
    """Make ``count`` logical CPU devices, or fail clearly if the runtime already runs."""
    import tensorflow as tf

    if count <= 0:
        return
    cpu0 = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu0, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        if have < count:
            raise PlacementError(
                f"logical_cpus = {count}, but TensorFlow's runtime already started with "
                f"{have} CPU device(s); build the pipeline before running any TensorFlow "
                "op, or split the CPU yourself first") from None


def start_servers(cluster: dict[str, list[str]], tasks: Sequence[tuple[str, int]]
                  ) -> list[Any]:
    """Start a TensorFlow server for each ``(job, index)`` of ``tasks`` in ``cluster``
    (job -> addresses), in this process; they serve as long as it lives."""
    import tensorflow as tf

    # A server runs every worker's closures and every variable's reads and writes at
    # once: with few cores (or several servers in one process) TensorFlow's default
    # pool can leave them waiting on each other.
    size = sum(len(addresses) for addresses in cluster.values())
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=size + 2)
    spec = tf.train.ClusterSpec(cluster)
    servers = [tf.distribute.Server(spec, job_name=job, task_index=index, protocol="grpc",
                                    config=config, start=True) for job, index in tasks]
    _SERVERS.extend(servers)
    return servers


_SERVERS: list[Any] = []  # a server stops when collected: keep them for the process


def local_cluster(workers: int = 1, ps: int = 2) -> Any:
    """Start ``workers`` workers and ``ps`` parameter servers as real TensorFlow servers
    in this process, on free localhost ports; return their cluster resolver.

    For trying parameter servers on one machine (and for tests): give the resolver
    to ``tf.distribute.ParameterServerStrategy``, or its addresses to the
    ``parameter_server`` placement (``resolver.cluster_spec().as_dict()``). The
    servers live as long as the process.
    """
    import socket

    import tensorflow as tf

    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("localhost", 0))
            return int(s.getsockname()[1])

    cluster = {"worker": [f"localhost:{free_port()}" for _ in range(workers)],
               "ps": [f"localhost:{free_port()}" for _ in range(ps)]}
    start_servers(cluster, [(job, i) for job in cluster for i in range(len(cluster[job]))])
    return tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), rpc_layer="grpc")


def weights_by_path(model: Any) -> Any:
    """A model's weights as one checkpointable object, each under its Keras path, a
    sharded one as a single whole: ``tf.train.Checkpoint(model=weights_by_path(model),
    pipeline=pipe)``.

    Keras 3 cannot checkpoint a variable split over parameter servers (its
    variable hands TensorFlow the ``ShardedVariable`` as if it were one tensor).
    Saved this way, the weights restore into any number of shards, and into the
    same model in one process through its own ``weights_by_path`` (and back).
    """
    import tensorflow as tf

    from .names import slot_name, variable_path

    weights = {}
    for var in getattr(model, "weights", model):
        inner = getattr(var, "_value", None)
        weights[slot_name(variable_path(var))] = var if inner is None else inner
    return tf.train.Checkpoint(**weights)
