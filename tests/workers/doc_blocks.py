"""Run every ```python block of the given Markdown pages, as a reader would.

Usage: python doc_blocks.py OUT.json PAGE.md... (run it in a scratch folder
that holds what the pages name: ``examples/`` and a ``pipe.toml``). The blocks of one
page run in order, in one namespace of their own, so a later block may use
what an earlier one made. A block of ``>>>`` lines is a doctest: its output
must match too (whitespace-insensitive). A block right after a
``<!-- no-run -->`` line is a fragment on purpose and is skipped.

Writes one JSON object to OUT.json (the blocks print to stdout): page -> null
where every block ran, else the line of the block that failed and the end of
its traceback.
"""

from __future__ import annotations

import doctest
import json
import os
import re
import sys
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
NO_RUN = "<!-- no-run -->"


def blocks(text: str) -> list[tuple[int, str]]:
    """(line, code) of each python block of a page that is meant to run."""
    found = []
    for match in BLOCK.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        if before.strip() != NO_RUN:
            found.append((text.count("\n", 0, match.start()) + 2, match.group(1)))
    return found


def run_block(code: str, name: str, namespace: dict) -> None:
    if code.lstrip().startswith(">>>"):
        test = doctest.DocTestParser().get_doctest(code, namespace, name, name, 0)
        out: list[str] = []
        runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
        runner.run(test, out=out.append, clear_globs=False)
        if runner.failures:
            raise AssertionError("".join(out))
    else:
        exec(compile(code, name, "exec"), namespace)


def run_page(path: str) -> str | None:
    with open(path, encoding="utf-8") as f:
        text = f.read()
    namespace: dict = {"__name__": "__doc_page__"}
    for line, code in blocks(text):
        try:
            run_block(code, f"{path}:{line}", namespace)
        except Exception as exc:  # reported, and the next page still runs
            tb = exc.__traceback__
            while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
                tb = tb.tb_next  # the page's own frames, not this runner's
            lines = traceback.format_exception(type(exc), exc, tb)
            return f"{path}:{line}: " + "".join(lines[-12:])
    return None


def main() -> None:
    results = {page: run_page(page) for page in sys.argv[2:]}
    with open(sys.argv[1], "w", encoding="utf-8") as out:
        json.dump(results, out)


if __name__ == "__main__":
    main()
