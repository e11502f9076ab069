#!/usr/bin/env python3
"""Fails when a line of prose in the given Markdown files runs past a
limit (200 characters by default), so that a document reads in a
terminal and in a diff. Tables (lines starting with `|`) and fenced code
blocks are left alone: a row or a command is one line by nature.

    python3 scripts/check-prose.py [--max N] FILE...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def long_lines(text: str, limit: int) -> list[tuple[int, int]]:
    """(line number, length) of every prose line over `limit`."""
    found = []
    fence = ""
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = ""
            continue
        if stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
            continue
        if stripped.startswith("|"):
            continue
        if len(line) > limit:
            found.append((number, len(line)))
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max", type=int, default=200, help="longest prose line allowed")
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args()
    bad = 0
    for path in args.files:
        for number, length in long_lines(path.read_text(encoding="utf-8"), args.max):
            print(f"{path}:{number}: {length} characters of prose (at most {args.max})")
            bad += 1
    if bad:
        print(f"{bad} line(s) too long: wrap the prose (tables and code blocks are exempt)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
