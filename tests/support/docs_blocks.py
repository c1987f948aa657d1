"""The Python blocks of the documentation: every page of the site (``docs/**/*.md``, the
files they include with ``--8<--``) and the README, each block with what it needs to run.

A block needs nothing (no marker: the fast tier runs it), or the broker named by the
HTML comment on the line above its fence, which the integration tier starts::

    <!-- docs-test: rabbitmq -->
    ```python
    ...
    ```

``rabbitmq``, ``kafka``, ``amqp10`` (ActiveMQ Artemis), ``postgres``, ``kafka-registry``
(Kafka and the schema registry): the suite's session broker or database, its address
put in place of the one the page shows (:data:`SUBSTITUTIONS`); ``integration``: the
block starts what it needs itself (a ``msgsafe.cluster`` broker). A block that is not
meant to run says so where a reader sees it, in its title:
```` ```python title="Fragment: df is your DataFrame" ```` (the word "fragment" and why);
:data:`MAX_FRAGMENTS` keeps them rare.

The blocks of one page that need the same thing run in order, in one process: a later
block may use what an earlier one defined (the URL, a producer). Beside this checkout,
:data:`GENERATED` is on their import path: the modules a reader generates from a file
the page shows (``order_pb2`` from ``order.proto``), as the repository keeps them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.support.commands import Run, run_python

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"

#: What a block may need; "fast" is a block without a marker.
NEEDS = ("fast", "rabbitmq", "kafka", "kafka-registry", "amqp10", "postgres", "integration")

#: Blocks shown but not run (each titled "Fragment: why"); raise with care.
MAX_FRAGMENTS = 5

#: Per need: (what the page shows, what the block runs with instead): templates of
#: Python expressions the integration test fills in from its fixtures. Applied in order.
SUBSTITUTIONS: Mapping[str, Sequence[tuple[str, str]]] = {
    "rabbitmq": (
        ('pika.URLParameters("amqp://guest:guest@127.0.0.1:5672/%2F")', "{node_params}"),
        ('"amqp://guest:guest@127.0.0.1:5672/%2F"', "{cluster_url}"),
        ('"amqp10://guest:guest@127.0.0.1:5672"', "{amqp10_url}"),
    ),
    "kafka": (
        ('"kafka://127.0.0.1:9092"', "{kafka_url}"),
        ('"127.0.0.1:9092"', "{bootstrap}"),
    ),
    "kafka-registry": (
        ('"kafka://127.0.0.1:9092"', "{kafka_url}"),
        ('"http://127.0.0.1:8081/apis/ccompat/v6"', "{registry_url}"),
    ),
    "amqp10": (('"amqp10://msgsafe:msgsafe@127.0.0.1:5672"', "{artemis_url}"),),
    "postgres": (('"postgresql://postgres@127.0.0.1:5432/test"', "{conninfo}"),),
    "integration": (),
}

#: Folders of generated modules a page imports (protoc's ``order_pb2.py``).
GENERATED = (ROOT / "examples" / "protobuf",)

#: Queue and topic names a page uses, given a fresh name per run on a shared broker.
DESTINATIONS = ("orders", "events")

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^`\n]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<need>[\w-]+)\s*-->\s*$")
_TITLE = re.compile(r'title="(?P<title>[^"]*)"')
_INCLUDE = re.compile(r'^\s*--8<--\s+"(?P<path>[^"]+)"\s*$', re.M)
_PYTHON = {"python", "py", "python3", "pycon", "pyi"}


@dataclass(frozen=True)
class Block:
    """One fenced Python block of a page."""

    page: str  #: the page's path from the repository root
    line: int  #: the line of its opening fence (1-based)
    code: str
    need: str  #: one of NEEDS, or "fragment"
    title: str = ""

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"


def pages() -> list[Path]:
    """The README and every page of the site, with the files the pages include."""
    found = [ROOT / "README.md"]
    for page in sorted(DOCS.rglob("*.md")):
        if "_griffe" in page.parts:
            continue
        found.append(page)
        for include in _INCLUDE.finditer(page.read_text()):
            path = ROOT / include.group("path")
            if path not in found:
                found.append(path)
    return found


def parse(page: Path) -> list[Block]:
    """Every fenced Python block of ``page``, with its marker checked."""
    name = page.relative_to(ROOT).as_posix()
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    index = 0
    while index < len(lines):
        opening = _FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        fence, indent = opening.group("fence"), opening.group("indent")
        info = opening.group("info").strip()
        end = index + 1
        while end < len(lines) and not (
            lines[end].strip().startswith(fence) and lines[end].strip().strip(fence[0]) == ""
        ):
            end += 1
        if end == len(lines):
            raise AssertionError(f"{name}:{index + 1}: a fence that is never closed")
        language = info.lstrip("{.").split()[0].rstrip("}") if info else ""
        if language.lower() in _PYTHON:
            code = "\n".join(line.removeprefix(indent) for line in lines[index + 1 : end])
            blocks.append(_block(name, index + 1, code, info, lines[:index]))
        index = end + 1
    return blocks


def _block(page: str, line: int, code: str, info: str, above: list[str]) -> Block:
    title_match = _TITLE.search(info)
    title = title_match.group("title") if title_match else ""
    previous = next((text for text in reversed(above) if text.strip()), "")
    marker = _MARKER.match(previous)
    where = f"{page}:{line}"
    if info.split()[0] != "python":
        raise AssertionError(f"{where}: write Python blocks as ```python (not {info!r})")
    if "fragment" in title.lower():
        if marker is not None:
            raise AssertionError(f"{where}: a fragment is not run, yet it has a docs-test marker")
        if len(title.split()) < 3:
            raise AssertionError(f"{where}: a fragment's title says why it is not run: {title!r}")
        return Block(page, line, code, "fragment", title)
    need = marker.group("need") if marker else "fast"
    if need not in NEEDS:
        raise AssertionError(f"{where}: unknown docs-test marker {need!r}; one of {NEEDS}")
    return Block(page, line, code, need, title)


def all_blocks() -> list[Block]:
    """Every block of every page; a page's blocks marked for a broker show (together) an
    address the suite replaces with its own broker's."""
    blocks = [block for page in pages() for block in parse(page)]
    for need, shown in SUBSTITUTIONS.items():
        if not shown:
            continue
        for page, marked in groups(blocks, need).items():
            if not any(text in block.code for block in marked for text, _ in shown):
                raise AssertionError(
                    f"{page}: blocks marked {need!r} show none of the addresses the suite "
                    f"replaces ({', '.join(text for text, _ in shown)}); use one of them"
                )
    return blocks


