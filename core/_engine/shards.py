"""Variables split over parameter servers: each shard updated where it lives.

Under ``ParameterServerStrategy`` with a partitioner, a large variable is a
``ShardedVariable`` (a Keras 3 variable holds one): its shards are plain
variables, each on one server. The engine updates each shard as a variable of
its own, so its state is created beside it, rows of a sparse gradient reach
only the shard that owns them, and no step gathers a whole table. A checkpoint
holds each per-row state as one sharded whole, like the variable itself, so it
restores into another number of shards or into a single process.

Whether a transform gives per shard what it gives the whole variable is found
out, not declared: :func:`shard_mismatch` runs it both ways. A transform that
reads a whole variable (its norm, its shape) is refused where a variable is
sharded.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import tensorflow as tf

from ..distribute import is_parameter_server, shards_of
from ..errors import PlacementError
from ..names import SHARD_PATH, slot_name, unique_names, variable_path
from ..transform import build_scope
from .plan import Choice


def variable_key(var: Any) -> Any:
    """What identifies a variable in a dict (``ref()``, as tf.Variable needs)."""
    return var.ref() if hasattr(var, "ref") else id(var)


def tf_variable(var: Any) -> Any:
    """The tf.Variable behind a Keras 3 variable (TF backend); else ``var`` itself.

    Keras variables have no ``scatter_sub`` and may autocast on read; the engine
    updates the variable they wrap (a MirroredVariable under a strategy).
    """
    inner = getattr(var, "_value", None)
    return inner if inner is not None and hasattr(inner, "assign_sub") else var


@attrs.frozen(kw_only=True)
class Shards:
    """The variables as the engine updates them: each sharded variable's shards in
    its place, in row order.

    Attributes:
        variables: what the engine updates.
        paths: what patterns match, each one's (a shard: its variable's path).
        stems: each one's name in state names (a shard: its variable's, ``.part_K``).
        groups: per sharded variable, its stem and its shards' indices (none where
            the pipeline was built from the shards themselves).
    """

    variables: list[Any]
    paths: list[str]
    stems: list[str]
    groups: list[tuple[str, list[int]]]

    def split(self, pairs: Sequence[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
        """``pairs`` with each whole sharded variable's gradient split by its shards."""
        out: list[tuple[Any, Any]] = []
        for grad, var in pairs:
            parts = shards_of(var)
            if parts is None:
                out.append((grad, var))
            else:
                out.extend(zip(_split_rows(grad, [int(p.shape[0]) for p in parts]), parts))
        return out

    def grouped(self, names: dict[str, Any], owners: dict[str, int | None]) -> dict[str, Any]:
        """``names`` (leaf name -> state variable) with the per-row state of each sharded
        variable as one ``ShardedVariable`` under its variable's name. State that is
        not row for row (a scalar per shard) stays per shard, named ``.part_K``."""
        shard_of = {i: (stem, k) for stem, indices in self.groups
                    for k, i in enumerate(indices)}
        out: dict[str, Any] = {}
        parts: dict[str, list[tuple[int, str, Any]]] = {}
        for name, var in names.items():
            owner = owners.get(name)
            if owner not in shard_of:
                out[name] = var
                continue
            stem, _ = shard_of[owner]
            segments = name.split("/")
            whole = "/".join(stem if s == self.stems[owner] else s for s in segments)
            parts.setdefault(whole, []).append((owner, name, var))
        for whole, found in parts.items():
            shards = [var for _, _, var in found]
            rows = [int(self.variables[owner].shape[0]) for owner, _, _ in found]
            if all(s.shape.rank and int(s.shape[0]) == r for s, r in zip(shards, rows)) \
                    and len({(s.dtype, tuple(s.shape[1:])) for s in shards}) == 1:
                out[whole] = tf.__internal__.distribute.ShardedVariable(shards, name=whole)
            else:
                out.update({name: var for _, name, var in found})
        return out


class StepLock:
    """Workers apply their steps one at a time.

    Under parameter servers each worker runs its own step, and a step reads a
    variable's state over the network, computes, and writes it back. Two steps
    at once would interleave those reads and writes: lost updates, and a state
    whose parts come from different steps (Adam's first moment from one, a zero
    second moment from another: a row divided by epsilon). Holding one lock, a
    mutex on the first variable's server, from the first read to the last write,
    each step applies whole, exactly once, as in one process. Workers still
    compute their gradients at the same time; only the update waits.
    """

    def __init__(self, beside: Any) -> None:
        with tf.device(tf_variable(beside).device):
            self._section = tf.CriticalSection(name="gradpipe_step")

    def __call__(self, step: Any) -> Any:
        return self._section.execute(step, exclusive_resource_access=False)


