"""docs/architecture.md says what is true of the package: its modules and its layers.

The tree in its code block names a folder on an unindented line (``msgsafe/outbox/``)
and each module of that folder on an indented line below it (``  sqlite.py  what it
owns``). A module added, moved or removed without the page changing fails here, with
the names to add or drop.

The layer table lists the layers top to bottom; its "where" column names files
(``msgsafe/ports.py``, or ``producer.py`` for one of ``msgsafe/``) and folders
(``msgsafe/outbox/``). Every module belongs to exactly one row (the longest entry that
names it), and every import of a ``msgsafe`` module, read with :mod:`ast`, points to
the importer's layer or one below. Counted: module-level imports, imports inside
functions (they are deferred, not absent), and ``if TYPE_CHECKING:`` imports: an
annotation naming an upper layer's type is the same knowledge of that layer, only
without the cycle at run time; the cure is a Protocol in a lower layer (``ports.py``),
not a guard. An import names its target module (``from msgsafe.outbox import sqlite``
names ``msgsafe/outbox/sqlite.py``), not the packages Python runs on the way. Imports
by computed name (``importlib.import_module`` over the scheme or kind tables) stay
inside their own layer and are not read.

Inside a layer the parts of the package (a top folder, ``msgsafe/compat/``, or a module
of ``msgsafe/``) import each other one way only: an import from one part to another
that leads back to the first, directly or through others, fails too. A module's own
folder may hold such loops (a package's modules deferring imports of each other).
"""

from __future__ import annotations

import ast
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


# --- the layers -------------------------------------------------------------------------

_TABLE_HEADER = "| layer | where | what it owns |"


def _layer_rows(text: str) -> list[tuple[str, list[str]]]:
    """The layer table of ``text``, top to bottom: (layer, the paths its row names)."""
    lines = text.split(_TABLE_HEADER, 1)[1].splitlines()[2:]  # past the |---| line
    rows: list[tuple[str, list[str]]] = []
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        layer, where = cells[0], cells[1]
        entries = [
            e if e.startswith("msgsafe/") else "msgsafe/" + e
            for e in re.findall(r"`([^`]+)`", where)
        ]
        assert entries, f"the row of layer {layer!r} names no file or folder"
        rows.append((layer, entries))
    assert rows, "docs/architecture.md has no layer table"
    return rows


def _layer_of(modules: set[str], rows: list[tuple[str, list[str]]]) -> dict[str, int]:
    """Module path -> the index of its layer (0 is the top); fails on a module in no row
    or in two, and on an entry that names nothing."""
    placed: dict[str, int] = {}
    unplaced: list[str] = []
    twice: list[str] = []
    named: set[str] = set()
    for module in sorted(modules):
        matches = [
            (len(entry), index, entry)
            for index, (_, entries) in enumerate(rows)
            for entry in entries
            if module == entry or (entry.endswith("/") and module.startswith(entry))
        ]
        if not matches:
            unplaced.append(module)
            continue
        matches.sort(reverse=True)
        if len(matches) > 1 and matches[0][0] == matches[1][0]:
            twice.append(module)
        placed[module] = matches[0][1]
        named.add(matches[0][2])
    stale = sorted({entry for _, entries in rows for entry in entries} - named)
    assert not unplaced, f"docs/architecture.md's layer table has no row for: {unplaced}"
    assert not twice, f"docs/architecture.md's layer table names these twice: {twice}"
    assert not stale, f"docs/architecture.md's layer table names what no module is: {stale}"
    return placed


def _file_of(name: str) -> str | None:
    """``msgsafe.outbox.sqlite`` -> ``msgsafe/outbox/sqlite.py`` (a package: its
    ``__init__.py``), or None when no such module exists."""
    base = ROOT / name.replace(".", "/")
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path.relative_to(ROOT).as_posix()
    return None


