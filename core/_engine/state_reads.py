"""What a bound reads of a transform's state each step: its norm, or the range of some leaves.

A bound (:mod:`gradpipe._engine.bounds`) holds each leaf of a transform's state
(a first moment, a running mean of squares) within an interval read at every
step. The norm of the leaves is one pass over each (their sum of squares) and
holds each within plus or minus it; a leaf's range, its least and largest
element, is two passes, and is what keeps the square root of a running mean
of squares from below 0, which the norm cannot. Most rules need the range of
one leaf and the norm of the others: AdaBelief's of its second moment only,
Adan's of its ``n`` only. The build finds the
fewest leaves to read ranges of (``guard.how_bounded``), so a bound costs one
pass fewer for each leaf it leaves to the norm. A norm or sum the maths
computes is held within the bounds of what it reduces, at no pass, unless
the bounds need its value (a trust ratio's divisor): the answer says which.

Leaves are named by their position in one variable's flattened state (what
``init`` gives for one variable alone), which is the same for a probe of two
variables and for a step of fifty. An answer only picks what the guard reads:
each step's bounds are traced from what it read, and fall back to a check, so a
wrong answer can cost speed, never a guarantee.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import tensorflow as tf

from .one_variable import one_variable_structure

#: how a transform's maths is bounded: from its state's norm, or from every leaf's range
BY_NORM, BY_RANGE = "norm", "range"
_SOME = "range:"  # then "position=name,..." of the leaves read for their range
#: before any of those, where the maths computes norms or sums (scalars of tensors,
#: ``scalar_values.own_values``): the bound takes them at their values, computed again,
#: or within the bounds of what they reduce
NORMS_AT_VALUES, NORMS_WITHIN = "values+", "within+"

#: after any of those, where the maths reads a variable's value (decoupled weight
#: decay, an average of the weights): the bound reads the weights' norm
WEIGHTS = "+weights"

#: the leaves held within their range: none (False), every one (True), or those positions
Ranged = bool | frozenset[int]


def _state(answer: str) -> str:
    """What ``answer`` reads of the state."""
    return answer.removesuffix(WEIGHTS).removeprefix(NORMS_AT_VALUES).removeprefix(
        NORMS_WITHIN)


def is_bounded(answer: str) -> bool:
    """Whether ``how_bounded``'s ``answer`` bounds the maths (else it says why not)."""
    answer = _state(answer)
    return answer in (BY_NORM, BY_RANGE) or answer.startswith(_SOME)


def takes_values(answer: str) -> bool:
    """Whether a bounded ``answer`` takes the norms and sums its maths computes at
    their values, not within their intervals."""
    return answer.startswith(NORMS_AT_VALUES)


def some_ranged(names: dict[int, str]) -> str:
    """The answer that reads the range of the leaves ``names`` (position -> name) alone."""
    return _SOME + ",".join(f"{k}={name}" for k, name in sorted(names.items()))


def _named(answer: str) -> dict[int, str]:
    """``some_ranged``'s leaves; a part that is not ``position=name`` (an answer file
    edited by hand) is left out: that leaf is then read for its norm, which costs a
    bound that may fail, never a guarantee."""
    named = {}
    for part in answer[len(_SOME):].split(","):
        position, _, name = part.partition("=")
        if position.isdigit():
            named[int(position)] = name
    return named


def ranged_leaves(answer: str) -> Ranged:
    """The leaves a bounded ``answer`` reads the range of."""
    answer = _state(answer)
    return answer == BY_RANGE or (answer.startswith(_SOME) and frozenset(_named(answer)))


def reads_range(ranged: Ranged, leaf: int) -> bool:
    """Whether state leaf ``leaf`` (its position in one variable's state) is ranged."""
    return ranged if isinstance(ranged, bool) else leaf in ranged


def read_text(answer: str, given: str = "") -> str:
    """What the plan says a bound reads, for ``answer``; ``given``: the transform before
    it, where that one bounds its updates (its input's bound is then known)."""
    reads = _state(answer)
    names = sorted(_named(reads).values()) if reads.startswith(_SOME) else []
    inputs = f"its input's bound (from {given})" if given else "its input's norm"
    if reads == BY_RANGE:
        parts = [inputs, "its state's range"]
    elif names:
        listed = ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]
        parts = [inputs, f"the range of its {listed}", "the norm of the rest of its state"]
    else:
        parts = [inputs, "its state's norm"]
    if answer.endswith(WEIGHTS):
        parts.append("the weights' norm")
    if takes_values(answer):
        parts.append("the norms and sums it computes, computed again")
    text = ", ".join(parts[:-1]) + " and " + parts[-1]
    if answer.startswith(NORMS_WITHIN):
        text += ", which also bound the norms and sums it computes"
    return text


def leaf_positions(state: Any, count: int) -> dict[int, int]:
    """``id`` of each leaf of ``state`` (a transform's state for ``count`` variables) ->
    its position in one variable's flattened state."""
    return {id(t): k for j in range(count)
            for k, t in enumerate(tf.nest.flatten(one_variable_structure(state, count, j)))}


def leaf_names(state: Any, count: int) -> list[str]:
    """A name for each position of one variable's flattened state: its path (``nu``,
    ``moments/1``), else ``leaf K`` where the structure is not one this names."""
    single = one_variable_structure(state, count, 0)
    # one variable's entry of a list of one per variable is its entry 0: no name
    names = [name.removesuffix("/0") for name in _paths(single, "")]
    # "," and "=" separate an answer's leaves (``some_ranged``)
    names = ["state" if name in ("", "0") else name.replace(",", ";").replace("=", ":")
             for name in names]
    if len(names) != len(tf.nest.flatten(single)):
        return [f"leaf {k}" for k in range(len(tf.nest.flatten(single)))]
    return names


def _paths(structure: Any, prefix: str) -> Iterator[str]:
    """Paths of ``structure``'s leaves, in ``tf.nest.flatten``'s order."""
    if isinstance(structure, dict):
        items = [(str(k), structure[k]) for k in sorted(structure)]
    elif isinstance(structure, tuple) and hasattr(structure, "_fields"):
        items = list(zip(structure._fields, structure))
    elif isinstance(structure, (list, tuple)):
        items = [(str(i), v) for i, v in enumerate(structure)]
    else:
        yield prefix.rstrip("/")
        return
    for name, value in items:
        yield from _paths(value, f"{prefix}{name}/")
