"""Validated, immutable descriptions of a pipeline (what a TOML file says).

A :class:`PipelineSpec` is the output of validation and the input of
building. It holds no TensorFlow objects, so ``gradpipe check`` can produce and
print it without importing TensorFlow, and :meth:`PipelineSpec.to_mapping`
writes it back as a TOML-shaped dict with every default filled in.
"""

from __future__ import annotations

from typing import Any, Literal

import attrs

from .capabilities import Capabilities
from .errors import Problem
from .fields import (
    HYPER,
    SCHEDULE,
    ScheduleRef,
    at_least,
    in_range,
    variable_patterns,
)
from .hints import did_you_mean
from .toml_source import dumps, line_for

SCHEMA_VERSION = 1

#: What ``[pipeline] summaries`` may name.
SUMMARIES = ("learning_rate", "hyperparameters", "loss_scale", "skipped_steps",
             "global_gradient_norm", "clipping_factors", "update_ratios")


@attrs.frozen(kw_only=True)
class ComponentSpec:
    """One component: its kind, registered name and validated config.

    Attributes:
        kind: ``transform``, ``loss_scale``, ``schedule``, ``convergence``,
            ``placement`` or ``problem``.
        name: the registered name, as written after ``kind =`` in TOML.
        config: an instance of the component's attrs config class.
        path: key path in the file, e.g. ``transforms[0]``.
        dist: distribution that provides the component.
        version: version of that distribution.
        extra: engine-level keys of the table (e.g. ``variables``).
        qualified: the file named it ``dist>name``; written back that way.
        capabilities: what its plugin declared at registration.
    """

    kind: str
    name: str
    config: Any
    path: str = ""
    dist: str = ""
    version: str = ""
    extra: dict[str, Any] = attrs.field(factory=dict)
    qualified: bool = False
    #: what the component's plugin declared at registration (not written to TOML)
    capabilities: Capabilities = attrs.field(factory=Capabilities, eq=False, repr=False)

    def to_mapping(self) -> dict[str, Any]:
        table: dict[str, Any] = {"kind": f"{self.dist}>{self.name}" if self.qualified
                                 else self.name}
        for field in attrs.fields(type(self.config)):
            value = getattr(self.config, field.name)
            if value is None:
                continue  # TOML has no null: an omitted key means "default"
            table[field.name] = _value_to_toml(value)
        table.update({k: _value_to_toml(v) for k, v in self.extra.items()})
        return table

    def schedules_used(self) -> list[ScheduleRef | ComponentSpec]:
        """Schedules this component's fields use, by reference or inline."""
        used = []
        for field in attrs.fields(type(self.config)):
            if field.metadata.get(HYPER) or field.metadata.get(SCHEDULE):
                value = getattr(self.config, field.name)
                for item in value if isinstance(value, tuple) else (value,):
                    if isinstance(item, (ScheduleRef, ComponentSpec)):
                        used.append(item)
        return used


def _value_to_toml(value: Any) -> Any:
    if isinstance(value, ScheduleRef):
        return str(value)
    if isinstance(value, ComponentSpec):
        return value.to_mapping()
    if isinstance(value, tuple):
        return [_value_to_toml(v) for v in value]
    return value


@attrs.frozen(kw_only=True)
class PipelineOptions:
    """The ``[pipeline]`` table: options of the whole pipeline.

    Attributes:
        accumulation_steps: micro-batches per applied update (OpenSeq2Seq
            ``iter_size``); the chain runs once every ``k`` calls on the mean.
        freeze: regular expressions; matching variables are never updated. A
            trainable variable that no update rule selects must be listed here.
        jit_compile: compile the whole update (unscale, check, chain, assign) with
            XLA as one function, on one device; summaries are not written then.
            ``"auto"`` (default) compiles where it is safe and pays: one device,
            dense gradients, a step that XLA compiles when the pipeline is built
            (``pipe.plan`` gives the reason where it does not), no summary writer,
            at most 128 variables of at least 4,096 elements on average (16,384
            where the last rule updates in place without XLA, as ``sgd`` does),
            and on a CPU at least 262,144 elements per distinct shape (each
            shape is compiled before the first step).
        pack_variables: keep the state of all variables packed in one vector and run
            the chain once on the packed gradients (multi-tensor apply), then
            subtract each variable's slice: a few ops per variable instead of some
            twenty. Allowed where every transform is elementwise (the engine
            runs each packed and variable by variable on the same numbers first),
            on one device, with float32 variables, no ``freeze``, ``variables``/``exclude``
            selection or accumulation. ``"auto"`` (default) packs there when there
            are at least 16 variables and ``jit_compile = "auto"`` would not
            compile them one by one (more than 128, or small ones); ``true``
            requires it (an error names what prevents it). Checkpoints are the same
            either way.
        check_updates: also skip a step whose *updates* or new state are
            non-finite although its gradients were finite (NaN born inside the
            chain). Each transform's outputs are checked by one sum, fused with
            the update where compiled; gradpipe's own ``clip_by_global_norm``,
            ``sgd`` and ``adam`` are proved finite from a few scalars instead.
            Turning it off removes the check (``pipe.plan`` shows each).
        summaries: TensorBoard scalars written while a default ``tf.summary``
            writer is set (OpenSeq2Seq's default: learning rate, global gradient
            norm, loss scale); see ``SUMMARIES``.
    """

    accumulation_steps: int = attrs.field(default=1, validator=in_range(1, 1_000_000))
    freeze: tuple[str, ...] = variable_patterns()
    jit_compile: bool | Literal["auto"] = "auto"
    pack_variables: bool | Literal["auto"] = "auto"
    check_updates: bool = True
    summaries: tuple[str, ...] = attrs.field(default=("learning_rate", "global_gradient_norm",
                                                      "loss_scale"))

    @summaries.validator
    def _summaries(self, attribute: Any, value: tuple[str, ...]) -> None:
        # every unknown name at once, not the first alone
        wrong = [f"{name!r}{did_you_mean(name, SUMMARIES)}" for name in value
                 if name not in SUMMARIES]
        if wrong:
            raise ValueError(f"must name summaries among {', '.join(map(repr, SUMMARIES))}; "
                             f"unknown: {', '.join(wrong)}")


