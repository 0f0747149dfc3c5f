"""What the registry records about each plugin and component, and how a failure reads.

Plain data, no TensorFlow: ``gradpipe plugins`` prints these records, in words
or as JSON.
"""

from __future__ import annotations

import re
import traceback
from collections.abc import Callable
from importlib import util
from pathlib import Path
from typing import Any

import attrs

from .capabilities import Capabilities
from .entry_points import BUILTIN_DIST, KIND_HOOKS
from .hints import did_you_mean


@attrs.frozen(kw_only=True)
class Provider:
    """Where a component or plugin comes from."""

    dist: str
    version: str
    entry_point: str
    value: str = ""

    def __str__(self) -> str:
        return f"{self.dist} {self.version} (entry point {self.entry_point!r})"


@attrs.frozen(kw_only=True)
class Component:
    """One registered component: a name bound to a factory and its config."""

    kind: str
    name: str
    factory: Callable[..., Any]
    config_cls: type
    provider: Provider
    capabilities: Capabilities = attrs.field(factory=Capabilities)
    #: ``kernel(config) -> apply(grads, slots, variables) -> ops``: the update done in
    #: place by fused kernels (see ``gradpipe_register_transforms``), or None
    kernel: Callable[..., Any] | None = None


@attrs.define(kw_only=True)
class PluginRecord:
    """The load status of one entry point."""

    provider: Provider
    status: str  # loaded | failed | blocked | conflict
    error: str | None = None
    import_seconds: float = 0.0
    hooks: list[str] = attrs.Factory(list)
    components: dict[str, list[str]] = attrs.Factory(dict)
    attempted: list[str] = attrs.Factory(list)
    #: where a failure happened in the plugin's own code ("path/to/module.py:12")
    location: str | None = None
    #: the failure's full traceback (``gradpipe plugins --traceback`` prints it)
    traceback: str | None = None

    @property
    def builtin(self) -> bool:
        return self.provider.dist == BUILTIN_DIST

    def as_dict(self) -> dict[str, Any]:
        return {
            "distribution": self.provider.dist,
            "version": self.provider.version,
            "entry_point": self.provider.entry_point,
            "module": self.provider.value,
            "builtin": self.builtin,
            "status": self.status,
            "error": self.error,
            "import_seconds": round(self.import_seconds, 4),
            "hooks": self.hooks,
            "components": self.components,
            "location": self.location,
            "traceback": self.traceback,
        }


def hook_hint(exc: Exception) -> str:
    text = str(exc)
    match = re.search(r"unknown hook '?(\w+)'?", text)
    if match:
        hook = match.group(1)
        return f"unknown hook {hook!r}{did_you_mean(hook, KIND_HOOKS.values())}"
    return text


def failure(record: PluginRecord, error: str, exc: BaseException | None = None
            ) -> PluginRecord:
    """Mark ``record`` failed with ``error``; with ``exc``, where in the plugin's own
    code it was raised (the last frame there) and the whole traceback."""
    record.status = "failed"
    record.error = error
    if exc is not None:
        frames = traceback.extract_tb(exc.__traceback__)
        own = _plugin_files(record.provider.value)
        mine = [f for f in frames if own(f.filename)] or [
            f for f in frames if not f.filename.startswith("<")]
        if mine:
            record.location = f"{mine[-1].filename}:{mine[-1].lineno}"
        record.traceback = "".join(traceback.format_exception(exc))
    return record


def _plugin_files(value: str) -> Callable[[str], bool]:
    """Whether a file belongs to the plugin whose entry point is ``value``
    (``package.module:attr``): its top-level package's folder, or its module file."""
    top = value.split(":")[0].split(".")[0]
    try:
        spec = util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    origin = spec.origin if spec is not None else None
    if not origin:
        return lambda filename: False
    path = Path(origin)
    root = path.parent if path.name == "__init__.py" else path
    return lambda filename: Path(filename) == root or root in Path(filename).parents
