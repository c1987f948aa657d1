"""benchmarks/bench_pg_outbox.py --scaling: its argument, the limit it names and the
README section it writes (no database or broker: the figures are made up here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_pg_outbox
from benchmarks._readme import replace_section
from benchmarks.bench_pg_outbox import CpuBook, Drained, ScalingRun


def run(
    rate: float,
    forwarders: list[float],
    machine: float,
    raw: float = 50_000,
    alone: float = 40_000,
) -> ScalingRun:
    """Made-up figures: the backends 0.3 of a core, the broker's one node 0.6, the rest
    of PostgreSQL and this benchmark nothing."""
    drained = Drained(
        rate=rate,
        seconds=10.0,
        start_cpu=[0.5] * len(forwarders),
        cores={"backends": 0.3, "bench": 0.0, "primary": 0.0, "standby": 0.0, "broker 0": 0.6},
        forwarder_cores=forwarders,
        machine_cores=machine,
        commits=40.0,
    )
    return ScalingRun("RabbitMQ", len(forwarders), drained, raw, 1.0, alone)


def test_scaling_is_an_option_of_its_own() -> None:
    assert bench_pg_outbox.parse_args([]).scaling is False
    args = bench_pg_outbox.parse_args(["--scaling", "--forwarders", "1", "2", "--readme", "R.md"])
    assert args.scaling and args.forwarders == [1, 2] and args.readme == Path("R.md")


@pytest.mark.parametrize(
    ("figures", "limit"),
    [
        (
            run(10_000, [0.5, 0.5], machine=1.9),
            "machine: 2 cores 95% busy (1.90 this run's, 0.00 other work); at 190 µs a "
            "message, 2 cores alone carry about 10,526 msg/s",
        ),
        (run(9_000, [0.95], machine=1.2), "a forwarder's core"),
        (run(45_000, [0.6], machine=1.2), "broker (0.90 x its raw client's rate)"),
        (run(9_000, [0.4], machine=1.0, alone=10_000), "database (90% of the store alone)"),
        (run(9_000, [0.4], machine=1.0), "none saturated (machine 50% busy): waits"),
    ],
)
def test_the_limit_named_follows_the_figures(figures: ScalingRun, limit: str) -> None:
    assert figures.limit(2) == limit


def test_the_cpu_book_counts_processes_gone_and_born_from_their_last_value() -> None:
    book = CpuBook()
    book.seen = {"g": {1: 5.0, 2: 1.0}}
    book.start()
    book.seen["g"].update({1: 7.5, 3: 0.25})  # 2 is gone: its last value stays
    assert book.used("g") == pytest.approx(2.75)
    assert book.used("missing") == 0.0


def test_the_section_shows_every_run_against_one_forwarder(tmp_path: Path) -> None:
    runs = [run(10_000, [0.8], machine=1.0), run(15_000, [0.7, 0.6], machine=1.95)]
    text = bench_pg_outbox.scaling_report(runs, 20_000, "Measured then.")
    assert text.startswith("## PostgreSQL outbox: forwarder scaling\n")
    rows = [line for line in text.splitlines() if line.startswith("| RabbitMQ |")]
    assert len(rows) == 2
    assert "| 2 | 15,000 | 1.50 | 10.0 | 0.50, 0.50 | 0.70, 0.60 | 0.30 |" in rows[1]
    assert "| 0.60 | 0.00 | 2.20 (147) | 1.95 of " in rows[1]
    assert rows[1].endswith(f"| {runs[1].limit(bench_pg_outbox.os.cpu_count() or 1)} |")
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## PostgreSQL outbox\n\nput figures\n")
    replace_section(readme, text)
    assert "put figures" in readme.read_text()  # the other section is kept
    assert readme.read_text().count("## PostgreSQL outbox: forwarder scaling") == 1
