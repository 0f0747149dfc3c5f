"""What a transform says about itself: the few things the engine cannot find out.

Given once, at registration::

    register("clip_by_norm", clip_by_norm, ClipByNormConfig,
             capabilities=Capabilities(gradient_clipping=True))

Everything else about how a step runs (whether XLA compiles it, how its
outputs are proved or checked finite, whether its state may be kept packed
in one vector) the engine works out by itself and shows in ``pipe.plan``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from .fields import config_class_problems
from .hints import did_you_mean

#: Class attributes earlier versions read from config classes.
RETIRED = ("update_rule", "after_update_rule", "gradient_clipping", "conflicts",
           "elementwise", "xla_compatible", "preserves_finite", "predicated")


def _bool(inst: Any, attribute: Any, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"capability {attribute.name} must be True or False, got {value!r}")


def _conflicts(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise TypeError("capability conflicts must map component names to reasons "
                        f"(str -> str), got {value!r}")
    return dict(value)


@attrs.frozen(kw_only=True, init=False)
class Capabilities:
    """A transform's capabilities; every field defaults to off.

    Attributes:
        update_rule: its output is the step (``sgd``, ``adam``); a trainable
            variable that no update rule selects is an error, and so is a chain
            with none.
        after_update_rule: it must follow an update rule (decoupled weight decay).
        before_update_rule: it changes the gradient an update rule reads, so one
            must follow it (an L2 term, LARC's trust ratio): after the last rule it
            would change the step instead.
        gradient_clipping: ``clip_before_reduce`` may run it on each replica's
            gradients before the reduction.
        conflicts: names of transforms it cannot share a pipeline with, each
            with the reason (``larc`` and ``clip_by_global_norm``).
    """

    update_rule: bool = attrs.field(default=False, validator=_bool)
    after_update_rule: bool = attrs.field(default=False, validator=_bool)
    before_update_rule: bool = attrs.field(default=False, validator=_bool)
    gradient_clipping: bool = attrs.field(default=False, validator=_bool)
    conflicts: dict[str, str] = attrs.field(factory=dict, converter=_conflicts)

    def __init__(self, **capabilities: Any) -> None:
        # attrs' own __init__ would say only "unexpected keyword argument"; name the
        # capabilities there are, with a suggestion, for a misspelt one.
        names = [f.name for f in attrs.fields(type(self))]
        unknown = sorted(set(capabilities) - set(names))
        if unknown:
            raise TypeError(f"unknown capability {unknown[0]!r}"
                            f"{did_you_mean(unknown[0], names)}; capabilities are "
                            f"{', '.join(names)}")
        self.__attrs_init__(**capabilities)

    @classmethod
    def coerce(cls, value: Any) -> Capabilities:
        """``value`` as Capabilities: an instance, a mapping of its fields, or None."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, Mapping):
            return cls(**value)
        raise TypeError(f"capabilities must be gradpipe.plugin.Capabilities(...), got "
                        f"{type(value).__name__}")

    def describe(self) -> list[str]:
        """The capabilities that are on, in words (for listings)."""
        on = [f.name for f in attrs.fields(type(self))
              if f.name != "conflicts" and getattr(self, f.name)]
        return on + [f"conflicts with {name}" for name in self.conflicts]


def check_registration(kind: str, name: Any, factory: Any, config_cls: Any,
                       capabilities: Any, kernel: Any) -> Capabilities:
    """Validate one ``register(...)`` call; its capabilities, coerced. A ``TypeError``
    names what is wrong (the registry fails the plugin with it)."""
    if not isinstance(name, str) or not name.isidentifier():
        raise TypeError(f"component name must be an identifier, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory for {kind} {name!r} is not callable")
    if not attrs.has(config_cls):
        raise TypeError(
            f"config class for {kind} {name!r} must be an attrs class, "
            f"got {config_cls!r}"
        )
    retired = [a for a in RETIRED if a in vars(config_cls)]
    if retired:
        raise TypeError(
            f"the config class of {kind} {name!r} declares {', '.join(retired)}: "
            "capabilities are given at registration, register(name, factory, "
            "Config, capabilities=Capabilities(...)), and elementwise, "
            "xla_compatible, preserves_finite and predicated are no longer "
            "declared: the engine finds them out")
    problems = config_class_problems(config_cls)
    if problems:
        raise TypeError(f"config class {config_cls.__name__} of {kind} {name!r}: "
                        + "; ".join(problems))
    declared = Capabilities.coerce(capabilities)
    if kind != "transform" and (declared != Capabilities() or kernel is not None):
        raise TypeError(f"capabilities and kernels are declared for transforms, "
                        f"not for a {kind} ({name!r})")
    if kernel is not None and not callable(kernel):
        raise TypeError(f"kernel for {kind} {name!r} is not callable")
    return declared