def groups(blocks: Iterable[Block], need: str) -> dict[str, list[Block]]:
    """Page -> its blocks that need ``need``, in page order."""
    grouped: dict[str, list[Block]] = {}
    for block in blocks:
        if block.need == need:
            grouped.setdefault(block.page, []).append(block)
    return grouped


def program(blocks: Sequence[Block], values: Mapping[str, str] | None = None) -> str:
    """The blocks as one program, each headed by where it comes from; with ``values``
    (the fixtures' addresses and fresh destination names), the page's addresses and
    destinations replaced by them."""
    parts = []
    for block in blocks:
        code = block.code
        if values is not None:
            for shown, template in SUBSTITUTIONS[block.need]:
                code = code.replace(shown, template.format(**values))
            for name in DESTINATIONS:
                fresh = values.get(f"dest_{name}", name)
                code = re.sub(rf"(?<=[\"'/]){name}(?=[\"'])", fresh, code)
        parts.append(f"# --- {block.where}\n{code}")
    return "\n\n".join(parts) + "\n"


def run_blocks(
    blocks: Sequence[Block],
    values: Mapping[str, str] | None = None,
    *,
    label: str,
    cwd: Path,
    timeout: float,
) -> Run:
    """Run :func:`program` of ``blocks`` in a fresh interpreter in ``cwd``, with a HOME of
    its own there (an outbox a block opens by default lands in the test's directory, not
    the user's) and this checkout first on the import path, then :data:`GENERATED`."""
    home = cwd / "home"
    home.mkdir()
    return run_python(
        "-c",
        program(blocks, values),
        label=label,
        cwd=cwd,
        env={
            "HOME": str(home),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "PYTHONPATH": os.pathsep.join(
                p for p in (str(ROOT), *map(str, GENERATED), os.environ.get("PYTHONPATH")) if p
            ),
        },
        timeout=timeout,
    )
