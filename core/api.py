"""The public entry points: ``load``, ``build``, ``parse`` and ``create``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .components import create
from .config import parse_mapping
from .errors import GradpipeError
from .spec import PipelineSpec
from .toml_source import read_file

if TYPE_CHECKING:
    from ._engine.pipeline import Pipeline

__all__ = ["build", "create", "load", "parse"]


def parse(source: str | Path | Mapping[str, Any]) -> PipelineSpec:
    """Validate a pipeline file (path) or mapping without building it.

    Needs no TensorFlow: this is what ``gradpipe check`` runs.
    """
    if isinstance(source, Mapping):
        return parse_mapping(source)
    data, lines, file = read_file(source)
    return parse_mapping(data, file=file, lines=lines)


def load(path: str | Path) -> Pipeline:
    """Read, validate and build the pipeline in a TOML file."""
    if not isinstance(path, (str, Path)):
        raise GradpipeError(f"gradpipe.load takes a pipeline file's path; got a "
                            f"{type(path).__name__}: " + _build_instead(path))
    return _build_spec(parse(Path(path)))


def _build_instead(value: Any) -> str:
    """What builds a pipeline from ``value`` where ``load`` was called with it."""
    if type(value).__module__.split(".")[0] in ("keras", "tf_keras"):
        return "for a Keras optimizer, gradpipe.build(gradpipe.from_keras(optimizer))"
    return "gradpipe.build takes a mapping (a TOML-shaped dict)"


def build(mapping: Mapping[str, Any] | PipelineSpec) -> Pipeline:
    """Validate and build a pipeline from a TOML-shaped mapping (or a parsed spec)."""
    spec = mapping if isinstance(mapping, PipelineSpec) else parse(mapping)
    return _build_spec(spec)


def _build_spec(spec: PipelineSpec) -> Pipeline:
    from ._engine.pipeline import Pipeline

    return Pipeline(spec)
