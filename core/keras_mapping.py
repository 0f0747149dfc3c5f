"""What :func:`gradpipe.from_keras` knows about Keras 3: names and variable matching.

Keras's ``exclude_from_weight_decay(var_names=...)`` joins the names with ``|``
into one regular expression (they are regexes, not literal substrings) and
searches it in the variable's name. On the TensorFlow backend that name is the
``tf.Variable``'s: the Keras path plus ``:0`` (``sequential/dense/kernel:0``);
``Muon`` decays in its own ``_apply_weight_decay`` and searches the Keras
variable's short name (``kernel``). gradpipe searches the path without ``:0``
(``sequential/dense/kernel``). :func:`tf_name_pattern` and
:func:`short_name_pattern` turn Keras's pattern into one that selects the same
variables, or say why they cannot.

Pure Python: no TensorFlow, no Keras.
"""

from __future__ import annotations

import importlib
import re
from typing import Any

#: Keras 3 optimizer class -> gradpipe update rule of the same maths and argument names.
RULES = {"SGD": "sgd", "Adam": "adam", "AdamW": "adamw", "Adagrad": "adagrad",
         "RMSprop": "rmsprop", "Ftrl": "ftrl", "Lamb": "lamb", "Adamax": "adamax",
         "Nadam": "nadam", "Lion": "lion", "Adadelta": "adadelta", "Adafactor": "adafactor",
         "Muon": "muon", "ScheduleFreeAdamW": "schedule_free_adamw"}

#: Arguments every Keras 3 optimizer has (``BaseOptimizer.get_config``).
BASE_KEYS = ("name", "learning_rate", "weight_decay", "clipnorm", "global_clipnorm",
             "clipvalue", "use_ema", "ema_momentum", "ema_overwrite_frequency",
             "loss_scale_factor", "gradient_accumulation_steps")

#: Rules whose step never reads the variable: Keras's decay before the step
#: (``var -= var * wd * lr``) equals gradpipe's ``weight_decay`` after it.
STEP_IGNORES_VARIABLE = frozenset({"sgd", "adam", "adagrad", "rmsprop", "adamax", "nadam",
                                   "lion", "adadelta"})

#: Keras ``None`` that means 0 in these rule arguments (TOML has no null).
NONE_IS_ZERO = frozenset({"rms_rate", "adam_weight_decay", "weight_decay"})

_sre: Any = importlib.import_module("re._parser" if hasattr(re, "_parser") else "sre_parse")
_C: Any = importlib.import_module("re._constants" if hasattr(re, "_constants")
                                  else "sre_constants")
_COLON, _ZERO = ord(":"), ord("0")


def alternatives(pattern: str) -> list[str]:
    """``pattern`` split at its top-level ``|`` (Keras's join of ``var_names``)."""
    parts, depth, start, i, in_class = [], 0, 0, 0, False
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]"
        elif c == "[":
            in_class = True
            i += 1 + (pattern[i + 1:i + 2] == "^")
            i += pattern[i:i + 1] == "]"  # a "]" right after "[" or "[^" is literal
            continue
        elif c in "()":
            depth += 1 if c == "(" else -1
        elif c == "|" and depth == 0:
            parts.append(pattern[start:i])
            start = i + 1
        i += 1
    return parts + [pattern[start:]]


def tf_name_pattern(names: list[str]) -> tuple[str | None, str]:
    """One gradpipe pattern that selects what Keras's ``names`` select in TF names
    (``path:0``), or ``None`` and why not."""
    for name in names:
        why = _why_unsafe(name)
        if why:
            return None, f"the pattern {name!r} {why}"
    return "|".join(sorted(set(names))), ""


