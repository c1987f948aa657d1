"""benchmarks/_readme.py: a benchmark's run replaces its README section's figures, and
keeps the notes written by hand for them when it brings none of its own."""

from __future__ import annotations

from pathlib import Path

from benchmarks._readme import replace_section

OLD = (
    "# Benchmarks\n\n## Kafka\n\nMeasured 2026-11-25 13:41\u201313:47 UTC, load 9.\n\n"
    "| old table |\n\nReading these figures:\n\n- a note\n\n## Spark\n\nspark body\n"
)


def test_a_run_without_notes_keeps_the_hand_written_ones_and_says_for_which_run(
    tmp_path: Path,
) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OLD)
    replace_section(readme, "## Kafka\n\nMeasured 2026-11-26 02:40\u201302:44 UTC.\n\n| new |\n")
    text = readme.read_text()
    assert "| new |" in text and "| old table |" not in text
    assert "(These notes were written for the run of 2026-11-25 13:41\u201313:47 UTC.)" in text
    assert text.index("| new |") < text.index("- a note") < text.index("## Spark")
    assert text.endswith("- a note\n\n## Spark\n\nspark body\n")
    # A second run keeps the first stamp: the notes were written for that one.
    replace_section(readme, "## Kafka\n\nMeasured 2026-11-26 03:00\u201303:04 UTC.\n\n| newer |\n")
    assert readme.read_text().count("These notes were written for the run of 2026-11-25") == 1


def test_a_run_with_notes_of_its_own_replaces_them(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OLD)
    replace_section(readme, "## Kafka\n\n| new |\n\nReading these figures:\n\n- generated\n")
    text = readme.read_text()
    assert "- generated" in text and "- a note" not in text
    assert "These notes were written" not in text


def test_a_new_section_is_appended(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OLD)
    replace_section(readme, "## Recovery\n\nbody\n")
    assert readme.read_text() == OLD + "\n## Recovery\n\nbody\n"
