"""Writing a benchmark's figures into ``benchmarks/README.md``: its ``## Title`` section
replaced (appended when missing), every other section kept as it is.

A section's notes, from its line ``Reading these figures:`` on, are written by hand
for the figures above them. A benchmark whose section brings no notes of its own keeps
the ones in the file, under a line that says which run they were written for, so that
a new run does not erase them and a reader can tell when they are older than the table.
"""

from __future__ import annotations

import re
from pathlib import Path

NOTES = "Reading these figures:"
_WRITTEN_FOR = "(These notes were written for the run of "
_MEASURED = re.compile(r"Measured (\d{4}-\d\d-\d\d[ T]\d\d:\d\d(?:[\u2013-]\d\d:\d\d)? UTC)")


def replace_section(path: Path, section: str) -> None:
    """Put ``section`` (which starts with its ``## Title`` line) in place of the section
    of that title in ``path``, keeping the old section's notes when ``section`` has
    none (see the module docstring)."""
    title = section.split("\n", 1)[0] + "\n"
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    start = text.find(title)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        end = text.find("\n## ", start + 1)
        old = text[start:] if end < 0 else text[start:end]
        text = text[:start] + _with_notes(section, old) + ("" if end < 0 else text[end:])
    path.write_text(text)


def _with_notes(section: str, old: str) -> str:
    at = old.find(f"\n{NOTES}\n")
    if f"\n{NOTES}\n" in section or at < 0:
        return section
    notes = old[at + 1 :]
    if _WRITTEN_FOR not in notes:
        stamp = _MEASURED.search(old[:at])
        when = stamp.group(1) if stamp else "an earlier version of this table"
        notes = notes.replace(f"{NOTES}\n", f"{NOTES}\n\n{_WRITTEN_FOR}{when}.)\n", 1)
    return section.rstrip("\n") + "\n\n" + notes.rstrip("\n") + "\n"
