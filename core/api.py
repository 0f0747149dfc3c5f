"""The public entry points: ``load``, ``build``, ``parse`` and ``create``."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .components import create
from .config import parse_mapping
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
    return _build_spec(parse(Path(path)))


def build(mapping: Mapping[str, Any] | PipelineSpec) -> Pipeline:
    """Validate and build a pipeline from a TOML-shaped mapping (or a parsed spec)."""
    spec = mapping if isinstance(mapping, PipelineSpec) else parse(mapping)
    return _build_spec(spec)


def _build_spec(spec: PipelineSpec) -> Pipeline:
    from ._engine.pipeline import Pipeline

    return Pipeline(spec)
