"""One bench's section of a Markdown document: the lines between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`, replaced in place. Every
bench script that writes into docs/benchmarks.md or a README goes through
here (the Node bench, in JavaScript, has its own splice)."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

# Prose is wrapped at this width, so that a document reads in a terminal
# and a diff (`make lint` refuses prose lines over 200 characters).
WIDTH = 100
_ITEM = re.compile(r"(\s*(?:[-*+]|\d+[.)])\s+)")


def wrap_prose(text: str, width: int = WIDTH, longer_than: int | None = None) -> str:
    """`text` with each prose line longer than `longer_than` (default:
    `width`) wrapped at `width`; tables,
    code blocks, headings and HTML comments are left as they are, and a
    list item's continuation lines are indented under its text."""
    out: list[str] = []
    fence = False
    for line in text.split("\n"):
        stripped = line.lstrip()
        if stripped.startswith(("```", "~~~")):
            fence = not fence
        if fence or len(line) <= (longer_than or width) or stripped.startswith(("```", "~~~", "|", "#", "<!--", ">")):
            out.append(line)
            continue
        item = _ITEM.match(line)
        first = item.group(1) if item else line[: len(line) - len(stripped)]
        rest = " " * len(first)
        body = line[len(first) :]
        out.extend(
            textwrap.wrap(
                body,
                width,
                initial_indent=first,
                subsequent_indent=rest,
                break_long_words=False,
                break_on_hyphens=False,
            )
        )
    return "\n".join(out)


def write_section(path: Path, name: str, body: str, heading: str | None = None) -> None:
    """Puts `body` between the document's markers for `name`; a document
    without them gets the section appended under `## heading`, or, with no
    heading, is an error."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = path.read_text()
    block = f"{begin}\n{wrap_prose(body)}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        doc = head + block + tail
    elif heading is not None:
        doc = doc.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    else:
        raise SystemExit(f"{path}: no {begin} ... {end} section")
    path.write_text(doc)
