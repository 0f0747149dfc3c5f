"""New Python processes that start with TensorFlow imported: ``run`` and ``Popen``.

A Python process that imports TensorFlow spends 4-5 s of CPU on the import
before it does anything, and the suite starts dozens (servers, coordinators,
processes it kills). Here each starts as a fork of a server process
(``workers/zygote.py``, one per test worker) that imported TensorFlow and
nothing else: the child imports gradpipe, Keras and the rest itself, runs
``python ARGS`` with its own arguments, environment and folder, and is a real
process (its own pid, signals, exit status, TensorFlow runtime).

They take the arguments ``subprocess`` takes for ``[sys.executable, ...]``.
What a fork cannot give goes to ``subprocess``: another program, interpreter
options, and variables read when TensorFlow is imported. Every child of one
server shares its hash seed: a test about what differs between processes'
hashing starts its processes with ``subprocess``.
"""

from __future__ import annotations

import atexit
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

ZYGOTE = Path(__file__).resolve().parent / "workers" / "zygote.py"
# read when TensorFlow or Keras is imported, which the server has done already
READ_AT_IMPORT = ("TF_USE_LEGACY_KERAS", "KERAS_BACKEND", "TF_ENABLE_ONEDNN_OPTS",
                  "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES", "PYTHONHASHSEED")
_server: dict[str, Any] = {}
_lock = threading.Lock()


def _socket_path() -> str:
    """The server's socket, started on first use by this process."""
    with _lock:
        if "path" not in _server:
            folder = tempfile.mkdtemp(prefix="gradpipe-zygote-")
            path = os.path.join(folder, "socket")
            process = subprocess.Popen([sys.executable, str(ZYGOTE), path],
                                       stdout=subprocess.PIPE, text=True)
            if process.stdout.readline().strip() != "ready":
                raise RuntimeError(f"{ZYGOTE.name} did not start: {process.wait()}")
            atexit.register(process.kill)
            atexit.register(shutil.rmtree, folder, True)
            _server.update(path=path, process=process)
        return _server["path"]


def _forkable(args: list[str], env: dict[str, str] | None) -> bool:
    if not args or args[0] != sys.executable or len(args) < 2:
        return False
    if args[1].startswith("-") and args[1] not in ("-c", "-m"):
        return False
    env = os.environ if env is None else env
    return all(env.get(key) == os.environ.get(key) for key in READ_AT_IMPORT)


def _fd(target: Any, default: int, to_close: list[int]) -> tuple[int, int | None]:
    """The descriptor to give the child, and the parent's end of a pipe if one;
    ``to_close`` gets what this process opened for the child alone."""
    if target is None:
        return default, None
    if target == subprocess.PIPE:
        read, write = os.pipe()
        to_close.append(write)
        return write, read
    if target == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        to_close.append(fd)
        return fd, None
    return (target if isinstance(target, int) else target.fileno()), None


class Forked:
    """A forked child, as ``subprocess.Popen`` shows one (the parts tests use)."""

    def __init__(self, args: list[str], *, stdout: Any = None, stderr: Any = None,
                 text: bool = False, env: dict[str, str] | None = None,
                 cwd: Any = None) -> None:
        import json

        self.args, self.returncode = args, None
        opened: list[int] = []
        out, out_read = _fd(stdout, 1, opened)
        if stderr == subprocess.STDOUT:
            err, err_read = out, None
        else:
            err, err_read = _fd(stderr, 2, opened)
        stdin = os.open(os.devnull, os.O_RDONLY)
        opened.append(stdin)
        request = json.dumps({"argv": [str(a) for a in args[1:]],
                              "env": dict(os.environ if env is None else env),
                              "cwd": str(cwd or os.getcwd())}).encode()
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._connection.connect(_socket_path())
            socket.send_fds(self._connection, [request], [stdin, out, err])
            self.pid = int(self._connection.recv(64))
        finally:
            for fd in opened:
                os.close(fd)
        mode = "r" if text else "rb"
        self.stdout = None if out_read is None else open(out_read, mode)  # noqa: SIM115
        self.stderr = None if err_read is None else open(err_read, mode)  # noqa: SIM115

    def poll(self) -> int | None:
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                self._read_status()
            except BlockingIOError:
                pass
            finally:
                self._connection.setblocking(True)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                self._read_status()
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode  # type: ignore[return-value]

    def _read_status(self) -> None:
        self.returncode = int(self._connection.recv(64))
        self._connection.close()

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        import signal

        self.send_signal(signal.SIGKILL)

    def communicate(self, timeout: float | None = None) -> tuple[Any, Any]:
        results: dict[str, Any] = {}
        readers = [threading.Thread(target=lambda n=name, f=f: results.update({n: f.read()}))
                   for name, f in (("out", self.stdout), ("err", self.stderr)) if f]
        for reader in readers:
            reader.start()
        self.wait(timeout)
        for reader in readers:
            reader.join()
        for f in (self.stdout, self.stderr):
            if f:
                f.close()
        return results.get("out"), results.get("err")


def Popen(args: list[str], **kwargs: Any) -> Any:
    """``subprocess.Popen(args, ...)``, forked where it can be."""
    if _forkable(args, kwargs.get("env")):
        return Forked(args, **kwargs)
    return subprocess.Popen(args, **kwargs)


def run(args: list[str], *, capture_output: bool = False, timeout: float | None = None,
        **kwargs: Any) -> subprocess.CompletedProcess:
    """``subprocess.run(args, ...)``, forked where it can be."""
    if not _forkable(args, kwargs.get("env")):
        return subprocess.run(args, capture_output=capture_output, timeout=timeout,
                              **kwargs)
    if capture_output:
        kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    process = Forked(args, **kwargs)
    try:
        out, err = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(args, process.returncode, out, err)
