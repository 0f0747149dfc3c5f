"""The pipeline's learning rate as Keras users read and set it.

Keras keeps a constant learning rate in a variable, so ``ReduceLROnPlateau``
and ``LearningRateScheduler`` can set it between steps without a retrace
(``optimizer.learning_rate = x``). A pipeline does the same where its update
rules share one constant ``learning_rate``: the rate lives in the state
variable ``learning_rate``, saved with checkpoints and ``.keras`` files, and
every such rule reads it. A scheduled rate cannot be set, as Keras refuses to
set one that follows a ``LearningRateSchedule``.

A new value is validated as the file's value was, by each rule's config
(``learning_rate = -1`` fails as it would in TOML), and must keep what the
engine proved when the step was built (:mod:`gradpipe._engine.proofs`): the
step relies on it to skip the check of the updates. Every way to set the
rate goes through :meth:`LearningRate.set`; the variable is never handed out.
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from ..errors import GradpipeError
from ..fields import is_constant
from ..spec import ComponentSpec, PipelineSpec
from ..transform import SettableRate, hyper
from .proof_table import provable


def _rules(spec: PipelineSpec) -> list[ComponentSpec]:
    return [t for t in spec.transforms
            if t.capabilities.update_rule and hasattr(t.config, "learning_rate")]


def _shared_constant(rules: list[ComponentSpec]) -> tuple[float | None, str]:
    """The rate every rule has, or ``None`` and why the rate cannot be set."""
    if not rules:
        return None, "no update rule of this pipeline has a learning_rate"
    for t in rules:
        if not is_constant(t.config.learning_rate):
            return None, (f"{t.path}.learning_rate follows a schedule; a scheduled rate "
                          "cannot be set (Keras refuses too, for a LearningRateSchedule): "
                          "change the schedule in the pipeline file")
    values = {float(t.config.learning_rate) for t in rules}
    if len(values) > 1:
        rates = ", ".join(f"{t.path}.learning_rate = {t.config.learning_rate}" for t in rules)
        return None, (f"its update rules have different learning rates ({rates}), so "
                      "which one to set is ambiguous")
    return values.pop(), ""


class LearningRate:
    """The settable rate of a pipeline (``variable``), or why it is not settable."""

    def __init__(self, spec: PipelineSpec) -> None:
        self._rules = _rules(spec)
        self.initial, self.reason = _shared_constant(self._rules)
        self.variable: Any = None
        self._reads: Any = weakref.WeakKeyDictionary()  # graph -> the rate's read in it

    def for_build(self, t: ComponentSpec) -> tuple[ComponentSpec, SettableRate | None]:
        """The spec to build ``t`` from: a rule's number becomes one that reads the
        variable (made by ``create_variable``) when ``hyper()`` turns it into a callable."""
        if self.initial is None or t not in self._rules:
            return t, None
        rate = SettableRate(t.config.learning_rate, self._read)
        return attrs.evolve(t, config=attrs.evolve(t.config, learning_rate=rate)), rate

    def _read(self) -> Any:
        """The rate, read once per traced graph: every variable's maths then takes the
        same tensor, which the bounds analysis meets once, not once per variable (the
        rate is set between steps, never during one)."""
        import tensorflow as tf

        replicas = tf.distribute.get_replica_context()
        if tf.executing_eagerly() or (replicas is not None and replicas.num_replicas_in_sync > 1):
            return self.variable.read_value()  # each replica reads its own copy
        graph = tf.compat.v1.get_default_graph()
        if graph not in self._reads:
            with tf.control_dependencies(None):  # usable anywhere in the graph
                self._reads[graph] = self.variable.read_value()
        return self._reads[graph]

    def readers(self, built: list[tuple[ComponentSpec, SettableRate | None]]
                ) -> dict[str, Any]:
        """Each rule's rate as a callable, by path (call in the build scope): a
        settable rate reads the variable, a schedule follows the step."""
        rules = {t.path for t in self._rules}
        return {t.path: hyper(t.config.learning_rate) for t, _ in built if t.path in rules}

    def create_variable(self, built: list[tuple[ComponentSpec, SettableRate | None]]) -> Any:
        """Create the variable once the rules are built (call it in the strategy's
        scope); ``None`` where the rate cannot be set. A rule that never passed its
        rate to ``hyper()`` uses it as a fixed number, which setting would not reach."""
        import tensorflow as tf

        fixed = [t for t, rate in built if rate is not None and not rate.read_by_hyper]
        if fixed:
            self.initial = None
            self.reason = (f"{fixed[0].name} at {fixed[0].path} uses its learning_rate as a "
                           "fixed number (it never passes it to gradpipe.hyper())")
        if self.initial is not None:
            self.variable = tf.Variable(self.initial, dtype=tf.float32, trainable=False,
                                        name="learning_rate")
        return self.variable

    def set(self, value: Any) -> None:
        """Set the rate from the next step on; a clear error where it cannot be."""
        if self.variable is None:
            raise GradpipeError(f"this pipeline's learning rate cannot be set: {self.reason}")
        if callable(value) or isinstance(value, (bool, str)):
            raise GradpipeError(
                f"the learning rate must be set to a number, got {type(value).__name__}; "
                "a schedule belongs in the pipeline file")
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise GradpipeError(f"the learning rate must be set to a number, got "
                                f"{value!r}") from None
        if not math.isfinite(number):
            raise GradpipeError(f"the learning rate must be finite, got {number}")
        for t in self._rules:
            try:
                changed = attrs.evolve(t.config, learning_rate=number)
            except (ValueError, TypeError) as exc:
                raise GradpipeError(f"{t.path}.learning_rate = {number} is not valid for "
                                    f"{t.name}: {exc}") from None
            if provable(t) and not provable(t, changed):
                raise GradpipeError(
                    f"{t.path}.learning_rate = {number} is beyond the bound under which "
                    f"gradpipe proves {t.name}'s updates finite, which this pipeline's step "
                    "was built on; build a pipeline with that rate in its file instead")
        self.variable.assign(number)

    def current(self, readers: dict[str, Any]) -> Mapping[str, Any]:
        """Each rule's rate now, by path, read-only: setting an item would change no
        rule, so it is an error that says how to set the rate."""
        return CurrentRates({path: rate() for path, rate in readers.items()},
                            self.reason if self.variable is None else "")


class CurrentRates(Mapping[str, Any]):
    """``pipe.learning_rates``: read off the update rules; setting an item is an error."""

    def __init__(self, rates: dict[str, Any], why_not: str) -> None:
        self._rates, self._why_not = rates, why_not

    def __getitem__(self, path: str) -> Any:
        return self._rates[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rates)

    def __len__(self) -> int:
        return len(self._rates)

    def __repr__(self) -> str:
        return repr(self._rates)

    def __setitem__(self, path: str, value: Any) -> None:
        how = (f"this pipeline's rate cannot be set: {self._why_not}" if self._why_not
               else "set it with pipe.learning_rate = x")
        raise GradpipeError(f"pipe.learning_rates is read off the update rules, and setting "
                            f"{path!r} would change none of them; {how}")
