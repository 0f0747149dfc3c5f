"""Placements: ``default``, ``cpu``, ``gpu``, ``mirrored``, ``tpu``, ``multi_worker``, ``auto``.

Each maps to a ``tf.distribute`` strategy and reduces gradients once, with
CrossShardOptimizer semantics (see ``gradpipe.distribute``).
"""

from __future__ import annotations

import os
from typing import Any, Literal

import attrs

from gradpipe.plugin import (
    FieldError,
    Placement,
    PlacementError,
    at_least,
    hookimpl,
    non_negative,
    one_of,
    split_cpu,
    validate_group_assignment,
)

Reduction = Literal["mean", "sum"]


def _reduction() -> Any:
    return attrs.field(default="mean", validator=one_of("mean", "sum"))


def _devices(kind: str) -> list[str]:
    import tensorflow as tf

    return [d.name for d in tf.config.list_logical_devices(kind)]


@attrs.frozen(kw_only=True)
class DefaultConfig:
    """Config of ``default``.

    Attributes:
        reduction: with a user's strategy in scope, ``mean`` divides the loss by
            its replicas and sums gradients; ``sum`` does not divide.
        clip_before_reduce: run the clipping transforms on each replica's
            gradients before the reduction, as CrossShardOptimizer users did.
    """

    reduction: Reduction = _reduction()
    clip_before_reduce: bool = False


def default(cfg: DefaultConfig) -> Placement:
    """No strategy of its own: whatever strategy is current when the pipeline is built."""
    import tensorflow as tf

    return Placement(tf.distribute.get_strategy(), cfg.reduction,
                     clip_before_reduce=cfg.clip_before_reduce, description="current")


@attrs.frozen(kw_only=True)
class CpuConfig:
    """Config of ``cpu`` (no parameters): OneDeviceStrategy on ``/cpu:0``."""


def cpu(cfg: CpuConfig) -> Placement:
    """OneDeviceStrategy on the CPU."""
    import tensorflow as tf

    return Placement(tf.distribute.OneDeviceStrategy("/cpu:0"), description="cpu:0")


@attrs.frozen(kw_only=True)
class GpuConfig:
    """Config of ``gpu``.

    Attributes:
        device: index of the GPU.
    """

    device: int = attrs.field(default=0, validator=non_negative())


def gpu(cfg: GpuConfig) -> Placement:
    """OneDeviceStrategy on one GPU."""
    import tensorflow as tf

    gpus = _devices("GPU")
    if cfg.device >= len(gpus):
        raise PlacementError(f"placement 'gpu' asks for GPU {cfg.device}, but this machine "
                             f"has {len(gpus)} GPU(s): {gpus or 'none'}")
    return Placement(tf.distribute.OneDeviceStrategy(f"/gpu:{cfg.device}"),
                     description=f"gpu:{cfg.device}")


@attrs.frozen(kw_only=True)
class MirroredConfig:
    """Config of ``mirrored``.

    Attributes:
        devices: device names; default all GPUs, else all (logical) CPUs.
        reduction: ``mean`` (loss / N, then SUM) or ``sum``.
        group_assignment: equal-size lists of replica ids forming a permutation of
            ``range(N)``; each group reduces on its own.
        clip_before_reduce: clip each replica's gradients before the reduction.
        logical_cpus: split the CPU into this many logical devices (before
            TensorFlow's runtime starts) and mirror over them: data parallelism
            tested on any machine.
    """

    devices: tuple[str, ...] = ()
    reduction: Reduction = _reduction()
    group_assignment: tuple[tuple[int, ...], ...] = ()
    clip_before_reduce: bool = False
    logical_cpus: int = attrs.field(default=0, validator=non_negative())

    def __attrs_post_init__(self) -> None:
        _check_groups(self.group_assignment, len(self.devices) or self.logical_cpus or None)
        if self.devices and self.logical_cpus:
            raise FieldError("logical_cpus", "give either devices or logical_cpus")


def _check_groups(groups: Any, n: int | None) -> None:
    try:
        validate_group_assignment([list(g) for g in groups], n)
    except PlacementError as exc:
        raise FieldError("group_assignment", str(exc)) from None


def mirrored(cfg: MirroredConfig) -> Placement:
    """MirroredStrategy over ``devices``."""

    split_cpu(cfg.logical_cpus)
    if cfg.logical_cpus:
        devices = _devices("CPU")[:cfg.logical_cpus]
    else:
        devices = list(cfg.devices) or _devices("GPU") or _devices("CPU")
    known = {_full_name(d) for d in _devices("GPU") + _devices("CPU")}
    missing = [d for d in devices if _full_name(d) not in known]
    if missing:
        have = sorted(_devices("GPU") + _devices("CPU"))
        raise PlacementError(f"placement 'mirrored': no device {missing}; this machine has "
                             f"{have}. Set logical_cpus = N to mirror over N logical CPU "
                             "devices instead")
    strategy = _shared_mirrored(tuple(devices))
    return Placement(strategy, cfg.reduction, [list(g) for g in cfg.group_assignment] or None,
                     description=f"mirrored over {', '.join(devices)}",
                     clip_before_reduce=cfg.clip_before_reduce)


_MIRRORED: dict[tuple[Any, ...], Any] = {}


