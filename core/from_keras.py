"""``gradpipe.from_keras``: the pipeline table of a Keras 3 optimizer.

``from_keras(optimizer)`` returns the TOML-shaped table that
``gradpipe.build`` turns into a pipeline that trains as the optimizer does:
the update rule with every argument of its ``get_config()``, the learning rate
or ``LearningRateSchedule``, ``clipnorm`` / ``global_clipnorm`` /
``clipvalue``, ``weight_decay`` with its exclusions, ``LossScaleOptimizer``,
``loss_scale_factor`` and ``gradient_accumulation_steps``, in Keras's order:
unscale, accumulate, clip, decay, step. Whatever it cannot express exactly is a
``ConfigError`` naming each setting and why; nothing is dropped silently.

Imports Keras (and so TensorFlow) when called, never on ``import gradpipe``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from .errors import ConfigError, GradpipeError, Problem
from .keras_mapping import (
    BASE_KEYS,
    NONE_IS_ZERO,
    RULES,
    STEP_IGNORES_VARIABLE,
    alternatives,
    short_name_pattern,
    tf_name_pattern,
)
from .keras_saving import read_optimizer_config, saved_pipeline_toml

__all__ = ["from_keras", "pipeline_toml", "read_optimizer_config", "saved_pipeline_toml"]

_NOT_ZERO = "must be 0 or None"


def from_keras(optimizer: Any) -> dict[str, Any]:
    """The pipeline table (a TOML-shaped dict) equivalent to a Keras 3 optimizer.

    ``optimizer`` is a ``keras.optimizers.Optimizer`` (or a
    ``keras.mixed_precision.LossScaleOptimizer`` around one), or the dict
    ``keras.optimizers.serialize`` makes of one. Raises ``ConfigError``, with
    one problem per setting, for whatever gradpipe cannot reproduce exactly.
    """
    import keras

    if isinstance(optimizer, Mapping):
        optimizer = keras.optimizers.deserialize(dict(optimizer))
    translation = _Translation(keras)
    table = translation.run(optimizer)
    if translation.problems:
        raise ConfigError(translation.problems)
    from .api import parse

    parse(table)  # never hand out a table that gradpipe.build would refuse
    return table


def _plain(value: Any) -> Any:
    """A TOML value: Python scalars and lists (numpy scalars unwrapped)."""
    if value is None or isinstance(value, (bool, str, int, float)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "item"):
        return _plain(value.item())
    raise TypeError(f"{type(value).__name__} {value!r} is not a number, string or list")


def _float32(value: Any) -> float:
    """Keras holds a constant rate in a float32 variable: the shortest decimal of it."""
    import numpy as np

    return float(str(np.float32(value)))


class _Translation:
    def __init__(self, keras: Any) -> None:
        self.keras = keras
        self.problems: list[Problem] = []
        self.where = "keras optimizer"

    def fail(self, setting: str, message: str) -> None:
        self.problems.append(Problem(path=setting, message=message, file=self.where))

    def run(self, opt: Any) -> dict[str, Any]:
        keras = self.keras
        table: dict[str, Any] = {}
        if type(opt) is keras.optimizers.LossScaleOptimizer:
            # Keras 3: double on dynamic_growth_steps finite steps, halve on overflow,
            # no floor, no ceiling: gradpipe's dynamic with min_loss_scale = 0.
            table["loss_scale"] = {"kind": "dynamic",
                                   "initial_loss_scale": float(opt.initial_scale),
                                   "increment_period": int(opt.dynamic_growth_steps),
                                   "multiplier": 2.0, "min_loss_scale": 0.0}
            opt = opt.inner_optimizer
        name = type(opt).__name__
        self.where = f"keras.optimizers.{name}"
        if name not in RULES or type(opt) is not getattr(keras.optimizers, name, None):
            raise ConfigError([Problem(
                path="", file=f"{type(opt).__module__}.{name}",
                message="not one of Keras 3's optimizers that gradpipe has an update rule "
                        f"for ({', '.join(RULES)}); a subclass may change the step")])
        schedules: dict[str, Any] = {}
        rate = self.learning_rate(opt, schedules)
        if self.problems:  # get_config() would try to serialize the callable
            raise ConfigError(self.problems)
        config = opt.get_config()
        kind = RULES[name]
        if kind == "adam" and config["weight_decay"]:
            kind = "adamw"  # Keras's Adam with weight_decay is AdamW's step exactly
        rule = {"kind": kind, "learning_rate": rate, **self.rule_arguments(kind, config)}
        transforms = self.clipping(config) + [rule]
        transforms += self.weight_decay(opt, kind, config, rule, schedules)
        if config.get("use_ema"):
            self.fail("use_ema", "gradpipe's moving_average is TF Addons' (its first average "
                      "includes the weights before the first step, Keras's does not; the "
                      "average goes into the model when you swap it in, Keras writes it "
                      "every ema_overwrite_frequency steps and in finalize_variable_values); "
                      "add it after the rule if that is what you want, or keep Keras's "
                      "optimizer")
        factor = config.get("loss_scale_factor")
        if factor is not None:
            if factor < 1:
                self.fail("loss_scale_factor", f"{factor} is below 1; gradpipe's fixed loss "
                          "scale (loss x factor, gradients / factor) must be at least 1")
            else:
                table["loss_scale"] = {"kind": "fixed", "loss_scale_value": float(factor)}
        steps = config.get("gradient_accumulation_steps")
        if steps:
            table["pipeline"] = {"accumulation_steps": int(steps)}
            if isinstance(rate, str):
                self.fail("gradient_accumulation_steps", (
                    "with a learning-rate schedule: Keras evaluates the schedule at every "
                    "micro-batch's count (n * steps + steps - 1 on update n), gradpipe at "
                    "the count of applied updates (n)"))
        if schedules:
            table["schedules"] = schedules
        table["transforms"] = transforms
        return table

    def rule_arguments(self, kind: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """Every argument of the rule's ``get_config()`` under gradpipe's key."""
        from .registry import get_registry

        try:
            fields = {f.name: f for f in attrs.fields(
                get_registry().get("transform", kind).config_cls)}
        except GradpipeError as exc:
            self.fail("", f"gradpipe has no update rule {kind!r} installed: {exc}")
            return {}
        out: dict[str, Any] = {}
        for key, value in config.items():
            if key in BASE_KEYS:
                continue
            if key not in fields:
                self.fail(key, f"{kind} has no argument {key!r}; gradpipe cannot apply it")
            elif value is None and fields[key].default is None:
                continue  # unset in both (TOML has no null)
            elif value is None and key in NONE_IS_ZERO:
                out[key] = 0.0
            elif value is None:
                self.fail(key, f"None has no gradpipe value for {kind}.{key}")
            else:
                try:
                    out[key] = _plain(value)
                except TypeError as exc:
                    self.fail(key, str(exc))
        if kind == "schedule_free_adamw" and "keras_tf_momentum_read" in fields:
            # what Keras 3's ScheduleFreeAdamW computes on the TensorFlow backend
            out["keras_tf_momentum_read"] = True
        return out

    def learning_rate(self, opt: Any, schedules: dict[str, Any]) -> Any:
        """A number, or ``"@lr"`` with ``schedules["lr"]`` the Keras-named schedule."""
        keras = self.keras
        rate = opt._learning_rate
        if isinstance(rate, keras.optimizers.schedules.LearningRateSchedule):
            name = type(rate).__name__
            if type(rate) is not getattr(keras.optimizers.schedules, name, None):
                self.fail("learning_rate", f"{type(rate).__module__}.{name} is not one of "
                          "Keras's six LearningRateSchedule classes, which gradpipe has "
                          "under their names; a custom schedule has no gradpipe kind")
                return 0.0
            try:
                config = {k: _plain(v) for k, v in rate.get_config().items()
                          if v is not None}  # None: unset, gradpipe's default too
            except TypeError as exc:
                self.fail("learning_rate", str(exc))
                return 0.0
            schedules["lr"] = {"kind": name, **config}
            return "@lr"
        if isinstance(rate, keras.Variable):
            return _float32(rate.numpy())
        self.fail("learning_rate", f"a callable ({rate!r}) is not a LearningRateSchedule: "
                  "gradpipe cannot call Python code from a pipeline file")
        return 0.0

    def clipping(self, config: Mapping[str, Any]) -> list[dict[str, Any]]:
        """Keras clips only for a value > 0 (``_clip_gradients``); Keras allows one."""
        norm, global_norm, value = (config.get(k) for k in
                                    ("clipnorm", "global_clipnorm", "clipvalue"))
        if norm and norm > 0:
            return [{"kind": "clip_by_norm", "clip_norm": float(norm)}]
        if global_norm and global_norm > 0:
            return [{"kind": "clip_by_global_norm", "clip_norm": float(global_norm)}]
        if value and value > 0:
            return [{"kind": "clip_by_value", "clip_value_min": -float(value),
                     "clip_value_max": float(value)}]
        return []

    def weight_decay(self, opt: Any, kind: str, config: Mapping[str, Any],
                     rule: dict[str, Any], schedules: dict[str, Any]) -> list[dict[str, Any]]:
        """Keras's ``var -= var * weight_decay * lr`` before the step: the rule's own
        decay where it has one, else gradpipe's ``weight_decay`` after a rule whose
        step does not read the variable. Returns the transforms to append."""
        decay = config.get("weight_decay")
        has_field = kind in ("adamw", "adafactor", "schedule_free_adamw", "muon")
        if has_field:
            rule["weight_decay"] = float(decay or 0.0)
        if not (decay or (kind == "muon" and config.get("adam_weight_decay"))):
            return []
        excluded = self.exclusions(opt, short_names=kind == "muon")
        if has_field:
            if excluded:
                rule["exclude_from_weight_decay"] = excluded
            return []
        if kind not in STEP_IGNORES_VARIABLE:
            self.fail("weight_decay", f"Keras decays the variable before {kind}'s step, "
                      f"which reads the variable ({kind}: its norm or value); gradpipe's "
                      "weight_decay comes after the step and would change it")
            return []
        if not isinstance(rule["learning_rate"], str):
            # one value for the step and the decay; Keras decays with the rate too
            schedules["lr"] = {"kind": "fixed_lr", "learning_rate": rule["learning_rate"]}
            rule["learning_rate"] = "@lr"
        out: dict[str, Any] = {"kind": "weight_decay", "weight_decay": float(decay or 0.0),
                               "learning_rate": "@lr"}
        if excluded:
            out["exclude"] = excluded
        return [out]

    def exclusions(self, opt: Any, short_names: bool) -> list[str]:
        """``exclude_from_weight_decay`` as gradpipe patterns (one, or none)."""
        if getattr(opt, "_exclude_from_weight_decay", None):
            self.fail("exclude_from_weight_decay", "var_list excludes variables by "
                      "identity, which a pipeline file cannot name; pass var_names")
        pattern = getattr(opt, "_exclude_from_weight_decay_pattern", None)
        if pattern is None:
            return []
        names = alternatives(pattern.pattern)
        out, why = (short_name_pattern if short_names else tf_name_pattern)(names)
        if out is None:
            self.fail("exclude_from_weight_decay", why)
            return []
        return [out]


def pipeline_toml(path: str | Path, data: Any = None) -> str:
    """``gradpipe from-keras``: the TOML of the optimizer in ``path`` (``data``: its
    config, where already read)."""
    data = read_optimizer_config(path) if data is None else data
    saved = saved_pipeline_toml(data, path)
    if saved is not None:
        return saved
    import keras

    from .toml_source import dumps

    try:
        optimizer = keras.optimizers.get(data)
    except (ValueError, TypeError) as exc:
        raise GradpipeError(f"{path}: Keras cannot rebuild the optimizer: {exc}") from None
    table = from_keras(optimizer)
    decays = any(t.get("weight_decay") for t in table["transforms"])
    # Keras's config forgets exclude_from_weight_decay(var_names=...): say so where it
    # would have mattered, since the file cannot.
    note = ("# Keras's config does not record exclude_from_weight_decay: where the model\n"
            "# excluded variables, add exclude_from_weight_decay = [PATTERN] to the rule\n"
            "# (or exclude = [PATTERN] to its weight_decay table).\n") if decays else ""
    return (f"# The pipeline of the Keras optimizer in {Path(path).name} "
            f"(gradpipe from-keras).\n{note}{dumps(table)}")
