"""benchmarks/bench_pg_outbox.py: its arguments and the README section it writes (no
database: the figures are made up here)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from benchmarks import bench_pg_outbox
from benchmarks.bench_pg_outbox import PutResult


def test_defaults_and_every_option_parse() -> None:
    args = bench_pg_outbox.parse_args([])
    assert (args.seconds, args.forward_rows, args.forwarders, args.bloat) == (
        8.0,
        20_000,
        [1, 2, 4],
        1_000_000,
    )
    assert args.only is None and args.readme is None
    args = bench_pg_outbox.parse_args(
        [
            "--only",
            "put",
            "--only",
            "bloat",
            "--seconds",
            "2",
            "--forward-rows",
            "500",
            "--forwarders",
            "1",
            "3",
            "--bloat",
            "200000",
        ]
    )
    assert args.only == ["put", "bloat"] and args.seconds == 2.0
    assert (args.forward_rows, args.forwarders, args.bloat) == (500, [1, 3], 200_000)
    assert bench_pg_outbox.parse_args(["--readme", "b/README.md"]).readme == Path("b/README.md")


@pytest.mark.parametrize(
    "argv",
    [
        ["--only", "drain"],
        ["--only", "put", "--readme", "README.md"],
        ["--seconds", "0"],
        ["--bloat", "0"],
        ["--forwarders", "0"],
    ],
)
def test_bad_arguments_are_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench_pg_outbox.parse_args(argv)
    assert exited.value.code == 2


def test_the_report_and_its_readme_section(tmp_path: Path) -> None:
    args = bench_pg_outbox.parse_args(["--bloat", "200000"])
    text = bench_pg_outbox.report(
        [PutResult(1, 900.0, 1000.0, [0.8, 0.9, 1.0])],
        {1: 2000.0, 2: 3000.0},
        {1: 2500.0, 2: 2000.0},
        {
            "rows": 200_000,
            "seconds": 100.0,
            "peak": {"heap": 10 << 20, "index": 5 << 20},
            "after": {"heap": 12 << 20, "index": 6 << 20, "dead": 1000},
            "vacuumed": {"heap": 12 << 20, "index": 6 << 20, "dead": 0},
        },
        args,
        "Measured now.",
    )
    assert "= 0.90 (slice pairs: median 0.90, range 0.80 to 1.00) | >= 0.8 |" in text
    assert "3,000 msg/s (1.50 x 1 forwarder); counted from the first row gone" in text
    assert "meanwhile: 2,000 msg/s (0.80 x 1)" in text
    assert "after 200,000 rows put and forwarded" in text and "12.0 MiB" in text
    readme = tmp_path / "README.md"
    readme.write_text("# Benchmarks\n\n## Kafka\n\nkafka body\n")
    bench_pg_outbox.update_readme(readme, text)
    written = readme.read_text()
    assert written.startswith("# Benchmarks\n\n## Kafka\n\nkafka body\n\n## PostgreSQL outbox\n")
    assert "Measured now." in written


def _drained(rate: float) -> bench_pg_outbox.Drained:
    return bench_pg_outbox.Drained(
        rate=rate,
        seconds=1.0,
        start_cpu=[0.5],
        cores={"backends": rate * 20e-6, "bench": 0.0, "primary": 0.0, "standby": 0.0},
        forwarder_cores=[rate * 10e-6],
        machine_cores=1.5,
        commits=30.0,
    )


def _backlog(rows: int, *rates: float) -> bench_pg_outbox.Backlog:
    sizes = {"total": 1 << 20, "dead": 0, "autovacuums": 0}
    return bench_pg_outbox.Backlog(
        rows,
        "default",
        rates[0],
        {"keys": (1.0, 10)},
        (0.01, 0.5, 0.4, False),
        sizes,
        sizes,
        sizes,
        10.0,
        _drained(rates[0]),
        [_drained(r) for r in rates[1:]],
    )


def test_the_big_backlog_is_measured_against_the_median_of_the_small_drains() -> None:
    lines = bench_pg_outbox.backlog_lines(
        [_backlog(10_000, 30_000, 10_000, 20_000), _backlog(1_000_000, 18_000)]
    )
    assert "median 20,000 msg/s of 3 drains (10,000, 20,000, 30,000)" in lines[0]
    assert "18,000 msg/s = 0.90 x the 10,000-row backlog's median" in lines[1]
    # CPU per message of each drain (the small one's median run): 10 + 20 µs
    assert "the forwarder 10.0, its backend 20.0" in lines[2] and "all 30.0" in lines[2]


def test_the_backlog_options_parse_and_bad_ones_are_refused() -> None:
    args = bench_pg_outbox.parse_args(["--only", "backlog"])
    assert (args.big_runs, args.small_runs, args.queue, args.pg_nodes, args.pg_set) == (
        1,
        2,
        "emptied",
        2,
        [],
    )
    args = bench_pg_outbox.parse_args(
        [
            "--only",
            "backlog",
            "--big-runs",
            "3",
            "--queue",
            "kept",
            "--pg-nodes",
            "1",
            "--pg-set",
            "shared_buffers=1GB",
            "--pg-set",
            "wal_compression=on",
        ]
    )
    assert (args.big_runs, args.queue, args.pg_nodes) == (3, "kept", 1)
    assert args.pg_set == ["shared_buffers=1GB", "wal_compression=on"]
    for argv in (["--big-runs", "0"], ["--pg-nodes", "3"], ["--pg-set", "shared_buffers"]):
        with pytest.raises(SystemExit):
            bench_pg_outbox.parse_args(argv)


def test_each_big_drain_is_divided_by_the_small_drains_just_around_it() -> None:
    ratios = bench_pg_outbox.round_ratios(
        [9_000.0, 5_000.0], [[10_000.0, 10_000.0], [8_000.0, 12_000.0], [4_000.0, 6_000.0]]
    )
    # the first: median of 10k, 10k, 8k, 12k = 10k; the second: of 8k, 12k, 4k, 6k = 7k
    assert ratios == [0.9, 5_000.0 / 7_000.0]
    with pytest.raises(ValueError):
        bench_pg_outbox.round_ratios([9_000.0], [[10_000.0]])


def test_the_big_backlog_line_shows_the_per_round_ratios() -> None:
    big = _backlog(1_000_000, 18_000, 20_000)
    big.ratios = [0.95, 0.85]
    lines = bench_pg_outbox.backlog_lines([_backlog(10_000, 20_000, 20_000), big])
    assert "median 19,000 msg/s of 2 drains (18,000, 20,000)" in lines[1]
    assert "= 0.90 x the 10,000-row drains around each" in lines[1]
    assert "per-round ratios: 0.85, 0.95); 0.95 median to median" in lines[1]
    assert "WAL 0 bytes a message, 0 checkpoint(s)" in lines[3]


def test_pg_settings_apply_while_the_cluster_is_made_and_are_restored() -> None:
    from msgsafe.cluster import postgres

    kept = dict(postgres._SETTINGS)
    with bench_pg_outbox.pg_settings(["shared_buffers=1GB", "wal_compression=on"]):
        assert postgres._SETTINGS["shared_buffers"] == "1GB"
        assert postgres._SETTINGS["wal_compression"] == "on"
    assert kept == postgres._SETTINGS


def test_the_server_counters_are_read_as_integers() -> None:
    class Conn:
        def execute(self, query: str) -> Conn:
            assert "pg_current_wal_lsn()" in query and "buffers_backend" in query
            return self

        def fetchone(self) -> tuple[object, ...]:
            return (Decimal(123_456), 2, 7)

    assert bench_pg_outbox._server_counters(Conn()) == (123_456, 2, 7)
