"""The build's analyses of a transform's maths, remembered across processes.

A build finds out how a transform's outputs are known finite by tracing its
maths (``guard.how_bounded``: 0.05 to 0.2 s for an adaptive rule, on every
start of a script). The answer depends only on that maths, so it is kept: in
this process, and in a small JSON file in the cache folder, so that a script
restarted twenty times a day pays for it once. The folder is
``GRADPIPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/gradpipe``, else
``~/.cache/gradpipe``; ``GRADPIPE_CACHE_DIR=""`` keeps nothing on disk.

An answer only picks how a step is guarded: each step's bounds are still
traced from that step's own maths and fall back to a check, so a wrong answer
could cost speed, never a guarantee. Answers are keyed by the transform's
component, version and config, by the versions of gradpipe, TensorFlow and
Python and the analysis's own code, and by the source files (their sizes and
modification times) of every package outside site-packages whose code the
transform's update reaches through its closures (a plugin or gradpipe
installed editable, a script): editing the maths asks again. A file that
cannot be read or written is ignored.

Whether XLA lowers a traced function (``xla_trial``) is kept too, keyed by a
digest of the traced graph itself, its inputs' shapes and types, the devices
and ``TF_XLA_FLAGS``: the same graph lowers the same way, so that answer is
exact.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import sys
import tempfile
import types
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import Any

import tensorflow as tf

_IN_MEMORY: dict[str, str] = {}
_FILE = "analyses-v1.json"
_KEPT = 4096  # answers kept on disk, the latest: a sweep over configs adds one each


def _gradpipe_version() -> str:
    try:
        return metadata.version("gradpipe")
    except metadata.PackageNotFoundError:  # run from a source tree: its files key it
        return "?"


def _analysis_code() -> str:
    """A digest of the analysis's own modules: an answer found by other bounds is
    found again, even where gradpipe's version is unchanged (a source checkout)."""
    digest = hashlib.sha256()
    for name in ("guard.py", "bounds.py", "intervals.py", "scalar_values.py", "state_reads.py"):
        with contextlib.suppress(OSError):
            digest.update((Path(__file__).parent / name).read_bytes())
    return digest.hexdigest()


_VERSIONS = [_gradpipe_version(), tf.__version__, sys.version, _analysis_code()]


def remembered(parts: tuple[Any, ...], code: Any, compute: Callable[[], str]) -> str:
    """``compute()``, or the answer kept for ``parts`` (reprs that name the maths)
    and the source of ``code`` (the transform's update)."""
    return _remember(_key(parts, code), compute)


def remembered_for(question: str, digest: str, compute: Callable[[], str]) -> str:
    """``compute()``, or the answer kept for ``question`` about what ``digest``
    describes whole (a traced graph's, ``trace_digest``): nothing else can change it."""
    text = json.dumps([question, digest, _VERSIONS])
    return _remember(hashlib.sha256(text.encode()).hexdigest(), compute)


def _remember(key: str, compute: Callable[[], str]) -> str:
    if key not in _IN_MEMORY:
        stored = _read().get(key)
        if isinstance(stored, str):
            _IN_MEMORY[key] = stored
        else:
            _IN_MEMORY[key] = compute()
            _write(key, _IN_MEMORY[key])
    return _IN_MEMORY[key]


def _folder() -> Path | None:
    configured = os.environ.get("GRADPIPE_CACHE_DIR")
    if configured is not None:
        return Path(configured) if configured.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "gradpipe"


def _read() -> dict[str, str]:
    folder = _folder()
    try:
        stored = json.loads((folder / _FILE).read_text()) if folder else {}
    except (OSError, ValueError):
        return {}
    return stored if isinstance(stored, dict) else {}


def _write(key: str, answer: str) -> None:
    folder = _folder()
    if folder is None:
        return
    with contextlib.suppress(OSError):
        folder.mkdir(parents=True, exist_ok=True)
        stored = {**_read(), key: answer}
        stored = dict(list(stored.items())[-_KEPT:])
        # a whole file or none: another process may read it meanwhile
        handle, temporary = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(handle, "w") as out:
            json.dump(stored, out)
        os.replace(temporary, folder / _FILE)


def _key(parts: tuple[Any, ...], code: Any) -> str:
    functions = _functions_reached(code)
    modules = {"gradpipe", "gradpipe.plugins", *(f.__module__ for f in functions)}
    sources = sorted({source for module in modules for source in _sources(module)})
    text = json.dumps([[repr(p) for p in parts], _VERSIONS, sources,
                       sorted(_code_text(f.__code__) for f in functions)])
    return hashlib.sha256(text.encode()).hexdigest()


def _functions_reached(code: Any) -> list[types.FunctionType]:
    """``code`` (a function, method or callable object) and the functions its
    closures and defaults hold, and theirs."""
    found: dict[int, types.FunctionType] = {}
    pending = [code]
    while pending:
        item = pending.pop()
        function = getattr(item, "__func__", item)  # a bound method's function
        if not isinstance(function, types.FunctionType):
            # a callable object's code: the first __call__ of its class's MRO
            call = next((vars(k)["__call__"] for k in type(item).__mro__
                         if "__call__" in vars(k)), None)
            if isinstance(call, types.FunctionType):
                pending.append(call)
            continue
        if id(function) in found:
            continue
        found[id(function)] = function
        cells = [c.cell_contents for c in function.__closure__ or () if _filled(c)]
        pending += [v for v in [*cells, *(function.__defaults__ or ())] if callable(v)]
    return list(found.values())


def _code_text(code: types.CodeType) -> str:
    """What ``code`` does, the same in every process (a code object's repr holds its
    address; a set literal's, an order that string hashing changes per process)."""
    return json.dumps([code.co_code.hex(), [_constant_text(c) for c in code.co_consts],
                       code.co_names])


def _constant_text(constant: Any) -> str:
    if isinstance(constant, types.CodeType):
        return _code_text(constant)
    if isinstance(constant, frozenset):
        return "frozenset" + json.dumps(sorted(map(_constant_text, constant)))
    return repr(constant)


def _filled(cell: Any) -> bool:
    try:
        cell.cell_contents  # noqa: B018 (an empty cell raises)
    except ValueError:
        return False
    return True


@functools.cache  # the code this process runs was read when it was imported
def _sources(module: str) -> tuple[tuple[str, int, int], ...]:
    """Path, modification time and size of each file ``_source_files`` names."""
    return tuple((str(path), stat.st_mtime_ns, stat.st_size)
                 for path in _source_files(module) if (stat := path.stat()))


def _source_files(module: str) -> set[Path]:
    """The Python files of the packages ``module`` is in (each of its parents'
    folders: an editable install may map them apart), or its own file; none for an
    installed package, whose version the key holds."""
    prefixes = [module.rsplit(".", n)[0] for n in range(module.count(".") + 1)]
    folders = {Path(p) for prefix in prefixes
               for p in getattr(sys.modules.get(prefix), "__path__", None) or ()}
    file = getattr(sys.modules.get(module), "__file__", None)
    if not folders and file:
        return set() if _installed(Path(file)) else {Path(file)}
    return {path for folder in folders if not _installed(folder)
            for path in folder.rglob("*.py")}


def _installed(path: Path) -> bool:
    return bool({"site-packages", "dist-packages"} & set(path.parts))
