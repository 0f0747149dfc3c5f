"""Field validators whose messages a user can act on, and that say what they accept.

A config class passes them to ``hyperparameter()`` or ``attrs.field()``
(``validator=in_range(0.0, 1.0, high_open=True)``). Each raises ``must be ...,
got ...``, which gradpipe reports under the key's path, and carries its valid
range in words (``describe``), which ``gradpipe describe`` prints.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

from .hints import did_you_mean


class Check:
    """A field validator that can say what it accepts.

    ``describe`` is the valid range in words (``"[0, 1)"``, ``"> 0"``), printed by
    ``gradpipe describe`` and read by :mod:`gradpipe.describe`; ``wraps`` is the
    validator it delegates to, if any. A plugin's own validator function may carry a
    ``describe`` string attribute the same way.
    """

    __slots__ = ("_check", "describe", "wraps")

    def __init__(self, check: Callable[[Any, Any, Any], None], describe: str | None,
                 *, wraps: Any = None) -> None:
        self._check = check
        self.describe = describe
        self.wraps = wraps

    def __call__(self, inst: Any, attribute: Any, value: Any) -> None:
        self._check(inst, attribute, value)

    def __repr__(self) -> str:
        return f"<gradpipe check {self.describe or self.wraps!r}>"


def _num(value: float) -> str:
    """A bound as a reader writes it: ``0`` and ``1``, not ``0.0`` and ``1.0``."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return str(value)


def _number_check(ok: Callable[[float], bool], text: str,
                  describe: str) -> Callable[..., None]:
    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value is not None and not ok(value):
            raise ValueError(f"must be {text}, got {value!r}")

    return Check(check, describe)


def positive() -> Callable[..., None]:
    """A validator: the value must be > 0 (``must be > 0, got -1.0``). Like every
    validator here it lets ``None`` (an optional key left out) pass."""
    return _number_check(lambda v: v > 0, "> 0", "> 0")


def non_negative() -> Callable[..., None]:
    """A validator: the value must be >= 0."""
    return _number_check(lambda v: v >= 0, ">= 0", ">= 0")


def at_least(low: float) -> Callable[..., None]:
    """A validator: the value must be >= ``low`` (``at_least(1)`` for a count)."""
    return _number_check(lambda v: v >= low, f">= {low}", f">= {_num(low)}")


def greater_than(low: float) -> Callable[..., None]:
    """A validator: the value must be > ``low``."""
    return _number_check(lambda v: v > low, f"> {low}", f"> {_num(low)}")


def in_range(
    low: float, high: float, *, low_open: bool = False, high_open: bool = False
) -> Callable[..., None]:
    """A validator: the value must lie between ``low`` and ``high``, both included
    unless opened: a decay that must stay below 1 is ``in_range(0.0, 1.0,
    high_open=True)``, read ``[0, 1)``."""
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"

    def ok(v: float) -> bool:
        above = v > low if low_open else v >= low
        below = v < high if high_open else v <= high
        return above and below

    return _number_check(ok, f"in {lo}{low}, {high}{hi}",
                         f"{lo}{_num(low)}, {_num(high)}{hi}")


def one_of(*choices: str) -> Callable[..., None]:
    """A validator: the value must be one of ``choices``; a near miss gets a
    did-you-mean (``must be one of 'mean', 'sum', got 'maen' (did you mean
    'mean'?)``). A ``Literal[...]`` annotation does the same for a fixed set."""
    def check(inst: Any, attribute: Any, value: Any) -> None:
        if value not in choices:
            raise ValueError(
                f"must be one of {', '.join(map(repr, choices))}, got {value!r}"
                + did_you_mean(str(value), choices)
            )

    return Check(check, f"one of {', '.join(map(repr, choices))}")


def increasing() -> Callable[..., None]:
    """A validator: a sequence of numbers, each larger than the one before (the
    boundaries of a piecewise schedule)."""
    def check(inst: Any, attribute: Any, value: Sequence[float]) -> None:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"must be strictly increasing, got {list(value)!r}")

    return Check(check, "strictly increasing")
