"""The chaos suite's repetitions and its summary table.

``MSGSAFE_CHAOS_REPEAT=N`` (default 1) runs every cell N times (the ``chaos_rep``
parameter). At the end of the run the figures of every cell are aggregated into
``.msgsafe-run/chaos-summary.md`` (and ``.json``), which is also printed.

Regenerate the table of docs/evidence/reliability.md::

    MSGSAFE_CHAOS_REPEAT=3 python3 -m pytest tests/chaos -m chaos
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from pathlib import Path

import pytest

from tests.chaos._matrix import RESULTS, CellResult

#: Where the summary goes; ``MSGSAFE_CHAOS_SUMMARY_DIR`` overrides it (parallel runs).
SUMMARY_DIR = Path(
    os.environ.get("MSGSAFE_CHAOS_SUMMARY_DIR")
    or Path(__file__).resolve().parents[2] / ".msgsafe-run"
)
_ORDER = ["rabbitmq", "kafka", "amqp10"]


def _repeat() -> int:
    raw = os.environ.get("MSGSAFE_CHAOS_REPEAT", "1")
    try:
        value = int(raw)
    except ValueError:
        raise pytest.UsageError(f"MSGSAFE_CHAOS_REPEAT must be an integer, not {raw!r}") from None
    if value < 1:
        raise pytest.UsageError("MSGSAFE_CHAOS_REPEAT must be >= 1")
    return value


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "chaos_rep" in metafunc.fixturenames:
        metafunc.parametrize("chaos_rep", range(_repeat()), ids=lambda r: f"rep{r}")


def summary_markdown(results: list[CellResult]) -> str:
    """The table: one row per protocol x fault, figures summed over repetitions."""
    groups: dict[tuple[str, str], list[CellResult]] = {}
    for r in results:
        groups.setdefault((r.protocol, r.fault), []).append(r)

    def order(item: tuple[str, str]) -> tuple[int, int]:
        proto = item[0]
        first = next(i for i, r in enumerate(results) if (r.protocol, r.fault) == item)
        return (_ORDER.index(proto) if proto in _ORDER else 99, first)

    lines = [
        "| protocol | fault | runs | sent | receipted (confirmed / stored) | not receipted "
        "| received | lost | duplicates | recover s (median / max) | slowest send s |",
        "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for key in sorted(groups, key=order):
        rs = groups[key]
        refused: dict[str, int] = {}
        for r in rs:
            for k, v in r.refused.items():
                refused[k] = refused.get(k, 0) + v
        recover = [r.recover_s for r in rs]
        lines.append(
            f"| {key[0]} | {key[1]} | {len(rs)} | {sum(r.sent for r in rs)} "
            f"| {sum(r.receipted for r in rs)} ({sum(r.confirmed for r in rs)} / "
            f"{sum(r.stored for r in rs)}) "
            f"| {', '.join(f'{k} {v}' for k, v in sorted(refused.items())) or '0'} "
            f"| {sum(r.received for r in rs)} | {sum(r.lost for r in rs)} "
            f"| {sum(r.duplicates for r in rs)} "
            f"| {statistics.median(recover):.1f} / {max(recover):.1f} "
            f"| {max(r.max_send_s for r in rs):.2f} |"
        )
    return "\n".join(lines) + "\n"


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not RESULTS:
        return
    SUMMARY_DIR.mkdir(parents=True, exist_ok=True)
    table = summary_markdown(RESULTS)
    (SUMMARY_DIR / "chaos-summary.md").write_text(table)
    (SUMMARY_DIR / "chaos-summary.json").write_text(
        json.dumps([dataclasses.asdict(r) for r in RESULTS], indent=1)
    )
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_sep("=", f"chaos summary ({SUMMARY_DIR / 'chaos-summary.md'})")
        reporter.write(table)
