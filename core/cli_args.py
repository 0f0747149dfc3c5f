"""What the command line's arguments must be, checked as argparse reads them.

A wrong argument is a usage error: argparse prints the command's usage and the
problem, and the command exits 2 before it reads a pipeline (an invalid
pipeline exits 1). Nothing here imports TensorFlow.
"""

from __future__ import annotations

import argparse
import difflib
import re
from pathlib import Path
from typing import Any

import attrs

from .errors import ConfigError, GradpipeError

__all__ = ["SetOnce", "parse_shapes", "pipeline_file", "pipeline_file_or_folder",
           "with_shapes_hint"]


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


def with_shapes_hint(exc: ConfigError, shapes: dict[str, list[int]] | None) -> ConfigError:
    """``exc``, where a pattern matched none of the unnamed ``--shapes`` variables, with
    how to name them."""
    if not shapes or not all(re.fullmatch(r"variable_\d+", name) for name in shapes):
        return exc
    hint = ("; name them as your model does with --shapes NAME=SHAPE "
            "(dense/kernel=784x256,dense/bias=256)")
    return ConfigError([attrs.evolve(p, message=p.message + hint)
                        if "matches no variable" in p.message else p for p in exc.problems])


def parse_shapes(text: str) -> dict[str, list[int]]:
    """``784x256,256`` or ``800x500*50,500*50``: one shape per variable, where
    ``SHAPE*N`` stands for N variables of that shape; ``NAME=SHAPE`` names the
    variable (``NAME_0`` .. for ``NAME=SHAPE*N``) so that ``variables`` and
    ``exclude`` patterns select as they would in the user's model."""
    shapes: dict[str, list[int]] = {}
    try:
        for part in text.split(","):
            name, equals, shape = part.rpartition("=")
            shape, star, count = shape.partition("*")
            dims = [int(d) for d in shape.split("x")]
            repeat = int(count) if star else 1
            if repeat < 1 or (equals and not name):
                raise ValueError(part)
            if not name:
                names = [f"variable_{len(shapes) + i}" for i in range(repeat)]
            elif repeat == 1:
                names = [name]
            else:
                names = [f"{name}_{i}" for i in range(repeat)]
            for each in names:
                if each in shapes:
                    raise GradpipeError(f"--shapes {text!r}: {each!r} is named twice")
                shapes[each] = dims
    except ValueError:
        shapes = {}
    if not shapes or any(d <= 0 for s in shapes.values() for d in s):
        raise GradpipeError(f"--shapes {text!r}: give variable shapes as dimensions "
                            "joined by x, separated by commas, SHAPE*N for N variables "
                            "of one shape, NAME=SHAPE to name one: 784x256,256,256x10,10 "
                            "or 800x500*50,500*50 or dense/kernel=784x256,dense/bias=256")
    return shapes
