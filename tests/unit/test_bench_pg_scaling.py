"""benchmarks/bench_pg_outbox.py --scaling: its argument, the limit it names and the
README section it writes (no database or broker: the figures are made up here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_pg_outbox
from benchmarks._readme import replace_section
from benchmarks.bench_pg_outbox import ScalingRun


def run(rate: float, forwarders: list[float], machine: float, raw: float = 50_000) -> ScalingRun:
    return ScalingRun("RabbitMQ", len(forwarders), rate, forwarders, 0.3, 0.6, machine, 40.0, raw)


def test_scaling_is_an_option_of_its_own() -> None:
    assert bench_pg_outbox.parse_args([]).scaling is False
    args = bench_pg_outbox.parse_args(["--scaling", "--forwarders", "1", "2", "--readme", "R.md"])
    assert args.scaling and args.forwarders == [1, 2] and args.readme == Path("R.md")


@pytest.mark.parametrize(
    ("figures", "limit"),
    [
        (run(9_000, [0.5, 0.5], machine=1.9), "the machine's cores (1.9 of 2 busy)"),
        (run(9_000, [0.95], machine=1.2), "a forwarder's core"),
        (run(45_000, [0.6], machine=1.2), "the broker (near its raw client's rate)"),
        (run(9_000, [0.4], machine=1.0), "none saturated: waits (round trips, commits)"),
    ],
)
def test_the_limit_named_follows_the_figures(figures: ScalingRun, limit: str) -> None:
    assert figures.limit(2) == limit


def test_the_section_shows_every_run_against_one_forwarder(tmp_path: Path) -> None:
    runs = [run(10_000, [0.8], machine=1.0), run(15_000, [0.7, 0.6], machine=1.95)]
    text = bench_pg_outbox.scaling_report(runs, 20_000, "Measured then.")
    assert text.startswith("## PostgreSQL outbox: forwarder scaling\n")
    rows = [line for line in text.splitlines() if line.startswith("| RabbitMQ |")]
    assert len(rows) == 2
    assert "| 2 | 15,000 | 1.50 | 0.70, 0.60 |" in rows[1]
    assert rows[1].endswith(f"| {runs[1].limit(bench_pg_outbox.os.cpu_count() or 1)} |")
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## PostgreSQL outbox\n\nput figures\n")
    replace_section(readme, text)
    assert "put figures" in readme.read_text()  # the other section is kept
    assert readme.read_text().count("## PostgreSQL outbox: forwarder scaling") == 1