def _shared_mirrored(devices: tuple[str, ...]) -> Any:
    """One MirroredStrategy per device set and process.

    Separate strategies over the same devices reuse collective instance keys, so
    an all-gather of one collides with an all-reduce of another ("Collective
    instance 100 expected type 0 ... got type 2"). Pipelines share instead.
    """
    import tensorflow as tf

    key = tuple(sorted(_full_name(d) for d in devices))
    if key not in _MIRRORED:
        # Strategies over *different* device sets also collide: every one starts its
        # collective group keys at the class-wide _collective_key_base ("joining a
        # group with size 2, but that group has size 4"). TF's own tests offset that
        # private base per strategy; so do we (an instance attribute, read in __init__).
        strategy = tf.distribute.MirroredStrategy.__new__(tf.distribute.MirroredStrategy)
        strategy._collective_key_base = 100_000 * len(_MIRRORED)
        strategy.__init__(list(devices))
        _MIRRORED[key] = strategy
    return _MIRRORED[key]


def _full_name(device: str) -> tuple[str, int]:
    """(type, index) of a device name, however it is spelt (``/cpu:1``, ``GPU:0``)."""
    import tensorflow as tf

    spec = tf.DeviceSpec.from_string(device if device.startswith("/") else f"/{device}")
    return (spec.device_type or "").upper(), spec.device_index or 0


@attrs.frozen(kw_only=True)
class TpuConfig:
    """Config of ``tpu``.

    Attributes:
        tpu: TPU address or name for TPUClusterResolver ("" = local TPU / TPU_NAME).
        reduction: ``mean`` (loss / N or / group size, then SUM) or ``sum``.
        group_assignment: replica groups, reduced with ``cross_replica_sum``.
        clip_before_reduce: clip each replica's gradients before the reduction.
    """

    tpu: str = ""
    reduction: Reduction = _reduction()
    group_assignment: tuple[tuple[int, ...], ...] = ()
    clip_before_reduce: bool = False

    def __attrs_post_init__(self) -> None:
        _check_groups(self.group_assignment, None)


class TpuPlacement(Placement):
    tpu = True


def tpu(cfg: TpuConfig) -> Placement:
    """TPUStrategy with CrossShardOptimizer semantics."""
    import tensorflow as tf

    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=cfg.tpu or None)
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        strategy = tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as exc:
        where = cfg.tpu or "the local host"
        raise PlacementError(f"placement 'tpu': no TPU available at {where}: {exc}") from None
    return TpuPlacement(strategy, cfg.reduction,
                        [list(g) for g in cfg.group_assignment] or None,
                        description=f"tpu {cfg.tpu or 'local'}",
                        clip_before_reduce=cfg.clip_before_reduce)


@attrs.frozen(kw_only=True)
class MultiWorkerConfig:
    """Config of ``multi_worker``: MultiWorkerMirroredStrategy from ``TF_CONFIG``.

    Attributes:
        reduction: ``mean`` (loss / total replicas, then SUM) or ``sum``.
        communication: collective implementation: ``auto``, ``ring`` or ``nccl``.
        timeout_seconds: how long collectives may wait for other workers.
    """

    reduction: Reduction = _reduction()
    communication: Literal["auto", "ring", "nccl"] = attrs.field(
        default="auto", validator=one_of("auto", "ring", "nccl"))
    timeout_seconds: float = attrs.field(default=600.0, validator=at_least(1.0))


def multi_worker(cfg: MultiWorkerConfig) -> Placement:
    """MultiWorkerMirroredStrategy: one process per worker, described by TF_CONFIG."""
    import json

    import tensorflow as tf

    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise PlacementError("placement 'multi_worker' needs TF_CONFIG in the environment "
                             "of every worker, e.g. {\"cluster\": {\"worker\": [\"host1:port\", "
                             "\"host2:port\"]}, \"task\": {\"type\": \"worker\", \"index\": 0}}")
    try:
        config = json.loads(raw)
        workers = config["cluster"]["worker"]
        index = config["task"]["index"]
    except (ValueError, KeyError, TypeError) as exc:
        raise PlacementError(f"TF_CONFIG is not valid: {exc}: {raw!r}") from None
    implementation = {"auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
                      "ring": tf.distribute.experimental.CommunicationImplementation.RING,
                      "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL}
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementation[cfg.communication], timeout_seconds=cfg.timeout_seconds)
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    return Placement(strategy, cfg.reduction,
                     description=f"multi_worker: worker {index} of {len(workers)}")


@attrs.frozen(kw_only=True)
class AutoConfig:
    """Config of ``auto``: the best of TPU, several GPUs, one GPU, CPU.

    Attributes:
        reduction: ``mean`` or ``sum`` for the chosen strategy.
    """

    reduction: Reduction = _reduction()


def auto(cfg: AutoConfig) -> Placement:
    """Pick TPU, then several GPUs (mirrored), then one GPU, then the CPU; say which."""
    if _devices("TPU") or os.environ.get("TPU_NAME"):
        chosen = tpu(TpuConfig(reduction=cfg.reduction))
    elif len(_devices("GPU")) > 1:
        chosen = mirrored(MirroredConfig(devices=tuple(_devices("GPU")),
                                         reduction=cfg.reduction))
    elif _devices("GPU"):
        chosen = gpu(GpuConfig(device=0))
    else:
        chosen = cpu(CpuConfig())
    chosen.description = f"auto chose {chosen.description}"
    return chosen


@hookimpl
def gradpipe_register_placements(register: Any) -> None:
    register("default", default, DefaultConfig)
    register("cpu", cpu, CpuConfig)
    register("gpu", gpu, GpuConfig)
    register("mirrored", mirrored, MirroredConfig)
    register("tpu", tpu, TpuConfig)
    register("multi_worker", multi_worker, MultiWorkerConfig)
    register("auto", auto, AutoConfig)
