"""The error hierarchy of gradpipe.

Every error that gradpipe raises on bad input derives from :class:`GradpipeError`,
so a caller can catch one class and never sees a raw TensorFlow or pluggy
traceback for a mistake in a pipeline file or a plugin.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs


class GradpipeError(Exception):
    """Base class of every error gradpipe raises on bad input."""


@attrs.frozen(kw_only=True)
class Problem:
    """One thing wrong with a pipeline file.

    Attributes:
        path: key path inside the file, such as ``transforms[1].clip_norm``.
        message: what is wrong, in words a user can act on.
        file: the file name, or ``None`` for an in-memory mapping.
        line: 1-based line of the offending key, where it is known.
    """

    path: str
    message: str
    file: str | None = None
    line: int | None = None

    def __str__(self) -> str:
        where = self.file or ("<pipeline>" if self.path else "")
        if self.line is not None:
            where = f"{where}:{self.line}"
        text = f"{self.path}: {self.message}" if self.path else self.message
        # A problem of no file and no key (the command's, not a table's) is its message.
        return f"{where}: {text}" if where else text


class ConfigError(GradpipeError):
    """A pipeline file or mapping is invalid.

    It carries every problem found, not only the first one; ``str()`` lists
    them one per line as ``file:line: key.path: message``.
    """

    def __init__(self, problems: Sequence[Problem] | str) -> None:
        if isinstance(problems, str):
            problems = [Problem(path="", message=problems)]
        self.problems: tuple[Problem, ...] = tuple(problems)
        super().__init__("\n".join(str(p) for p in self.problems))

    @property
    def file(self) -> str | None:
        return self.problems[0].file if self.problems else None

    @property
    def path(self) -> str:
        return self.problems[0].path if self.problems else ""

    @property
    def line(self) -> int | None:
        return self.problems[0].line if self.problems else None

    def as_dicts(self) -> list[dict[str, object]]:
        return [attrs.asdict(p) for p in self.problems]


class PluginError(GradpipeError):
    """A plugin failed to load, conflicts with another, or breaks a contract.

    The message names the distribution and the entry point involved.
    """


class PlacementError(GradpipeError):
    """A device placement is invalid or cannot be set up on this machine."""
