"""Fork Python processes that have imported TensorFlow already (``tests/forked.py``).

    python zygote.py SOCKET

Imports TensorFlow (nothing of gradpipe or Keras), then serves SOCKET: each
request is a JSON ``{"argv", "env", "cwd"}`` with three descriptors (stdin,
stdout, stderr). The server forks; the child becomes ``python ARGV`` in ``cwd``
with ``env``; the server answers the child's pid, then its exit status.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading

import tensorflow  # noqa: F401  the point: 4-5 s of CPU a forked child does not spend

PATH = [p for p in sys.path if p != os.path.dirname(os.path.abspath(__file__))]


def _become(argv: list[str], env: dict[str, str], cwd: str) -> None:
    """In the child: run ``argv`` as ``python`` would, then exit as it would."""
    import runpy
    import types

    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    sys.path[:] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p] + PATH
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path.insert(0, "")
        main = types.ModuleType("__main__")
        sys.modules["__main__"] = main
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    elif argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]
        sys.path.insert(0, cwd)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
        runpy.run_path(argv[0], run_name="__main__")


def _report(connection: socket.socket, pid: int) -> None:
    _, status = os.waitpid(pid, 0)
    with connection:  # -N for signal N, as subprocess gives
        connection.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())


def main() -> None:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    server.bind(sys.argv[1])
    server.listen()
    print("ready", flush=True)
    while True:
        connection, _ = server.accept()
        message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        request = json.loads(message)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the request's process; exits through the interpreter
            server.close()
            connection.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            _become(request["argv"], request["env"], request["cwd"])
            return
        for fd in fds:
            os.close(fd)
        connection.sendall(f"{pid}\n".encode())
        threading.Thread(target=_report, args=(connection, pid), daemon=True).start()


if __name__ == "__main__":
    main()