def short_name_pattern(names: list[str]) -> tuple[str | None, str]:
    """For Muon (Keras's short variable name, the last path component): literal
    names only; a regex could match differently across the path."""
    out = []
    for name in sorted(set(names)):
        if not _is_literal(name) or "/" in name:
            return None, (f"Muon searches {name!r} in the variable's short name (kernel); "
                          "gradpipe matches the whole path, and only a literal name "
                          "without '/' (no regex syntax) translates exactly")
        out.append(re.escape(name) + "[^/]*$")
    return "|".join(out), ""


def _is_literal(name: str) -> bool:
    try:
        return all(op is _C.LITERAL for op, _ in _sre.parse(name))
    except re.error:
        return False


def _why_unsafe(name: str) -> str:
    """Why a search in ``path`` might differ from one in ``path + ':0'`` ("" if not)."""
    try:
        compiled = re.compile(name)
        tree = _sre.parse(name)
    except re.error as exc:
        return f"is not a valid regular expression ({exc})"
    if compiled.flags & ~re.UNICODE:
        return "sets inline flags, which change meaning once Keras joins the names with '|'"
    if not _no_lookahead(list(tree)):
        return ("looks ahead or back-references a group: it could see the ':0' Keras's "
                "TensorFlow names end with, which gradpipe's paths lack")
    if not _ends_before_suffix(list(tree)):
        return ("could match at the end of Keras's TensorFlow name (path:0: ':', '0', '$' "
                "or an empty match), where gradpipe's path ends differently; end it with "
                "a literal character other than ':' and '0' (bias, kernel)")
    return ""


def _children(op: Any, av: Any) -> list[list[Any]]:
    if op is _C.SUBPATTERN:
        return [list(av[3])]
    if op is _C.BRANCH:
        return [list(a) for a in av[1]]
    if op in _REPEATS:
        return [list(av[2])]
    if op is _C.ASSERT or op is _C.ASSERT_NOT:
        return [list(av[1])]
    if op is getattr(_C, "ATOMIC_GROUP", None):
        return [list(av)]
    return []


_REPEATS = tuple(getattr(_C, n) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")
                 if hasattr(_C, n))


def _no_lookahead(seq: list[Any]) -> bool:
    for op, av in seq:
        if op in (_C.GROUPREF, _C.GROUPREF_EXISTS):
            return False
        if op in (_C.ASSERT, _C.ASSERT_NOT) and av[0] >= 0:  # direction 1: ahead
            return False
        if not all(_no_lookahead(child) for child in _children(op, av)):
            return False
    return True


def _may_match(op: Any, av: Any, char: int) -> bool:
    """Whether the one-character item ``(op, av)`` may match ``char`` (conservative)."""
    if op is _C.LITERAL:
        return bool(av == char)
    if op is _C.NOT_LITERAL:
        return bool(av != char)
    if op is _C.IN:
        negate = any(o is _C.NEGATE for o, _ in av)
        if any(o is _C.CATEGORY for o, _ in av):
            return True
        hit = any((o is _C.LITERAL and a == char) or (o is _C.RANGE and a[0] <= char <= a[1])
                  for o, a in av)
        return hit != negate
    return True


def _ends_before_suffix(seq: list[Any]) -> bool:
    """Every match of ``seq`` ends with a character no match reaching into ``:0`` ends
    with: anything but ``:``, or ``0`` after a character that is not ``:``."""
    if not seq:
        return False
    op, av = seq[-1]
    if op in (_C.SUBPATTERN, _C.BRANCH) or op is getattr(_C, "ATOMIC_GROUP", None):
        return all(_ends_before_suffix(child) for child in _children(op, av))
    if op in _REPEATS:
        return av[0] >= 1 and _ends_before_suffix(list(av[2]))
    if op not in (_C.LITERAL, _C.NOT_LITERAL, _C.IN) or _may_match(op, av, _COLON):
        return False
    if not _may_match(op, av, _ZERO):
        return True
    if len(seq) < 2:
        return False
    before, arg = seq[-2]
    return before in (_C.LITERAL, _C.NOT_LITERAL, _C.IN) and not _may_match(before, arg,
                                                                           _COLON)
