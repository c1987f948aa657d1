"""benchmarks/bench_consume.py: its arguments, its ratios and the README section it
writes (no broker: the figures are made up here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_consume
from benchmarks._readme import replace_section
from benchmarks.bench_send import Result, Tally

OTHER = "# Benchmarks\n\n## Kafka\n\nkafka body\n"


def _tally(rate: float, cpu_us: float, messages: int = 1000) -> Tally:
    return Tally(wall=messages / rate, cpu=cpu_us * messages / 1e6, messages=messages)


def _results() -> list[Result]:
    kafka = Result("kafka", "Apache Kafka, 1 node")
    kafka.rounds = {
        "raw": [_tally(200_000, 1.5), _tally(100_000, 1.5), _tally(150_000, 1.5)],
        "poll+ack": [_tally(190_000, 2.0), _tally(80_000, 2.0), _tally(150_000, 2.0)],
        "dedup": [_tally(160_000, 3.0), _tally(70_000, 3.0), _tally(100_000, 3.0)],
    }
    rabbit = Result("rabbitmq", "RabbitMQ 1 node")
    rabbit.rounds = {"raw": [_tally(20_000, 40.0)], "poll+ack": [_tally(21_000, 30.0)]}
    return [kafka, rabbit]


def test_defaults_and_options_parse() -> None:
    args = bench_consume.parse_args([])
    assert (args.rounds, args.messages, args.rabbit_messages, args.profile) == (
        3,
        200_000,
        50_000,
        0,
    )
    assert args.only is None and args.url == [] and args.readme is None
    args = bench_consume.parse_args(
        ["--only", "kafka", "--rounds", "5", "--url", "kafka://127.0.0.1:9092", "--profile", "9"]
    )
    assert args.only == ["kafka"] and args.rounds == 5 and args.profile == 9
    args = bench_consume.parse_args(
        ["--only", "amqp10", "--only", "inbox", "--url", "amqp10://u:p@127.0.0.1:5672"]
    )
    assert args.only == ["amqp10", "inbox"]


@pytest.mark.parametrize(
    "argv",
    [["--only", "qpid"], ["--rounds", "0"], ["--messages", "0"], ["--rabbit-messages", "0"]],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench_consume.parse_args(argv)


def _what(protocol: str, variant: str, baseline: str = "raw") -> str:
    return next(g[4] for g in bench_consume.GOALS if g[:3] == (protocol, variant, baseline))


def test_each_goal_is_read_on_the_median_of_its_rounds() -> None:
    rows = {row[0]: row for row in bench_consume.goal_lines(_results(), bench_consume.GOALS)}
    poll = rows[_what("kafka", "poll+ack")]
    assert poll[1:4] == pytest.approx((0.95, 0.80, 1.0))
    assert poll[5] == pytest.approx(0.75) and poll[6] == ">= 0.9: **met**"
    dedup = rows[_what("kafka", "dedup")]
    assert dedup[1] == pytest.approx(0.70) and dedup[6] == ">= 0.8: **not met**"
    rabbit = rows[_what("rabbitmq", "poll+ack")]
    assert rabbit[1] == pytest.approx(1.05) and rabbit[6] == ">= 1.0: **met**"
    # Only the variants measured have rows (no run x4 and no floors here).
    assert len(rows) == 3


def test_the_section_is_written_with_figures_goals_and_the_command(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OTHER)
    args = bench_consume.parse_args(["--rounds", "3", "--only", "kafka"])
    section = bench_consume.report(_results(), args, "2026-12-06 19:00", "19:10", "load 1")
    replace_section(readme, section)
    text = readme.read_text()
    assert text.startswith(OTHER.rstrip("\n") + "\n\n## Consuming\n")
    assert "--rounds 3 --messages 200000 --rabbit-messages 50000 --only kafka" in text
    assert "Measured 2026-12-06 19:00\u201319:10 UTC" in text
    assert "| kafka | poll+ack |" in text and "| rabbitmq | raw |" in text
    assert "| **0.95** | 0.80 .. 1.00 |" in text


def test_amqp10_and_the_inbox_are_read_against_their_own_raw_loops() -> None:
    amqp10 = Result("amqp10", "Artemis")
    amqp10.rounds = {"raw": [_tally(10_000, 50.0)], "poll+ack": [_tally(8_000, 60.0)]}
    inbox = Result("inbox", "RabbitMQ; SQLite")
    inbox.rounds = {
        "raw": [_tally(1_000, 90.0)],
        "run mem": [_tally(950, 100.0)],
        "run": [_tally(450, 200.0)],
        "raw+count": [_tally(500, 180.0)],
    }
    rows = {row[0]: row for row in bench_consume.goal_lines([amqp10, inbox], bench_consume.GOALS)}
    assert len(rows) == 4
    poll = rows[_what("amqp10", "poll+ack")]
    assert poll[1] == pytest.approx(0.8) and poll[6] == ">= 0.9: **not met**"
    # The goals compare the same transactions: run / raw+count, run mem / raw.
    assert rows[_what("inbox", "run", "raw+count")][1] == pytest.approx(0.9)
    memory = rows[_what("inbox", "run mem")]
    assert memory[1] == pytest.approx(0.95) and memory[6] == ">= 0.9: **met**"
    assert rows[_what("inbox", "run")][1] == pytest.approx(0.45)
    # Every variant measured says what its loop does.
    assert bench_consume.tables([amqp10, inbox], bench_consume.LOOPS, [])


def test_the_inbox_statements_are_written_for_sqlite_and_translated_for_postgres() -> None:
    sqlite = bench_consume.Database("sqlite", "/tmp")
    postgres = bench_consume.Database("postgres", "postgresql://u:p@127.0.0.1:5432/db")
    assert sqlite.sql(bench_consume.RAW_RECORD) == bench_consume.RAW_RECORD
    assert (sqlite.begin, postgres.begin) == ("BEGIN IMMEDIATE", "BEGIN")
    assert postgres.sql(bench_consume.EFFECT).endswith("VALUES (%s, %s)")
    table = postgres.sql(bench_consume.RAW_INBOX)
    assert "handled_at double precision NOT NULL" in table and "?" not in table
    assert postgres.sql(bench_consume.EFFECTS).endswith("body bytea)")
    assert "%s" not in postgres.sql(bench_consume.RAW_ATTEMPTS)
