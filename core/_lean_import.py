"""Import TensorFlow without the optional integrations Keras imports with it.

``import tensorflow`` imports Keras, and Keras imports scikit-learn (for its
estimator wrappers) and matplotlib's pyplot (for its image gallery) whenever
they are installed: about a third of the time the import takes on a 2-core
machine, paid by every ``gradpipe run`` and ``check --plan`` although neither
uses those wrappers. While the command line imports TensorFlow, those two
imports, and only when Keras's wrapper or gallery modules make them, fail as
if the packages were absent; Keras then leaves its wrappers unusable in that
process, as it does where they are not installed. Anything else, gradpipe's
``digits`` problem and its plots included, imports them as usual afterwards.
Library users' own processes are never affected: only the CLI does this.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

# the optional packages, and the Keras modules whose imports of them are skipped
_SKIPPED = {"sklearn": "keras.src.wrappers", "matplotlib": "keras.src.visualization"}


class _SkipKerasExtras(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        owner = _SKIPPED.get(name.partition(".")[0])
        if owner is not None and _importer().startswith(owner):
            raise ModuleNotFoundError(f"No module named {name!r} (skipped)", name=name)
        return None


def _importer() -> str:
    """The module whose code runs the import being resolved."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if not module.startswith(("importlib", "_frozen_importlib")):
            return str(module)
        frame = frame.f_back
    return ""


@contextlib.contextmanager
def without_keras_extras() -> Iterator[None]:
    """While in this block, Keras's imports of scikit-learn and pyplot fail."""
    finder = _SkipKerasExtras()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