@attrs.frozen(kw_only=True)
class GradpipeSection:
    """The ``[gradpipe]`` table."""

    version: int = attrs.field(default=SCHEMA_VERSION, validator=at_least(1))
    require: tuple[str, ...] = ()

    def __attrs_post_init__(self) -> None:
        from .fields import FieldError

        if self.version != SCHEMA_VERSION:
            raise FieldError(
                "version",
                f"this gradpipe reads schema version {SCHEMA_VERSION}, got {self.version}",
            )


@attrs.frozen(kw_only=True)
class PipelineSpec:
    """A whole validated pipeline file."""

    gradpipe: GradpipeSection = attrs.field(factory=GradpipeSection)
    placement: ComponentSpec | None = None
    loss_scale: ComponentSpec | None = None
    schedules: dict[str, ComponentSpec] = attrs.field(factory=dict)
    options: PipelineOptions = attrs.field(factory=PipelineOptions)
    transforms: tuple[ComponentSpec, ...] = ()
    convergence: tuple[ComponentSpec, ...] = ()
    problem: ComponentSpec | None = None
    source: str | None = attrs.field(default=None, eq=False)
    lines: dict[str, int] = attrs.field(factory=dict, eq=False, repr=False)

    def problem_at(self, path: str, message: str) -> Problem:
        """A Problem at ``path`` with this file's name and the key's line."""
        return Problem(path=path, message=message, file=self.source,
                       line=line_for(self.lines, path))

    def to_mapping(self) -> dict[str, Any]:
        """The resolved pipeline as a TOML-shaped dict, defaults filled in."""
        out: dict[str, Any] = {
            "gradpipe": {"version": self.gradpipe.version,
                         "require": list(self.gradpipe.require)},
        }
        if not self.gradpipe.require:
            del out["gradpipe"]["require"]
        if self.placement is not None:
            out["placement"] = self.placement.to_mapping()
        if self.loss_scale is not None:
            out["loss_scale"] = self.loss_scale.to_mapping()
        if self.schedules:
            out["schedules"] = {k: v.to_mapping() for k, v in self.schedules.items()}
        out["pipeline"] = attrs.asdict(self.options)
        if self.problem is not None:
            out["problem"] = self.problem.to_mapping()
        out["transforms"] = [t.to_mapping() for t in self.transforms]
        if self.convergence:
            out["convergence"] = [c.to_mapping() for c in self.convergence]
        lock = self.lock()
        if lock:
            out["lock"] = lock
        return out

    def components(self) -> list[ComponentSpec]:
        """Every component spec of the file, inline schedules included."""
        top = [self.placement, self.loss_scale, self.problem, *self.schedules.values(),
               *self.transforms, *self.convergence]
        found: list[ComponentSpec] = []
        stack = [c for c in top if c is not None]
        while stack:
            comp = stack.pop()
            found.append(comp)
            stack.extend(s for s in comp.schedules_used() if isinstance(s, ComponentSpec))
        return found

    def lock(self) -> dict[str, str]:
        """Distribution -> version of every plugin the pipeline uses."""
        return {c.dist: c.version for c in sorted(self.components(), key=lambda c: c.dist)
                if c.dist}

    def to_toml(self) -> str:
        return dumps(self.to_mapping())