def expand(variables: Sequence[Any]) -> Shards:
    """Each sharded variable in ``variables`` replaced by its shards."""
    given = [variable_path(v) for v in variables]
    stems = unique_names([slot_name(p) for p in given])
    out: list[Any] = []
    paths: list[str] = []
    out_stems: list[str] = []
    groups: list[tuple[str, list[int]]] = []
    for var, path, stem in zip(variables, given, stems):
        parts = shards_of(var)
        if parts is None:
            out.append(var)
            paths.append(path)
            out_stems.append(stem)
            continue
        first = len(out)
        for k, shard in enumerate(parts):
            setattr(shard, SHARD_PATH, path)  # a shard's own path reads as its variable's
            out.append(shard)
            paths.append(path)
            out_stems.append(f"{stem}.part_{k}")
        groups.append((stem, list(range(first, len(out)))))
    return Shards(variables=out, paths=paths, stems=out_stems, groups=groups)


def servers_choice(shards: Shards, *, strategy: Any, spec: Any, transforms: list[Any],
                   masks: list[list[bool]], context: Any) -> Choice | None:
    """The plan's row on parameter servers (``None`` under any other strategy); a
    ``PlacementError`` where the step cannot run there as it would in one process."""
    if not is_parameter_server(strategy):
        return None
    servers = len({tf_variable(v).device for v in shards.variables})
    if spec.options.jit_compile is True:
        raise PlacementError("[pipeline] jit_compile = true compiles the update for one "
                             f"device; the variables live on {servers} parameter servers. "
                             "Turn jit_compile off (\"auto\" does)")
    if not shards.groups:
        return Choice(False, f"no ShardedVariable among the variables on {servers} "
                             "servers; each is updated where it lives, its state beside it")
    sharded = {i for _, indices in shards.groups for i in indices}
    for i, (t, transform) in enumerate(zip(spec.transforms, transforms)):
        seen = sorted({shards.paths[j] for j in sharded if masks[i][j]})
        if seen and (why := shard_mismatch(transform, context)):
            raise PlacementError(
                f"transforms[{i}] {t.name!r} {why}, and {', '.join(map(repr, seen))} is "
                f"split over {servers} parameter servers. Keep that variable whole (a "
                "partitioner that does not split it), or leave it out of this transform "
                "(exclude = [...])")
    names = ", ".join(stem for stem, _ in shards.groups)
    return Choice(True, f"{names} split over {servers} servers: each shard is updated "
                        "where it lives, its state beside it")


def _split_rows(grad: Any, rows: list[int]) -> list[Any]:
    """A whole variable's gradient as one gradient per shard (``rows`` each)."""
    if grad is None:
        return [None] * len(rows)
    if not isinstance(grad, tf.IndexedSlices):
        return tf.split(tf.convert_to_tensor(grad), rows, axis=0)
    out, start = [], 0
    for count in rows:
        mine = (grad.indices >= start) & (grad.indices < start + count)
        out.append(tf.IndexedSlices(
            tf.boolean_mask(grad.values, mine), tf.boolean_mask(grad.indices, mine) - start,
            tf.concat([[count], tf.shape(grad.values, out_type=grad.indices.dtype)[1:]], 0)))
        start += count
    return out


def shard_mismatch(transform: Any, context: Any) -> str:
    """Whether ``transform`` gives a variable split in two shards what it gives it
    whole: "" if it does, else how it differs. A table of 6 rows (and a bias beside
    it), three steps of gradients at scales 1e-3, 1 and 1e3: a transform that reads
    a variable's norm, its shape or its number of rows gives other numbers."""
    rng = np.random.default_rng(1)
    table = np.linspace(-1, 1, 18, dtype="f4").reshape(6, 3)
    bias = np.linspace(0.5, 1, 4, dtype="f4")
    whole = [tf.Variable(table, name="embedding/embeddings"), tf.Variable(bias, name="bias")]
    split = [tf.Variable(table[:2], name="embedding/embeddings"),
             tf.Variable(table[2:], name="embedding/embeddings"),
             tf.Variable(bias, name="bias")]
    try:
        with build_scope(context):
            state_whole, state_split = transform.init(whole), transform.init(split)
            for scale in (1e-3, 1.0, 1e3):
                grads = [rng.normal(size=v.shape).astype("f4") * scale for v in whole]
                context.shared.clear()
                ours, state_whole = transform.update(
                    [tf.constant(g) for g in grads], state_whole, whole)
                context.shared.clear()
                theirs, state_split = transform.update(
                    [tf.constant(grads[0][:2]), tf.constant(grads[0][2:]),
                     tf.constant(grads[1])], state_split, split)
                joined = [tf.concat([theirs[0], theirs[1]], 0), theirs[2]]
                for a, b in zip(ours, joined):
                    if not np.allclose(tf.convert_to_tensor(a), b, rtol=1e-5, atol=1e-6):
                        return ("gives a variable split over servers other updates than "
                                "whole: its maths reads the whole variable")
    except Exception as exc:
        return f"failed run on a split variable: {type(exc).__name__}: {str(exc)[:200]}"
    finally:
        context.shared.clear()
    return ""
