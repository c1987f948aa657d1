"""The fast path is defined once (:mod:`msgsafe.fastpath`), and kept so.

Read with :mod:`ast` over the package:

- only ``msgsafe/fastpath.py`` sets a fast path's state: no other module assigns an
  attribute named ``resting`` (or ``_resting``), the flag every copy of the rule kept,
  or ``switching`` and ``holds`` (a fast path that holds messages, emptying them);
- where the fast paths live (the drop-ins, the adapters, the Spark writer), no module
  writes to an outbox itself: no ``.put(...)`` on something named ``...store...`` or
  ``...outbox...``; what a fast path could not deliver goes through
  :func:`msgsafe.fastpath.store_refused`;
- no class is named after the retired copies (``DirectPath``, ``DirectPublisher``,
  ``DirectSender``, ``DirectTaskPublisher``, ``DirectLane``) outside ``REMAINING``.

None remains: ``REMAINING`` (an exception, with why) is empty, and stays so; an entry
that no longer occurs fails too.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "msgsafe"
HOME = "msgsafe/fastpath.py"
#: Where fast paths live: no module here writes to an outbox itself.
FAST_PATH_HOMES = ("msgsafe/compat/", "msgsafe/adapters/", "msgsafe/spark/")
RETIRED = frozenset(
    {"DirectLane", "DirectPath", "DirectPublisher", "DirectSender", "DirectTaskPublisher"}
)
#: The state attributes only FastPath sets.
STATE = ("resting", "_resting", "switching", "holds")

#: (module, what) -> why it is still there. Remove an entry with what it names.
REMAINING: dict[tuple[str, str], str] = {}


@functools.cache
def _modules() -> dict[str, ast.Module]:
    return {
        path.relative_to(ROOT).as_posix(): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def _name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _findings(path: str, tree: ast.Module) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in STATE:
                found.add(f"sets .{target.attr}")
        if (
            path.startswith(FAST_PATH_HOMES)
            and isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "put"
        ):
            owner = _name(node.func.value).lower()
            if "store" in owner or "outbox" in owner:
                found.add(f"{_name(node.func.value)}.put")
        if isinstance(node, ast.ClassDef) and node.name in RETIRED:
            found.add(f"class {node.name}")
    return found


def _all_findings() -> set[tuple[str, str]]:
    return {
        (path, what)
        for path, tree in _modules().items()
        if path != HOME
        for what in _findings(path, tree)
    }


def test_no_module_but_fastpath_reimplements_the_fast_path() -> None:
    new = sorted(_all_findings() - REMAINING.keys())
    assert not new, (
        "the fast path's state or its outbox write outside msgsafe/fastpath.py "
        "(use FastPath / store_refused):\n" + "\n".join(f"{p}: {w}" for p, w in new)
    )


def test_the_remaining_list_only_shrinks() -> None:
    gone = sorted(REMAINING.keys() - _all_findings())
    assert not gone, f"no longer found, remove from REMAINING: {gone}"


def test_the_guard_sees_what_it_claims_to() -> None:
    """A copy of the rule, an outbox write and a retired class are each caught."""
    source = (
        "class DirectPath:\n"
        "    def failed(self):\n"
        "        self.resting = True\n"
        "        self.switching = False\n"
        "def park(producer, envelope):\n"
        "    producer.outbox.put([envelope])\n"
        "    store.put([envelope])\n"
    )
    tree = ast.parse(source)
    assert _findings("msgsafe/compat/new.py", tree) == {
        "class DirectPath",
        "sets .resting",
        "sets .switching",
        "outbox.put",
        "store.put",
    }
    assert "outbox.put" not in _findings("msgsafe/producer.py", tree)
