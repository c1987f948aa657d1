"""The documentation cannot drift: the site builds strictly (a broken link or anchor, a
page missing from the nav, a docstring that does not render fail), every Python block of
every page is accounted for, and the blocks that need no broker run here, page by page,
as a reader would run them. The blocks that need one run in tests/integration/docs/."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.commands import ROOT, run_python
from tests.support.docs_blocks import (
    MAX_FRAGMENTS,
    NEEDS,
    Block,
    all_blocks,
    groups,
    pages,
    run_blocks,
)

BLOCKS = all_blocks()
FAST = groups(BLOCKS, "fast")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    result = run_python(
        "-m",
        "mkdocs",
        "build",
        "--strict",
        "--quiet",
        "--site-dir",
        str(tmp_path / "site"),
        label="mkdocs build --strict",
        cwd=ROOT,
        env={"NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert result.code == 0, (
        "the site does not build strictly (make docs; its tools: pip install -e '.[docs]'):\n"
        f"{result.stdout}{result.stderr[-5000:]}"
    )
    assert (tmp_path / "site" / "reference" / "api" / "msgsafe" / "index.html").is_file()


def test_every_python_block_is_accounted_for() -> None:
    counts = {need: sum(b.need == need for b in BLOCKS) for need in (*NEEDS, "fragment")}
    print("python blocks:", counts)
    assert sum(counts.values()) == len(BLOCKS)
    assert counts["fast"] >= 5 and sum(counts[n] for n in NEEDS if n != "fast") >= 5, counts
    fragments = [b for b in BLOCKS if b.need == "fragment"]
    assert len(fragments) <= MAX_FRAGMENTS, (
        f"{len(fragments)} Python blocks are not run (at most {MAX_FRAGMENTS}): make them "
        f"runnable, or raise MAX_FRAGMENTS with care: {[b.where for b in fragments]}"
    )


def test_every_page_of_the_site_is_read_for_blocks() -> None:
    read = {page.relative_to(ROOT).as_posix() for page in pages()}
    assert "README.md" in read and "docs/index.md" in read
    assert "benchmarks/README.md" in read  # included by docs/evidence/benchmarks.md
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk <= read


@pytest.mark.parametrize("page", sorted(FAST))
def test_the_blocks_of_a_page_run(page: str, tmp_path: Path) -> None:
    blocks: list[Block] = FAST[page]
    result = run_blocks(
        blocks, label=f"python blocks of {page} ({len(blocks)})", cwd=tmp_path, timeout=120
    )
    print(result.stdout)
    assert result.code == 0, f"{page}:\n{result.stderr[-5000:]}"


def test_the_readme_is_the_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    # What it is, the two commands, a tour, and links into the site: not the site itself.
    assert len(readme.splitlines()) <= 100, "the README holds pages again: move them to docs/"
    assert "make demo " in readme and "make test " in readme
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^make test$", ci, re.M), "CI runs exactly the README's test command"
    tour = re.findall(r"```python\n(.*?)```", readme, re.S)
    assert len(tour) == 1 and len(tour[0].splitlines()) <= 20, "the tour is one short block"
    links = re.findall(r"\]\(((?:docs|benchmarks|examples)/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) >= 15, links
    missing = [link for link in links if not (ROOT / link).is_file()]
    assert not missing, f"the README links to pages that do not exist: {missing}"
    nav = (ROOT / "mkdocs.yml").read_text()
    for link in links:
        if link.startswith("docs/"):
            assert link.removeprefix("docs/") in nav, f"{link} is not in the site's nav"
