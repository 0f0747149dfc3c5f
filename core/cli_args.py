"""What the command line's arguments must be, checked as argparse reads them.

A wrong argument is a usage error: argparse prints the command's usage and the
problem, and the command exits 2 before it reads a pipeline (an invalid
pipeline exits 1). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import Any

__all__ = ["SetOnce", "pipeline_file", "pipeline_file_or_folder"]


def pipeline_file(text: str) -> str:
    """An existing file (``gradpipe check FILE``, ``gradpipe schedule FILE``)."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a pipeline file")
    if not path.exists():
        raise argparse.ArgumentTypeError(_missing(path, text, folders=False))
    return text


def pipeline_file_or_folder(text: str) -> str:
    """An existing file, or the folder of an earlier run (``gradpipe run FILE...``)."""
    path = Path(text)
    if not path.exists():
        raise argparse.ArgumentTypeError(_missing(path, text, folders=True))
    return text


def _missing(path: Path, text: str, folders: bool) -> str:
    """``no such file``, with the nearest name in its folder where one is close
    (a typo such as ``quickstar.toml``), or the folder that is missing."""
    parent = path.parent
    if not parent.is_dir():
        return f"{text}: no such file: there is no folder {str(parent)!r}"
    names = sorted(p.name for p in parent.iterdir() if folders or not p.is_dir())
    close = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    # Keep the user's own spelling of the folder: "examples/x", not "/abs/examples/x".
    hint = f" (did you mean {str(Path(text).with_name(close[0]))!r}?)" if close else ""
    return f"{text}: no such file{hint}"


class SetOnce(argparse.Action):
    """``--set``, repeatable, but each key once: a second value for a key (or for a key
    inside a table another ``--set`` replaces) would silently win over the first."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = list(getattr(namespace, self.dest, None) or [])  # never argparse's default
        for earlier in given:
            clash = _clash(earlier, values)
            if clash:
                parser.error(clash)
        setattr(namespace, self.dest, [*given, values])


def _clash(first: Any, second: Any) -> str | None:
    """Why two overrides (:class:`gradpipe.overrides.Override`) cannot both apply."""
    if first.path == second.path:
        values = ",".join(_raw(o.argument) for o in (first, second))
        return (f"--set {first.path} is given twice ({first.argument} and "
                f"{second.argument}): give it once, or sweep the values with "
                f"--set {first.path}={values}")
    outer, inner = sorted((first, second), key=lambda o: len(o.path))
    if inner.path.startswith((outer.path + ".", outer.path + "[")):
        return (f"--set {outer.path} and --set {inner.path} both set {inner.path}: "
                "give one of them")
    return None


def _raw(argument: str) -> str:
    return argument.partition("=")[2].strip()
