"""``pipe.keras_optimizer()``: a Pipeline as a Keras 3 optimizer for compile()/fit().

Keras 3 would clip per replica, all-reduce again inside ``apply_gradients``,
decide finiteness on replica 0 and, under ``mixed_float16``, wrap the
optimizer in a second ``LossScaleOptimizer`` (keras-distribute-notes §0). The
adapter overrides ``apply`` entirely, so the pipeline reduces, unscales,
checks, clips and updates exactly once, with the same numerics as a custom
loop. It subclasses ``LossScaleOptimizer`` only so that ``compile`` does not
wrap it; none of that class's state or logic is used.

Saving: ``get_config`` carries the resolved TOML, and ``save_own_variables``
writes the state under stable names (not Keras's positional "0", "1", ...),
so loading a ``.keras`` file restores it by name and a different layout is an
error that names what differs.
"""

from __future__ import annotations

from typing import Any

from .errors import GradpipeError
from .state import layout_difference

_CLASS: Any = None


def pipeline_optimizer(pipe: Any, name: str = "gradpipe") -> Any:
    return optimizer_class()(pipeline=pipe, name=name)


def match_saved_names(expected: list[str], saved: list[str]) -> dict[str, str]:
    """Saved name -> expected name, allowing the model's scope and numbering to differ.

    1. Equal names match.
    2. Keras may save ``sequential_3.dense.kernel`` and rebuild ``dense.kernel``: a
       saved slot matches when it has the same transform and slot and one variable
       path ends the other at a ``.`` boundary, and the match is unique.
    3. A new model in the same process gets new automatic names (``dense_20`` ->
       ``dense_22``): names still unmatched are compared with that numbering
       stripped and paired in numeric order when the groups have the same size.
    Anything left unmatched is reported by the caller, never loaded by position.
    """
    import re

    def split(name: str) -> tuple[str, str]:
        head, _, tail = name.rpartition("/")
        return head, tail

    def numbers(name: str) -> list[int]:
        return [int(n) for n in re.findall(r"_(\d+)(?=\.|$)", split(name)[1])]

    def stripped(name: str) -> tuple[str, str]:
        head, tail = split(name)
        return head, re.sub(r"_\d+(?=\.|$)", "", tail)

    matches = {name: name for name in set(expected) & set(saved)}
    for name in sorted(set(saved) - set(matches)):
        head, tail = split(name)
        free = [e for e in expected if e not in matches.values()]
        candidates = [e for e in free if split(e)[0] == head and (
            f".{split(e)[1]}".endswith(f".{tail}") or f".{tail}".endswith(f".{split(e)[1]}"))]
        if len(candidates) == 1:
            matches[name] = candidates[0]
    groups: dict[tuple[str, str], tuple[list[str], list[str]]] = {}
    for name in saved:
        if name not in matches:
            groups.setdefault(stripped(name), ([], []))[0].append(name)
    for name in expected:
        if name not in matches.values():
            groups.setdefault(stripped(name), ([], []))[1].append(name)
    for old, new in groups.values():
        if len(old) == len(new):
            matches.update(zip(sorted(old, key=numbers), sorted(new, key=numbers)))
    return matches


def optimizer_class() -> Any:
    """The Keras optimizer class (created once, on first use, so Keras loads lazily)."""
    global _CLASS
    if _CLASS is not None:
        return _CLASS
    import keras
    import tensorflow as tf

    @keras.saving.register_keras_serializable(package="gradpipe", name="PipelineOptimizer")
    class PipelineOptimizer(keras.optimizers.LossScaleOptimizer):
        """A gradpipe Pipeline behind the Keras optimizer interface."""

        def __init__(self, pipeline: Any = None, name: str = "gradpipe",
                     pipeline_toml: str | None = None, **kwargs: Any) -> None:
            # Skip LossScaleOptimizer.__init__: the pipeline does the scaling.
            keras.optimizers.Optimizer.__init__(self, learning_rate=0.0, name=name)
            if pipeline is None:
                if pipeline_toml is None:
                    raise GradpipeError("PipelineOptimizer needs a pipeline or its TOML")
                import tomllib

                from .api import build

                pipeline = build(tomllib.loads(pipeline_toml))
            self.pipeline = pipeline

        # -- what Keras calls ----------------------------------------------

        def build(self, var_list: Any) -> None:
            if self.built:
                return
            keras.optimizers.Optimizer.build(self, var_list)
            self.pipeline.build(list(var_list))

        @property
        def variables(self) -> list[Any]:
            return list(self.pipeline.named_variables().values())

        @property
        def iterations(self) -> Any:
            return self.pipeline.iterations

        @property
        def learning_rate(self) -> Any:
            return self.pipeline.learning_rate

        @learning_rate.setter
        def learning_rate(self, value: Any) -> None:
            if getattr(self, "pipeline", None) is not None:
                raise GradpipeError("the learning rate of a gradpipe optimizer comes from "
                                    "its pipeline file: use a schedule there")
            keras.optimizers.Optimizer.learning_rate.fset(self, value)

        def scale_loss(self, loss: Any) -> Any:
            # Keras losses already divide by the number of replicas
            # (scale_loss_for_distribution): only the loss scale is missing, and
            # for reduction = "sum" the factor Keras divided by.
            placement = self.pipeline.placement
            summed = placement is not None and placement.reduction == "sum"
            if self.pipeline.loss_scaler is None and not summed:
                return loss  # a factor of 1 would add a multiplication forward and back
            factor = self.pipeline.loss_scale
            if summed:
                factor = factor * float(self.pipeline.strategy.num_replicas_in_sync)
            return loss * tf.cast(factor, loss.dtype)

        def apply(self, grads: Any, trainable_variables: Any = None) -> Any:
            variables = (trainable_variables if trainable_variables is not None
                         else self._trainable_variables)
            if not self.built:
                with tf.init_scope():
                    self.build(variables)
            return self.pipeline.apply_gradients(zip(grads, variables))

        def stateless_apply(self, *args: Any, **kwargs: Any) -> Any:
            raise GradpipeError("gradpipe runs on the TensorFlow backend only")

        def finalize_variable_values(self, var_list: Any) -> None:
            del var_list  # no EMA swap: the pipeline updates variables in place

        # -- saving --------------------------------------------------------

        def get_config(self) -> dict[str, Any]:
            return {"name": self.name, "pipeline_toml": self.pipeline.to_toml()}

        @classmethod
        def from_config(cls, config: dict[str, Any], custom_objects: Any = None) -> Any:
            return cls(**config)

        def save_own_variables(self, store: Any) -> None:
            for name, var in self.pipeline.named_variables().items():
                store[name.replace("/", "|")] = var.numpy()  # "/" would nest H5 groups

        def load_own_variables(self, store: Any) -> None:
            expected = self.pipeline.named_variables()
            saved = {key.replace("|", "/"): key for key in store.keys()}  # noqa: SIM118 (H5 store)
            matched = match_saved_names(list(expected), list(saved))
            found = {matched.get(k, k): list(store[saved[k]].shape) for k in saved}
            difference = layout_difference({k: list(v.shape) for k, v in expected.items()},
                                            found)
            if difference:
                raise GradpipeError("the saved optimizer state does not match this "
                                    f"pipeline: {difference}")
            by_expected = {matched.get(k, k): k for k in saved}
            for name, var in expected.items():
                var.assign(store[saved[by_expected[name]]])

    _CLASS = PipelineOptimizer
    return _CLASS
