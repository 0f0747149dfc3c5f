"""Placement ``parameter_server``: variables on servers, tables split into shards.

``ParameterServerStrategy`` keeps every variable on a parameter server and
splits the large ones (embedding tables) into shards, one per server or by
size; workers run steps asynchronously, each scheduled by a
``ClusterCoordinator`` in the program that built the pipeline. The pipeline
updates each shard where it lives (the user guide's "Distribution",
"Parameter servers").
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

import attrs

from gradpipe.plugin import (
    FieldError,
    Placement,
    PlacementError,
    at_least,
    hookimpl,
    non_negative,
)

#: TensorFlow's own default for MinSizePartitioner: 256 KiB.
DEFAULT_MIN_SHARD_BYTES = 256 << 10


@attrs.frozen(kw_only=True)
class ParameterServerConfig:
    """Config of ``parameter_server``.

    Attributes:
        workers: the workers' ``host:port`` addresses; with ``ps``, the cluster
            (empty: read from ``TF_CONFIG``).
        ps: the parameter servers' ``host:port`` addresses.
        shards: split every variable into exactly this many shards
            (``FixedShardsPartitioner``); 0 splits by size instead.
        min_shard_bytes: by size, the least bytes in a shard (``MinSizePartitioner``):
            smaller variables stay whole.
        max_shards: by size, the most shards of one variable; 0: one per server.
        timeout_seconds: how long to wait for every worker and server to answer
            (they may still be starting) before a clear error.
    """

    workers: tuple[str, ...] = ()
    ps: tuple[str, ...] = ()
    shards: int = attrs.field(default=0, validator=non_negative())
    min_shard_bytes: int = attrs.field(default=DEFAULT_MIN_SHARD_BYTES,
                                       validator=non_negative())
    max_shards: int = attrs.field(default=0, validator=non_negative())
    timeout_seconds: float = attrs.field(default=60.0, validator=at_least(1.0))

    def __attrs_post_init__(self) -> None:
        if bool(self.workers) != bool(self.ps):
            missing = "ps" if self.workers else "workers"
            raise FieldError(missing, "give both workers and ps, or neither (then "
                                      "TF_CONFIG describes the cluster)")
        if self.shards and (self.max_shards or
                            self.min_shard_bytes != DEFAULT_MIN_SHARD_BYTES):
            raise FieldError("shards", "give either shards (a fixed number) or "
                                       "min_shard_bytes and max_shards (by size), not both")


def parameter_server(cfg: ParameterServerConfig) -> Placement:
    """ParameterServerStrategy over the cluster, with the partitioner the keys give."""
    import tensorflow as tf

    resolver = _resolver(cfg)
    cluster = resolver.cluster_spec().as_dict()
    # TensorFlow would wait for a missing task for ever: fail clearly instead.
    _wait_for(cluster, cfg.timeout_seconds)
    servers = len(cluster.get("ps", []))
    if cfg.shards:
        partitioner = tf.distribute.experimental.partitioners.FixedShardsPartitioner(
            cfg.shards)
        split = f"{cfg.shards} shards each"
    else:
        most = cfg.max_shards or servers
        partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
            min_shard_bytes=cfg.min_shard_bytes, max_shards=most)
        split = f"up to {most} shards of at least {cfg.min_shard_bytes:,} bytes"
    try:
        strategy = tf.distribute.experimental.ParameterServerStrategy(
            resolver, variable_partitioner=partitioner)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        raise PlacementError(f"placement 'parameter_server': cannot reach the cluster "
                             f"{cluster}: {exc}") from None
    return Placement(strategy, description=(
        f"parameter_server: {len(cluster.get('worker', []))} worker(s), {servers} "
        f"server(s), variables split into {split}"))


def _wait_for(cluster: dict[str, list[str]], timeout: float) -> None:
    """Wait until every worker and server accepts connections, at most ``timeout``."""
    waiting = {(job, i): address for job in ("worker", "ps")
               for i, address in enumerate(cluster.get(job, []))}
    deadline = time.monotonic() + timeout
    while waiting:
        for task, address in list(waiting.items()):
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host, int(port)), timeout=1).close()
                del waiting[task]
            except (OSError, ValueError):
                pass
        if waiting and time.monotonic() > deadline:
            missing = ", ".join(f"{job} {i} at {address}"
                                for (job, i), address in sorted(waiting.items()))
            raise PlacementError(
                f"placement 'parameter_server': no answer from {missing} after "
                f"{timeout:g} s. Start each with `gradpipe serve FILE --job JOB --index I` "
                "(or all on this machine with `gradpipe serve FILE`)")
        if waiting:  # servers take seconds to start: a short poll wastes none of it
            time.sleep(0.1)


def _resolver(cfg: ParameterServerConfig) -> Any:
    import tensorflow as tf

    if cfg.workers:
        spec = tf.train.ClusterSpec({"worker": list(cfg.workers), "ps": list(cfg.ps)})
        return tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    raw = os.environ.get("TF_CONFIG")
    example = ('{"cluster": {"worker": ["host1:2222"], "ps": ["host2:2222"], "chief": '
               '["host0:2222"]}, "task": {"type": "chief", "index": 0}}')
    if not raw:
        raise PlacementError("placement 'parameter_server' needs the cluster: give workers "
                             f"and ps, or set TF_CONFIG, e.g. {example}")
    try:
        config = json.loads(raw)
        jobs, task = config["cluster"], config.get("task", {}).get("type", "chief")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise PlacementError(f"TF_CONFIG is not valid: {exc}: {raw!r}") from None
    if not jobs.get("worker") or not jobs.get("ps"):
        raise PlacementError(f"TF_CONFIG's cluster needs 'worker' and 'ps' tasks for "
                             f"placement 'parameter_server'; it has {sorted(jobs)}")
    if task in ("worker", "ps"):
        raise PlacementError(
            f"this process is TF_CONFIG's {task}, which only serves: start it with "
            "`gradpipe serve` and build the pipeline in the chief (the coordinator)")
    return tf.distribute.cluster_resolver.TFConfigClusterResolver()


@hookimpl
def gradpipe_register_placements(register: Any) -> None:
    register("parameter_server", parameter_server, ParameterServerConfig)
