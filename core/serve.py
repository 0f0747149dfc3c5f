"""``gradpipe serve``: run a worker or a parameter server of a cluster until stopped.

Under ``ParameterServerStrategy`` only the chief runs the training program;
every worker and parameter server is a bare TensorFlow server that the chief
sends work to. This starts one, for the task ``TF_CONFIG`` names or the one
the options give.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from .cli_args import pipeline_file
from .distribute import start_servers
from .errors import GradpipeError


def add_serve_parser(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the workers and parameter servers of a cluster")
    p.add_argument("file", nargs="?", type=pipeline_file,
                   help="a pipeline whose parameter_server placement lists the cluster; "
                        "without --job, serve all its workers and servers here")
    p.add_argument("--job", choices=("worker", "ps"),
                   help="serve only this task (default: TF_CONFIG's task)")
    p.add_argument("--index", type=int, default=None,
                   help="the task's index in its job (default: TF_CONFIG's, else 0)")
    p.add_argument("--workers", nargs="+", default=[], metavar="HOST:PORT",
                   help="the workers' addresses (default: FILE's, else TF_CONFIG's)")
    p.add_argument("--ps", nargs="+", default=[], metavar="HOST:PORT",
                   help="the parameter servers' addresses (default: FILE's, else "
                        "TF_CONFIG's)")
    p.set_defaults(func=cmd_serve)


def serving_tasks(args: argparse.Namespace) -> tuple[dict[str, list[str]], list[tuple[str, int]]]:
    """The cluster, and the tasks to serve: from the options, FILE, or ``TF_CONFIG``."""
    raw = os.environ.get("TF_CONFIG", "")
    try:
        config = json.loads(raw) if raw else {}
    except ValueError as exc:
        raise GradpipeError(f"TF_CONFIG is not valid JSON: {exc}: {raw!r}") from None
    cluster = {k: list(v) for k, v in (config.get("cluster") or {}).items()
               if k in ("worker", "ps")}
    if args.file is not None:
        cluster = _file_cluster(args.file) or cluster
    if args.workers or args.ps:
        cluster = {"worker": list(args.workers), "ps": list(args.ps)}
    if not cluster.get("worker") or not cluster.get("ps"):
        raise GradpipeError("serve needs the cluster: give --workers and --ps, a pipeline "
                            "file whose parameter_server placement lists them, or set "
                            "TF_CONFIG's cluster with 'worker' and 'ps' tasks")
    task = config.get("task") or {}
    job = args.job or (task.get("type") if args.file is None else None)
    if job is None and args.file is not None:
        return cluster, [(j, i) for j in ("worker", "ps") for i in range(len(cluster[j]))]
    if job not in ("worker", "ps"):
        raise GradpipeError("serve needs a worker or ps task: give --job and --index, a "
                            "pipeline file (to serve its whole cluster), or set TF_CONFIG's "
                            "task (the chief runs the training program)")
    index = args.index if args.index is not None else int(task.get("index", 0))
    if not 0 <= index < len(cluster[job]):
        raise GradpipeError(f"task {job} {index} is not in the cluster: {job} has "
                            f"{len(cluster[job])} address(es)")
    return cluster, [(job, index)]


def _file_cluster(path: Any) -> dict[str, list[str]]:
    from .api import parse

    placement = parse(path).placement
    if placement is None or placement.name != "parameter_server":
        raise GradpipeError(f"{path} has no parameter_server placement to serve")
    return {"worker": list(placement.config.workers), "ps": list(placement.config.ps)}


def cmd_serve(args: argparse.Namespace) -> int:
    cluster, tasks = serving_tasks(args)
    from .run_command import import_tensorflow_quietly

    import_tensorflow_quietly()
    servers = start_servers(cluster, tasks)
    for job, index in tasks:
        print(f"serving {job} {index} at {cluster[job][index]}", flush=True)
    print("stop with Ctrl-C", flush=True)
    servers[0].join()
    return 0
