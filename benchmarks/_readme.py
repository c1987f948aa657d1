"""Writing a benchmark's figures into ``benchmarks/README.md``: its ``## Title`` section
replaced (appended when missing), every other section kept as it is."""

from __future__ import annotations

from pathlib import Path


def replace_section(path: Path, section: str) -> None:
    """Put ``section`` (which starts with its ``## Title`` line) in place of the section
    of that title in ``path``."""
    title = section.split("\n", 1)[0] + "\n"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(title)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("" if end < 0 else text[end:])
    path.write_text(text)
