"""The evidence table of nemesis runs, one Markdown row per run's ``report.json``
(what docs/evidence/reliability.md shows; ``scripts/nemesis_table.py`` runs the seeds
and prints it)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

__all__ = ["HEADER", "row", "table"]

HEADER = (
    "| kind | seed | minutes | faults (broker / producer / network) | receipted "
    "(confirmed / stored) | received | lost | unexpected | duplicates | order violations "
    "| recovery s (last / slowest) | ok | run (UTC, commit) |\n"
    "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|---|"
)


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f}"


def row(report: dict[str, Any]) -> str:
    """One table row from a run's ``report.json``."""
    plan, v = report["plan"], report["verdict"]
    roles = Counter(w["role"] for w in report["schedule"]["windows"])
    faults = f"{report['faults']} ({roles['broker']} / {roles['producer']} / {roles['network']}"
    kind = plan["kind"]
    more: list[str] = []
    if plan.get("outbox", "sqlite") != "sqlite":
        # The shared outbox's own roles, and the outbox named with the kind.
        more += [f"database {roles['database']}", f"forwarder {roles['forwarder']}"]
        kind += f" + {plan['outbox']} outbox"
    # The roles drawn since the first tables (a full disk, a leader moved), when drawn.
    more += [f"{role} {roles[role]}" for role in ("disk", "leader") if roles[role]]
    faults += (f"; {', '.join(more)}" if more else "") + ")"
    return (
        f"| {kind} | {plan['seed']} | {plan['minutes']:g} | {faults} | "
        f"{v['receipted']} ({v['confirmed']} / {v['stored']}) | {v['received']} | "
        f"{v['lost']} | {v['unexpected']} | {v['duplicates']} | {v['order_violations']} | "
        f"{_seconds(v['recovery_s'])} / {_seconds(v['worst_recovery_s'])} | "
        f"{'yes' if report['ok'] else 'NO'} | {_when(report)} |"
    )


def _when(report: dict[str, Any]) -> str:
    """When the run ended and at which commit (what scripts/nemesis_table.py adds), as
    far as the report says."""
    finished = report.get("finished") or "?"
    commit = report.get("commit")
    return f"{finished}, {commit}" if commit else finished


def table(reports: Iterable[dict[str, Any]]) -> str:
    """The Markdown table of ``reports``."""
    return "\n".join([HEADER, *(row(r) for r in reports)])
