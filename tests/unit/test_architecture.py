"""docs/architecture.md lists every module of the package, one line each, and no other.

The tree in its code block names a folder on an unindented line (``msgsafe/outbox/``)
and each module of that folder on an indented line below it (``  sqlite.py  what it
owns``). A module added, moved or removed without the page changing fails here, with
the names to add or drop.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "architecture.md"

_FOLDER = re.compile(r"^(msgsafe/(?:[\w]+/)*)\s*(?:\S.*)?$")
_MODULE = re.compile(r"^\s+(\w+\.py)\s+\S")


def _documented() -> dict[str, int]:
    """Module path -> how often the tree lists it."""
    text = PAGE.read_text()
    tree = text.split("## The tree", 1)[1].split("```", 2)[1]
    listed: dict[str, int] = {}
    folder: str | None = None
    for line in tree.splitlines():
        if not line.strip():
            continue
        if (found := _FOLDER.match(line)) is not None:
            folder = found.group(1)
        elif (module := _MODULE.match(line)) is not None:
            assert folder is not None, f"module before any folder: {line!r}"
            path = folder + module.group(1)
            listed[path] = listed.get(path, 0) + 1
        else:
            raise AssertionError(f"a tree line that is neither folder nor module: {line!r}")
    return listed


def _modules() -> set[str]:
    return {
        path.relative_to(ROOT).as_posix()
        for path in (ROOT / "msgsafe").rglob("*.py")
        if "__pycache__" not in path.parts
    }


def test_every_module_is_on_the_architecture_page_once() -> None:
    listed = _documented()
    modules = _modules()
    missing = sorted(modules - set(listed))
    stale = sorted(set(listed) - modules)
    twice = sorted(path for path, count in listed.items() if count > 1)
    assert not missing, f"add to docs/architecture.md (one line each): {missing}"
    assert not stale, f"docs/architecture.md lists modules that do not exist: {stale}"
    assert not twice, f"docs/architecture.md lists these more than once: {twice}"


def test_the_send_path_names_files_that_exist() -> None:
    text = PAGE.read_text().split("## The path of a `send()`", 1)[1].split("## The tree", 1)[0]
    named = set(re.findall(r"`((?:[\w]+/)*\w+\.py)`", text))
    assert named, "the send path names no file"
    package = ROOT / "msgsafe"
    gone = sorted(name for name in named if not (package / name).is_file())
    assert not gone, f"the send path in docs/architecture.md names missing files: {gone}"
