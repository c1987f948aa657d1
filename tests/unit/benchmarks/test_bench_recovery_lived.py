"""benchmarks/bench_recovery.py --lived-through: its table (no broker: the figures are
made up here)."""

from __future__ import annotations

from benchmarks import bench_recovery


def profile(**given: float) -> dict[str, float]:
    labels = [label for _, _, label in bench_recovery._STEPS]
    base = dict.fromkeys(labels, 1.0)
    base.update(rounds=20, wall=40.0, cpu=6.0)
    base.update({"broker cpu": 20.0, "healthy cpu": 4.0, "healthy broker cpu": 18.0})
    base.update(given)
    return base


def test_each_run_is_a_row_with_its_own_ratio() -> None:
    runs = {
        "rabbitmq": [
            (32_000.0, 25_600.0, 0.2, profile(), "200,000 read"),
            (20_000.0, 10_000.0, 0.3, profile(wall=99.0), "199,999 read"),
        ]
    }
    lines = bench_recovery.lived_table(runs)
    rows = [line for line in lines if line.startswith("| rabbitmq |")]
    assert len(rows) == 2
    assert "| 32,000 msg/s | 25,600 msg/s | 0.80 | 0.20 s | 20 |" in rows[0]
    assert "| 0.50 | 0.30 s |" in rows[1] and "| 99.0 |" in rows[1]
    assert "| 4.0 / 6.0 | 18.0 / 20.0 | 199,999 read |" in rows[1]
    header = next(line for line in lines if line.startswith("| protocol |"))
    separator = lines[lines.index(header) + 1]
    assert header.count("|") == separator.count("|") == rows[0].count("|")
