"""What every page generator does last: write its pages, or with ``--check`` say
which are stale (exit 1) so that a test can keep them current."""

from __future__ import annotations

import sys
from pathlib import Path


def write_or_check(pages: dict[Path, str], script: str) -> int:
    """Write each page's text, or, given ``--check`` on the command line, compare."""
    if "--check" in sys.argv:
        stale = [page for page, text in pages.items()
                 if not page.exists() or page.read_text() != text]
        for page in stale:
            print(f"{page} is stale: run python docs/{script}", file=sys.stderr)
        return 1 if stale else 0
    for page, text in pages.items():
        page.write_text(text)
        print(f"wrote {page}")
    return 0