def _imports(path: str, source: str) -> list[tuple[int, str]]:
    """(line, module path) of every ``msgsafe`` module the module at ``path`` imports,
    wherever the import statement is (module level, functions, ``if TYPE_CHECKING:``)."""
    package = path.split("/")[:-1]  # a relative import starts from the module's folder
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename=path)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package[: len(package) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if base != "msgsafe" and not base.startswith("msgsafe."):
                continue
            # ``from package import submodule`` names the submodule; else the module.
            subs = [_file_of(f"{base}.{alias.name}") for alias in node.names]
            names = [base] if None in subs else []
            found.extend((node.lineno, sub) for sub in subs if sub is not None)
        for name in names:
            if name == "msgsafe" or name.startswith("msgsafe."):
                target = _file_of(name)
                assert target is not None, f"{path}:{node.lineno} imports {name}: no such module"
                found.append((node.lineno, target))
    return found


def _upward(
    layers: dict[str, int], names: list[str], sources: dict[str, str]
) -> dict[tuple[str, str], str]:
    """(importer, imported) -> where and which layers, for every import that points up."""
    upward: dict[tuple[str, str], str] = {}
    for path, source in sorted(sources.items()):
        for line, target in _imports(path, source):
            if layers[target] < layers[path]:
                below, above = names[layers[path]], names[layers[target]]
                upward.setdefault(
                    (path, target), f"{path}:{line} ({below}) imports {target} ({above})"
                )
    return upward


def _package() -> tuple[dict[str, int], list[str], dict[str, str]]:
    rows = _layer_rows(PAGE.read_text())
    modules = _modules()
    sources = {module: (ROOT / module).read_text(encoding="utf-8") for module in modules}
    return _layer_of(modules, rows), [layer for layer, _ in rows], sources


def test_every_import_points_down_the_layer_table() -> None:
    layers, names, sources = _package()
    upward = _upward(layers, names, sources)
    assert not upward, "imports that point up a layer (docs/architecture.md):\n" + "\n".join(
        sorted(upward.values())
    )


def test_an_upward_import_is_caught_wherever_it_is() -> None:
    """The rule reads the imports it claims to: top level, deferred, type-only, relative."""
    layers, names, sources = _package()
    endpoints = "msgsafe/endpoints.py"
    planted = {
        "top level": "from msgsafe.telemetry import stats\n",
        "in a function": "def f():\n    import msgsafe.producer\n",
        "type only": "if TYPE_CHECKING:\n    from msgsafe.outbox.sqlite import SqliteOutbox\n",
        "relative": "from .cli import _output\n",
    }
    for how, code in planted.items():
        found = _upward(layers, names, {endpoints: sources[endpoints] + code})
        assert len(found) == 1, f"{how}: {found}"
    down = {endpoints: sources[endpoints] + "from msgsafe import errors\n"}
    assert _upward(layers, names, down) == {}, "an import of the same layer is no finding"


# --- no arrow back up, inside a layer either ------------------------------------------


def _part(module: str) -> str:
    """The part of the package a module is in: its top folder (``msgsafe/outbox/``), or
    the module itself for one of ``msgsafe/`` (``msgsafe/producer.py``)."""
    parts = module.split("/")
    return f"msgsafe/{parts[1]}/" if len(parts) > 2 else module


def _import_map(sources: dict[str, str]) -> dict[str, list[tuple[int, str]]]:
    """Module path -> (line, module path) of every ``msgsafe`` module it imports."""
    return {path: _imports(path, source) for path, source in sources.items()}


def _loops(imports: dict[str, list[tuple[int, str]]]) -> list[str]:
    """Every import from one part to another that the other part reaches back from:
    ``path:line imports target``, and the way back, one line per arrow."""
    arrows: dict[tuple[str, str], str] = {}
    for path, targets in sorted(imports.items()):
        for line, target in targets:
            if _part(path) != _part(target):
                arrows.setdefault((_part(path), _part(target)), f"{path}:{line} imports {target}")
    below: dict[str, set[str]] = {}
    for start, end in arrows:
        below.setdefault(start, set()).add(end)

    def path_back(start: str, goal: str) -> list[str] | None:
        """The parts from ``start`` to ``goal`` along the arrows, if any."""
        seen, todo = {start}, [[start]]
        while todo:
            way = todo.pop()
            if way[-1] == goal:
                return way
            for step in sorted(below.get(way[-1], ())):
                if step not in seen:
                    seen.add(step)
                    todo.append([*way, step])
        return None

    found: list[str] = []
    for (start, end), where in sorted(arrows.items()):
        back = path_back(end, start)
        if back is not None:
            found.append(f"{where}, and back: {' -> '.join(back)}")
    return found


def test_no_part_of_the_package_is_imported_back_by_what_it_imports() -> None:
    """The layer rule lets a row's parts import each other (``compat/`` and ``spark/``,
    ``consumer.py`` and ``aio.py``); one way only, so that the arrows between the parts of
    the package, folders and top-level modules, make no loop."""
    _, _, sources = _package()
    loops = _loops(_import_map(sources))
    assert not loops, "parts of the package that import each other:\n" + "\n".join(loops)


def test_a_loop_is_caught_across_a_layer_and_inside_one() -> None:
    _, _, sources = _package()
    imports = _import_map(sources)
    planted = {
        "across": ("msgsafe/cluster/cli.py", "from msgsafe.cli import _output\n"),
        "inside": ("msgsafe/errors.py", "from msgsafe import endpoints\n"),
    }
    assert _loops(imports) == []
    for how, (path, code) in planted.items():
        changed = {**imports, path: _imports(path, sources[path] + code)}
        assert any(line.startswith(f"{path}:") for line in _loops(changed)), how
