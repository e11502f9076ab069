"""One bench's section of a Markdown document: the lines between
`<!-- NAME:begin -->` and `<!-- NAME:end -->`, replaced in place. Every
bench script that writes into docs/benchmarks.md or a README goes through
here (the Node bench, in JavaScript, has its own splice)."""

from __future__ import annotations

from pathlib import Path


def write_section(path: Path, name: str, body: str, heading: str | None = None) -> None:
    """Puts `body` between the document's markers for `name`; a document
    without them gets the section appended under `## heading`, or, with no
    heading, is an error."""
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    doc = path.read_text()
    block = f"{begin}\n{body}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        _, tail = rest.split(end, 1)
        doc = head + block + tail
    elif heading is not None:
        doc = doc.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    else:
        raise SystemExit(f"{path}: no {begin} ... {end} section")
    path.write_text(doc)
