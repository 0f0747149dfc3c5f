"""What the Keras 3 and the tf-keras (Keras 2) optimizer adapters share.

Both override the whole apply, so the pipeline reduces, unscales, checks,
clips and updates exactly once, with a custom loop's numerics. Both subclass
their Keras's loss-scale optimizer only so that ``compile`` does not wrap
them in a second one; and, as ``compile`` would, they give a pipeline without
``[loss_scale]`` Keras's dynamic loss scaling under ``mixed_float16``.

Saving: the config is the resolved TOML, and the state is written under its
stable names (not Keras's positional "0", "1", ...), so loading restores it
by name, matched as a checkpoint is (:mod:`gradpipe.names`), and a different
layout is an error that names what differs.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any

from ..errors import GradpipeError
from ..names import matched_layout

#: The loss scaling each Keras's ``compile`` adds under ``mixed_float16``: Keras 3's
#: ``LossScaleOptimizer`` has no floor; tf-keras's keeps the scale at least 1.
KERAS_LOSS_SCALE = {
    "keras": {"kind": "dynamic", "initial_loss_scale": 32768.0, "increment_period": 2000,
              "min_loss_scale": 0.0},
    "tf_keras": {"kind": "dynamic", "initial_loss_scale": 32768.0, "increment_period": 2000,
                 "min_loss_scale": 1.0},
}


def which_keras() -> str:
    """``"tf_keras"`` where ``tf.keras`` is Keras 2 (``TF_USE_LEGACY_KERAS=1``), else
    ``"keras"``."""
    import tensorflow as tf

    module = tf.keras.optimizers.Optimizer.__module__
    return "tf_keras" if module.startswith("tf_keras") else "keras"


def add_keras_loss_scale(pipe: Any, policy: str, keras: str) -> None:
    """Under ``mixed_float16``, give a pipeline without a loss scaler the one Keras's
    ``compile`` would, and say so once, naming how to choose another."""
    if policy != "mixed_float16" or pipe.loss_scaler is not None:
        return
    table = KERAS_LOSS_SCALE[keras]
    pipe.add_loss_scale(table)
    keys = ", ".join(f"{k} = {v!r}".replace("'", '"') for k, v in table.items())
    warnings.warn(
        "gradpipe: the mixed_float16 policy needs loss scaling and this pipeline has no "
        f"[loss_scale]; it uses {keras}'s default, as compile() would: [loss_scale] "
        f"{keys}. Put a [loss_scale] table in the pipeline file to choose "
        '(kind = "fixed" with loss_scale_value = 1.0 scales nothing).',
        stacklevel=_level_of_user_code())


def _level_of_user_code() -> int:
    """The ``stacklevel`` of the first caller outside gradpipe, Keras and TensorFlow
    (the build runs inside ``fit``'s first trace): a warning names the user's line."""
    frame, level = sys._getframe(2), 2  # the caller of the function that warns
    while frame.f_back is not None and frame.f_globals.get(
            "__name__", "").split(".")[0] in _NOT_THE_USERS:
        frame, level = frame.f_back, level + 1
    return level


# the packages a build runs through from the user's call: the standard library's too
_NOT_THE_USERS = frozenset({"gradpipe", "keras", "tf_keras", "tensorflow"}
                           ) | sys.stdlib_module_names


def scale_loss(pipe: Any, loss: Any) -> Any:
    """``loss`` as the pipeline expects it, from a Keras loss.

    Keras losses are already divided by the number of replicas; only the loss
    scale is missing, and, for ``reduction = "sum"``, the factor Keras divided by.
    """
    import tensorflow as tf

    placement = pipe.placement
    summed = placement is not None and placement.reduction == "sum"
    if pipe.loss_scaler is None and not summed:
        return loss  # a factor of 1 would add a multiplication forward and back
    factor = pipe.loss_scale
    if summed:
        factor = factor * float(pipe.strategy.num_replicas_in_sync)
    return loss * tf.cast(factor, loss.dtype)


def save_state(pipe: Any, store: Any) -> None:
    """Write every state variable into a Keras store under its stable name."""
    for name, var in pipe.named_variables().items():
        store[name.replace("/", "|")] = var.numpy()  # "/" would nest H5 groups


def load_state(pipe: Any, store: Any) -> None:
    """Restore every state variable from a Keras store, names matched; a different
    layout is an error naming what differs, raised before any value is assigned."""
    expected = pipe.named_variables()
    saved = {key.replace("|", "/"): key for key in store.keys()}  # noqa: SIM118 (H5 store)
    if set(saved) < set(expected) and not any(
            name.startswith(("slots/", "accumulators/", "masters/")) for name in saved):
        # Saved before the first step, when only the counters exist: restore them and
        # keep the new state, as Keras loads an optimizer saved unbuilt.
        for name, key in saved.items():
            expected[name].assign(store[key])
        return
    matched, difference = matched_layout(
        {k: list(v.shape) for k, v in expected.items()},
        {k: list(store[key].shape) for k, key in saved.items()})
    if difference:
        raise GradpipeError(f"the saved optimizer state does not match this pipeline: "
                            f"{difference}")
    for old, name in matched.items():
        expected[name].assign(store[saved[old]])


def pipeline_from_toml(pipeline_type: type, pipeline: Any, toml: str | None) -> Any:
    """The pipeline an adapter is given, or the one its saved TOML describes."""
    if pipeline is not None:
        return pipeline
    if toml is None:
        raise GradpipeError("a gradpipe Keras optimizer needs a pipeline or its TOML")
    import tomllib

    from ..config import parse_mapping

    return pipeline_type(parse_mapping(tomllib.loads(toml)))

class AdapterMethods:
    """What the Keras 3 and the tf-keras adapter classes do alike (a base listed
    before the Keras class, whose methods of these names it replaces)."""

    pipeline: Any
    name: str

    @property
    def dynamic_scale(self) -> Any:
        """The current loss scale, where Keras's ``LossScaleOptimizer`` has it."""
        return self.pipeline.loss_scale

    def finalize_variable_values(self, var_list: Any) -> None:
        del var_list  # no EMA swap: the pipeline updates variables in place

    def get_config(self) -> dict[str, Any]:
        return {"name": self.name, "pipeline_toml": self.pipeline.to_toml()}

    def save_own_variables(self, store: Any) -> None:
        save_state(self.pipeline, store)

    def load_own_variables(self, store: Any) -> None:
        load_state(self.pipeline, store)


class LearningRateHandle:
    """``optimizer.learning_rate`` (tf-keras: ``optimizer.lr``): the pipeline's rate
    as Keras code uses a rate variable. It reads as a float32 tensor (``float()``,
    numpy, arithmetic, ``backend.get_value``), and ``assign`` (tf-keras's
    ``backend.set_value``, a callback's ``learning_rate.assign(x)``) sets it,
    validated as ``pipe.learning_rate = x`` is."""

    is_tensor_like = True  # so that backend.get_value reads it with numpy()

    def __init__(self, pipeline: Any) -> None:
        self._pipeline = pipeline

    @property
    def dtype(self) -> Any:
        import tensorflow as tf

        return tf.float32

    def read_value(self) -> Any:
        return self._pipeline.learning_rate

    def numpy(self) -> Any:
        return self.read_value().numpy()

    def assign(self, value: Any, read_value: bool = False) -> Any:
        self._pipeline.learning_rate = value
        return self.read_value() if read_value else None

    def __tf_tensor__(self, dtype: Any = None, name: Any = None) -> Any:
        import tensorflow as tf

        return tf.convert_to_tensor(self.read_value(), dtype=dtype, name=name)

    def __float__(self) -> float:
        return float(self.numpy())

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        import numpy as np

        return np.asarray(self.numpy(), dtype=dtype)

    def __repr__(self) -> str:
        return f"<gradpipe learning rate {float(self)}>"


def _read_then(name: str) -> Any:
    return lambda self, *args: getattr(self.read_value(), name)(*args)


# arithmetic and comparisons, as on the tensor the rate reads as (Keras's rate
# variable has them: ``optimizer.learning_rate * 0.5``)
for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__",
              "__truediv__", "__rtruediv__", "__pow__", "__neg__", "__abs__", "__lt__",
              "__le__", "__gt__", "__ge__"):
    setattr(LearningRateHandle, _name, _read_then(_name))
