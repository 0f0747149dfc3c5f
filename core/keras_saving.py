"""gradpipe's optimizer in saved Keras files: reading it, and loading it.

A model compiled with ``pipe.keras_optimizer()`` saves its optimizer as
``gradpipe>PipelineOptimizer`` with the pipeline's resolved TOML as its whole
config. Two things follow, both without TensorFlow:

* :func:`saved_pipeline_toml` reads that TOML back out of a config
  (``gradpipe from-keras model.keras``);
* :func:`register_on_keras_import` lets Keras load such a file in a process
  that has only imported ``gradpipe``. Keras resolves the saved name in its
  registry of custom objects, which the real class enters only once it is
  made, and making it imports TensorFlow, which ``import gradpipe`` must not.
  So a light stand-in is entered instead, as soon as Keras itself is imported
  (by whom does not matter): its ``from_config`` makes the real class and
  hands over. Making the real class replaces the stand-in in the registry.
"""

from __future__ import annotations

import importlib.abc
import json
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .errors import GradpipeError

__all__ = ["PIPELINE_OPTIMIZER", "read_optimizer_config", "register_on_keras_import",
           "saved_pipeline_toml"]

#: The name Keras saves ``pipe.keras_optimizer()`` under (Keras 3 and tf-keras alike).
PIPELINE_OPTIMIZER = "gradpipe>PipelineOptimizer"


def read_optimizer_config(path: str | Path) -> Any:
    """The serialized optimizer in a file: ``keras.optimizers.serialize`` output as
    JSON, a model config whose ``compile_config`` has one, or a ``.keras`` archive."""
    import zipfile

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                data = json.loads(archive.read("config.json"))
        else:
            data = json.loads(Path(path).read_text())
    except (OSError, KeyError, ValueError) as exc:
        raise GradpipeError(f"{path}: cannot read a Keras optimizer config: {exc}") from None
    if isinstance(data, dict) and "compile_config" in data:
        data = (data["compile_config"] or {}).get("optimizer")
    if not isinstance(data, (dict, str)):
        raise GradpipeError(f"{path}: no optimizer config in it (a dict from "
                            "keras.optimizers.serialize, or a model's compile_config)")
    return data


def saved_pipeline_toml(data: Any, path: str | Path) -> str | None:
    """The pipeline TOML a gradpipe optimizer's config holds, or ``None`` for any
    other optimizer.

    Keras cannot rebuild that optimizer without gradpipe's class, and there is
    nothing to translate: the config is the resolved pipeline file itself.
    """
    if not isinstance(data, Mapping) or not (
            data.get("registered_name") == PIPELINE_OPTIMIZER
            or data.get("class_name") == PIPELINE_OPTIMIZER.partition(">")[2]):
        return None
    toml = (data.get("config") or {}).get("pipeline_toml")
    if not isinstance(toml, str):
        raise GradpipeError(f"{path}: its gradpipe optimizer config has no pipeline_toml")
    return f"# The pipeline stored in {Path(path).name} (gradpipe from-keras).\n{toml}"


def _real_class(keras: str) -> Any:
    """The optimizer class for this Keras (``keras`` or ``tf_keras``); imports TF."""
    from ._engine.pipeline import Pipeline

    if keras == "tf_keras":
        from ._engine.tf_keras_adapter import optimizer_class
    else:
        from ._engine.keras_adapter import optimizer_class
    return optimizer_class(Pipeline)


def _stand_in(keras: str) -> type:
    class PipelineOptimizer:
        """Stands in for gradpipe's Keras optimizer until a saved one is loaded."""

        @classmethod
        def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
            return _real_class(keras).from_config(config, custom_objects)

    return PipelineOptimizer


def _register(module: Any) -> None:
    """Enter the stand-in in the registry of this Keras module, unless the real
    class (or an earlier stand-in) is there."""
    saving = getattr(module, "saving", None)
    if saving is None or not hasattr(saving, "get_custom_objects"):
        return  # not the Keras this was written for: it says what is missing itself
    saving.get_custom_objects().setdefault(PIPELINE_OPTIMIZER, _stand_in(module.__name__))


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs a function on a module once it has been executed, however it is imported.

    It finds nothing itself: for the names it watches it asks the other finders and
    wraps the loader of what they found.
    """

    def __init__(self, hooks: Mapping[str, Callable[[Any], None]]) -> None:
        self.hooks = hooks

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname not in self.hooks:
            return None
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if finder is self or find is None:
                continue
            spec = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader, self.hooks[fullname])
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader: Any, then: Callable[[Any], None]) -> None:
        self.loader = loader
        self.then = then

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        try:
            self.loader.exec_module(module)
        finally:
            # Hand the module its own loader back: nothing else should see this one.
            module.__loader__ = self.loader
            if module.__spec__ is not None:
                module.__spec__.loader = self.loader
        self.then(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


def register_on_keras_import() -> None:
    """Let Keras (and tf-keras) load a gradpipe optimizer from now on, without
    importing either: now where one is imported already, else when it is."""
    names = ("keras", "tf_keras")
    for name in names:
        if name in sys.modules:
            _register(sys.modules[name])
    waiting = {name: _register for name in names if name not in sys.modules}
    if waiting and not any(isinstance(f, _AfterImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterImport(waiting))
