"""Parameter servers: steps per second and bytes on the network per step.

    python benchmarks/parameter_server.py [--rows N] [--dim D] [--steps S] [--quick]

Two workers and two parameter servers on localhost, each a `gradpipe serve`
process; a table of N x D float32 (default 2,000,000 x 64) split over the two
servers, looked up by bags of 8 ids (a batch of 128 bags) and a small dense
head (Keras 3's Embedding reads its whole table each step: the model looks up
rows as tf-keras's Embedding does, see ``row_lookup_layer``). Each case runs
in a coordinator process of its own that schedules S steps over both workers
after two warm-up steps:

  lazy adam     gradpipe `adam`, `lazy = true`: only the touched rows move;
  adagrad       gradpipe `adagrad`: its maths updates only the touched rows;
  dense adam    gradpipe `adam`: every row of the table and its slots, each step;
  tf-keras adam tf-keras's legacy Adam (the route Keras recommends for parameter
                servers), under TF_USE_LEGACY_KERAS=1.

Bytes per step: what crossed the loopback interface during the timed steps
(/proc/net/dev), divided by the steps: the traffic between coordinator,
workers and servers (on a quiet machine, nothing else uses localhost).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import table

CASES = {"lazy adam": {"kind": "adam", "learning_rate": 0.001, "lazy": True},
         "adagrad": {"kind": "adagrad", "learning_rate": 0.01},
         "dense adam": {"kind": "adam", "learning_rate": 0.001},
         "tf-keras adam": None}
BAG, BATCH = 8, 128


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: it runs")
    parser.add_argument("--coordinator", help=argparse.SUPPRESS)  # one case, as JSON
    args = parser.parse_args()
    if args.coordinator:
        return coordinate(json.loads(args.coordinator))
    if args.quick:
        args.rows, args.dim, args.steps = 20_000, 16, 4
    ports = _free_ports(4)
    cluster = {"worker": [f"localhost:{p}" for p in ports[:2]],
               "ps": [f"localhost:{p}" for p in ports[2:]]}
    scratch = tempfile.TemporaryDirectory()  # the smoke run's cluster file, removed after
    rows, servers = [], _serve(cluster, Path(scratch.name) if args.quick else None)
    try:
        for name, rule in CASES.items():
            case = {"name": name, "rule": rule, "cluster": cluster, "rows": args.rows,
                    "dim": args.dim, "steps": args.steps}
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
            if rule is None:
                env["TF_USE_LEGACY_KERAS"] = "1"
            done = subprocess.run([sys.executable, __file__, "--coordinator", json.dumps(case)],
                                  capture_output=True, text=True, env=env, timeout=1800)
            if done.returncode != 0:
                print(f"{name} failed:\n{done.stderr[-3000:]}", file=sys.stderr)
                return 1
            result = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append((name, f"{result['steps_per_s']:.2f}",
                         f"{result['bytes_per_step'] / 2**20:,.2f}",
                         f"{result['loss_first']:.4f} -> {result['loss_last']:.4f}"))
    finally:
        for server in servers:
            server.kill()
        scratch.cleanup()
    print(table(f"{args.rows:,} x {args.dim} table over 2 servers, 2 workers, {args.steps} "
                f"steps of {BATCH} bags of {BAG} ids (localhost, {os.cpu_count()} cores)",
                rows, ("case", "steps/s", "MiB/step", "loss")))
    return 0


def _serve(cluster: dict, folder: Path | None) -> list[subprocess.Popen]:
    """A `gradpipe serve` process per task, as on a real cluster; given a ``folder``
    (the smoke run), one process for all four, from a pipeline file written there."""
    serve = [sys.executable, "-m", "gradpipe.cli", "serve"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    if folder is not None:
        pipeline = folder / "cluster.toml"
        pipeline.write_text(f"[placement]\nkind = \"parameter_server\"\n"
                            f"workers = {json.dumps(cluster['worker'])}\n"
                            f"ps = {json.dumps(cluster['ps'])}\n\n"
                            "[[transforms]]\nkind = \"sgd\"\n")
        return [subprocess.Popen([*serve, str(pipeline)], **quiet)]
    flags = ["--workers", *cluster["worker"], "--ps", *cluster["ps"]]
    return [subprocess.Popen([*serve, "--job", job, "--index", str(i), *flags], **quiet)
            for job in ("worker", "ps") for i in range(2)]


def coordinate(case: dict) -> int:
    """One case: build, warm up, time ``steps`` steps; print one JSON line."""
    import numpy as np
    import tensorflow as tf

    import gradpipe

    legacy = case["rule"] is None
    keras = __import__("tf_keras" if legacy else "keras")
    lookup = None if legacy else row_lookup_layer()
    placement = {"kind": "parameter_server", "workers": case["cluster"]["worker"],
                 "ps": case["cluster"]["ps"], "max_shards": 2,
                 "min_shard_bytes": case["rows"] * case["dim"] * 4 // 2}
    pipe = gradpipe.build({"placement": placement,
                           "transforms": [case["rule"] or {"kind": "sgd"}]})
    strategy = pipe.strategy
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        ids = keras.Input((BAG,), dtype="int64")
        bags = (lookup or keras.layers.Embedding)(
            case["rows"], case["dim"], name="table")(ids)
        out = keras.layers.Dense(1)(keras.layers.GlobalAveragePooling1D()(bags))
        model = keras.Model(ids, out)
        optimizer = keras.optimizers.legacy.Adam(0.001) if legacy else None
    if legacy:
        sources = model.trainable_variables
    else:
        pipe.build(model.trainable_variables)
        sources = gradpipe.distribute.gradient_sources(model.trainable_variables)

    def dataset() -> tf.data.Dataset:
        def batch(_: tf.Tensor) -> tuple:
            x = tf.random.uniform([BATCH, BAG], 0, case["rows"], dtype=tf.int64)
            return x, tf.cast(x[:, :1] % 2, tf.float32)
        return tf.data.Dataset.range(1 << 40).map(batch).prefetch(4)

    batches = iter(coordinator.create_per_worker_dataset(dataset))

    @tf.function
    def step(batches: object) -> tf.Tensor:
        def replica(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((model(x) - y) ** 2)
            grads = tape.gradient(loss, sources)
            if legacy:
                optimizer.apply_gradients(zip(grads, sources))
            else:
                pipe.apply_gradients(zip(grads, sources))
            return loss
        return strategy.run(replica, args=next(batches))

    losses = [coordinator.schedule(step, args=(batches,)) for _ in range(2)]
    coordinator.join()
    first = float(np.mean([loss.fetch() for loss in losses]))
    before, start = _loopback_bytes(), time.perf_counter()
    losses = [coordinator.schedule(step, args=(batches,)) for _ in range(case["steps"])]
    coordinator.join()
    elapsed, moved = time.perf_counter() - start, _loopback_bytes() - before
    last = float(np.mean([loss.fetch() for loss in losses[-2:]]))
    print(json.dumps({"steps_per_s": case["steps"] / elapsed, "loss_first": first,
                      "bytes_per_step": moved / case["steps"], "loss_last": last}), flush=True)
    os._exit(0)  # the coordinator's threads would wait on the servers


def row_lookup_layer() -> type:
    """Keras 3's Embedding reads its whole table at each call (``ops.take`` converts
    the sharded variable to one tensor): every step would send the table to the
    worker. This one looks up rows with ``tf.nn.embedding_lookup``, as tf-keras's
    Embedding does, which asks each shard for its own rows only."""
    import keras
    import tensorflow as tf

    class RowLookup(keras.layers.Embedding):
        def call(self, inputs: tf.Tensor) -> tf.Tensor:
            return tf.nn.embedding_lookup(self.embeddings.value, inputs)

    return RowLookup


def _loopback_bytes() -> int:
    """Bytes through the loopback interface so far: every byte any process on this
    machine sent to another over localhost (on a quiet machine, this cluster's)."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[0])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("localhost", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


if __name__ == "__main__":
    sys.exit(main())
