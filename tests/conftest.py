"""Shared fixtures: throwaway plugin distributions and numeric helpers."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import forked

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Builds remember their analyses here: one folder for this run's workers and the
# processes they start (set before xdist starts its workers), none from earlier runs.
os.environ.setdefault("GRADPIPE_CACHE_DIR", tempfile.mkdtemp(prefix="gradpipe-tests-"))

ROOT = Path(__file__).resolve().parents[1]
LOGICAL_CPUS = 4


def _split_cpu() -> None:
    """Four logical CPU devices for MirroredStrategy tests, before TF's runtime starts."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(LOGICAL_CPUS)])


def pytest_configure(config: pytest.Config) -> None:
    # xdist's controller runs no test: it need not import TensorFlow (4-5 s of CPU)
    controller = config.getoption("numprocesses", None) and not hasattr(config, "workerinput")
    if not controller:
        _split_cpu()


def gradpipe_command(*args, env: dict[str, str] | None = None, cwd=None,
                     timeout: float = 600) -> subprocess.CompletedProcess:
    """``gradpipe ARGS`` as a finished process: its return code, stdout and stderr.

    Run in this process, where TensorFlow is imported already (a new process
    spends 7-9 s importing it here), for the commands whose output does not list
    the registry: ``run``, ``schedule`` and ``check --plan`` (or ``--shapes`` or
    ``--problem``, which imply it). Anything else, or a given ``env`` (read at
    start-up), runs in a new process."""
    import contextlib
    import io

    argv = [str(a) for a in args]
    planned = {"--plan", "--shapes", "--problem"} & set(argv)
    if env is not None or not (argv[0] in ("run", "schedule") or planned):
        return subprocess.run([sys.executable, "-m", "gradpipe.cli", *argv], cwd=cwd,
                              capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
    from gradpipe.cli import main

    out, err, here = io.StringIO(), io.StringIO(), os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:  # argparse's usage errors
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(here)
    return subprocess.CompletedProcess(["gradpipe", *argv], code, out.getvalue(),
                                       err.getvalue())


def free_ports(n: int) -> list[int]:
    """``n`` TCP ports free on localhost now (for servers a test starts)."""
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def assert_close(actual, expected, *, rtol, atol):
    """Element-wise closeness over nests of arrays, with explicit tolerances."""
    import numpy as np

    if isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, rtol=rtol, atol=atol)
        return
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol,
                               atol=atol)


class FakeDist:
    """A real distribution on disk (dist-info + module), found by importlib.metadata."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, dist: str, version: str, entry_points: dict[str, str],
            modules: dict[str, str]) -> None:
        info = self.root / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = ["[gradpipe]"] + [f"{k} = {v}" for k, v in entry_points.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        for name, code in modules.items():
            (self.root / f"{name}.py").write_text(textwrap.dedent(code))

    def run(self, code: str, env: dict[str, str] | None = None, timeout: float = 120,
            *, tensorflow: bool = False):
        """Run Python code with these distributions installed; return the result.
        ``tensorflow``: the code imports it, so the process starts as a fork that has
        (``forked.run``: 4-5 s of CPU less); leave it off where the code must show
        what it imports."""
        full_env = {**os.environ, "PYTHONPATH": str(self.root), **(env or {})}
        for key in ("GRADPIPE_STRICT_PLUGINS", "GRADPIPE_PLUGINS",
                    "GRADPIPE_DISABLED_PLUGINS", "GRADPIPE_DISABLE_PLUGIN_AUTOLOAD"):
            if key not in (env or {}):
                full_env.pop(key, None)
        start = forked.run if tensorflow else subprocess.run
        return start([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                     text=True, env=full_env, timeout=timeout)

    def registry_json(self, env: dict[str, str] | None = None) -> dict:
        result = self.run("""
            import json
            from gradpipe.registry import get_registry
            r = get_registry().load_all()
            print(json.dumps({"plugins": [p.as_dict() for p in r.plugins],
                              "transforms": r.names("transform")}))
        """, env)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout)


@pytest.fixture
def fake_dists(tmp_path: Path) -> FakeDist:
    return FakeDist(tmp_path / "site")


@pytest.fixture
def write_toml(tmp_path: Path):
    def write(text: str, name: str = "pipe.toml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text).lstrip())
        return path

    return write


def register_transform(name: str, factory, config=None, *,
                       dist: str = "gradpipe-test-third-party", **options) -> None:
    """Register ``factory`` as transform ``name`` of an in-process third-party plugin
    (once), with register()'s keyword ``options`` (capabilities, kernel)."""
    import attrs

    from gradpipe.plugin import hookimpl
    from gradpipe.registry import Provider, get_registry

    class Plugin:
        @hookimpl
        def gradpipe_register_transforms(self, register):
            register(name, factory, config or attrs.frozen(kw_only=True)(
                type("Config", (), {})), **options)

    registry = get_registry()
    if ("transform", name) not in registry.components:
        record = registry.register_plugin(Plugin(), Provider(
            dist=dist, version="0", entry_point=name))
        assert record.status == "loaded", record.error


#: the step's paths a proof is held to the check on, and the transforms before the
#: rule that choose each (with ``jit_compile = path != "plain"``)
PROOF_PATHS = {"plain": [],  # one conditional over the whole step, not compiled
               "per-variable": [],  # compiled: an XLA function per shape
               # compiled whole: a clip reads every gradient (1e30: it never clips)
               "whole": [{"kind": "clip_by_global_norm", "clip_norm": 1e30}]}


def bounded_step(kind: str, jit: bool):
    """A pipeline of transform ``kind`` on a variable of 3, its variables and its traced
    step of that variable's gradient. The plain path bounds a step of 2**20 elements
    or more (a smaller one is checked, which costs no more there): without ``jit``, a
    variable of zeros, whose gradient is 0, makes it one."""
    import numpy as np
    import tensorflow as tf

    import gradpipe

    var = tf.Variable(np.zeros(3, "f4"))
    padding = [] if jit else [tf.Variable(tf.zeros(1 << 20))]
    pipe = gradpipe.build({"transforms": [{"kind": kind}], "pipeline": {"jit_compile": jit}})
    pipe.build([var, *padding])
    step = tf.function(lambda g: pipe.apply_gradients(
        [(g, var), *[(tf.zeros_like(p), p) for p in padding]]))
    return pipe, [var, *padding], step


def checked_copy(kind: str) -> str:
    """Register a built-in transform's very maths under a third party (once), and
    return its name: the engine checks that copy's outputs instead of proving them,
    and has no fused kernel for it."""
    from gradpipe.registry import get_registry

    name = f"{kind}_checked"
    builtin = get_registry().get("transform", kind)
    register_transform(name, builtin.factory, builtin.config_cls,
                       capabilities=builtin.capabilities)
    return name
