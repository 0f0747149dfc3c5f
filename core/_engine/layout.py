"""The state layout a checkpoint carries, and the moment a restore can pair names.

Every checkpoint of a pipeline holds its layout (name -> shape of every state
variable) as JSON. TensorFlow restores Python state after it has looked up
every other saved object of the restore, so when the layout arrives every
saved state entry has been deferred (``StateStore._lookup_dependency``), and
the pipeline can pair all of them at once. Python state, not a string
variable: MultiWorkerMirrored cannot broadcast those.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import tensorflow as tf


class LayoutState(tf.train.experimental.PythonState):
    """``layout()`` when saved; ``restored(saved_layout)`` when restored."""

    def __init__(self, layout: Callable[[], dict[str, list[int]]],
                 restored: Callable[[dict[str, list[int]]], None]) -> None:
        self._layout = layout
        self._restored = restored

    def serialize(self) -> str:
        return json.dumps(self._layout(), sort_keys=True)

    def deserialize(self, string_value: Any) -> None:
        text = string_value.decode() if isinstance(string_value, bytes) else string_value
        self._restored(json.loads(text) if text else {})
