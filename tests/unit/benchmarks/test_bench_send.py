"""benchmarks/bench_send.py: its arguments, its ratios and the README section it writes
(no broker: the figures are made up here)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import bench_send
from benchmarks._readme import replace_section
from benchmarks.bench_send import Result, Tally

OTHER = "# Benchmarks\n\n## Kafka\n\nkafka body\n\n## Spark\n\nspark body\n"


def _tally(rate: float, cpu_us: float, messages: int = 1000) -> Tally:
    return Tally(wall=messages / rate, cpu=cpu_us * messages / 1e6, messages=messages)


def _results() -> list[Result]:
    kafka = Result("kafka", "Apache Kafka, 1 node")
    kafka.rounds = {
        "raw": [_tally(100_000, 5.0), _tally(100_000, 5.0), _tally(50_000, 6.0)],
        "msgsafe": [_tally(85_000, 6.0), _tally(70_000, 7.0), _tally(45_000, 7.0)],
        "compat": [_tally(95_000, 5.0), _tally(90_000, 5.0), _tally(48_000, 6.0)],
    }
    rabbit = Result("rabbitmq", "RabbitMQ 1 node, quorum queue")
    rabbit.rounds = {
        "raw": [_tally(1000, 150.0, 400), _tally(1000, 150.0, 400), _tally(1000, 150.0, 400)],
        "msgsafe": [_tally(900, 200.0, 400), _tally(960, 190.0, 400), _tally(990, 180.0, 400)],
    }
    return [kafka, rabbit]


def test_defaults_and_every_option_parse() -> None:
    args = bench_send.parse_args([])
    assert (args.rounds, args.messages, args.blocking_messages, args.block) == (6, 20_000, 400, 20)
    assert args.only is None and args.url == [] and args.readme is None and args.profile == 0
    args = bench_send.parse_args(
        [
            "--only",
            "kafka",
            "--only",
            "amqp10",
            "--rounds",
            "9",
            "--url",
            "kafka://127.0.0.1:9092",
            "--url",
            "amqp10://guest:guest@127.0.0.1:5672",
            "--profile",
            "500",
            "--readme",
            "benchmarks/README.md",
        ]
    )
    assert args.only == ["kafka", "amqp10"] and args.rounds == 9 and args.profile == 500
    assert args.readme == Path("benchmarks/README.md")
    assert bench_send.urls_by_protocol(args.url) == {
        "kafka": "kafka://127.0.0.1:9092",
        "amqp10": "amqp10://guest:guest@127.0.0.1:5672",
    }
    assert bench_send.urls_by_protocol(["amqp://h:5672"]) == {"rabbitmq": "amqp://h:5672"}


@pytest.mark.parametrize(
    "argv",
    [["--only", "memory"], ["--rounds", "0"], ["--block", "0"], ["--url", "memory://test"]],
)
def test_bad_arguments_exit(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        bench_send.parse_args(argv)


def test_ratios_are_read_round_by_round_and_each_goal_on_their_median() -> None:
    kafka, rabbit = _results()
    assert kafka.ratios("msgsafe", "raw") == pytest.approx([0.85, 0.70, 0.90])
    rows = {row[0]: row for row in bench_send.goal_lines([kafka, rabbit])}
    _what, median, low, high, _whole, cpu, verdict = rows[bench_send.GOALS[0][4]]
    assert (median, low, high) == pytest.approx((0.85, 0.70, 0.90))
    assert verdict == ">= 0.8: **met**"
    assert cpu == pytest.approx(5.33 / 6.67, abs=0.01)
    assert rows[bench_send.GOALS[1][4]][6] == ">= 0.9: **met**"  # compat: median 0.95
    rabbit_row = rows[bench_send.GOALS[2][4]]
    assert rabbit_row[1] == pytest.approx(0.96) and rabbit_row[6] == ">= 0.95: **met**"
    # Only the protocols measured have rows.
    assert len(rows) == 3


def test_the_section_is_written_with_figures_goals_and_the_command(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    readme.write_text(OTHER)
    args = bench_send.parse_args(["--rounds", "3", "--only", "kafka", "--only", "rabbitmq"])
    ids = {"str(uuid.uuid4())": 1.9, "msgsafe new_message_id()": 0.3}
    section = bench_send.report(
        _results(), args, "2026-11-27 10:00", "10:20", "load average 1.0 at the start", ids
    )
    replace_section(readme, section)
    text = readme.read_text()
    assert text.startswith(OTHER.rstrip("\n") + "\n\n## Per-message sends\n")
    assert "--rounds 3 --messages 20000 --blocking-messages 400 --block 20 --only kafka" in text
    assert "Measured 2026-11-27 10:00\u201310:20 UTC" in text
    assert "| kafka | msgsafe |" in text and "| rabbitmq | raw |" in text
    assert "| **0.85** | 0.70 .. 0.90 |" in text
    assert "str(uuid.uuid4()) 1.90 µs" in text
    assert "amqp10" not in text.split("## Per-message sends", 1)[1].split("Brokers:")[0]


def test_a_new_run_keeps_the_notes_written_for_the_last(tmp_path: Path) -> None:
    readme = tmp_path / "README.md"
    args = bench_send.parse_args(["--only", "rabbitmq"])
    first = bench_send.report(_results()[1:], args, "2026-11-27 10:00", "10:05", "load 1")
    readme.write_text(OTHER + "\n" + first + "\nReading these figures:\n\n- a note\n")
    second = bench_send.report(_results()[1:], args, "2026-11-28 11:00", "11:05", "load 2")
    replace_section(readme, second)
    text = readme.read_text()
    assert "Measured 2026-11-28 11:00" in text and "Measured 2026-11-27" not in text
    assert "(These notes were written for the run of 2026-11-27 10:00\u201310:05 UTC.)" in text
    assert text.rstrip().endswith("- a note")
