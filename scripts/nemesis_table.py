"""The nemesis evidence table: run seeds, print one Markdown table.

    python3 scripts/nemesis_table.py --minutes 3 --dir D qpid:1234 artemis:5678

runs ``msgsafe nemesis KIND --minutes 3 --seed S --dir D/KIND-S`` for each ``KIND:SEED``,
one after another (progress on stderr; ``--outbox postgres`` for the shared PostgreSQL
outbox with forwarders, ``--nodes N`` for another cluster size), and prints a row per run
(:mod:`msgsafe.nemesis.table`); ``--from D/qpid-1234 ...`` adds the rows of runs already
made (a run's directory, its ``report.json``, or a kept report) without running anything.
``--keep K`` writes each new run's report, with the commit it ran at, to
``K/KIND-SEED[-postgres]-Mm.json`` (docs/evidence/nemesis/ keeps the long runs, so their
table is printed again with ``--from docs/evidence/nemesis/*.json``). Exit 0 only when
every run passed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from msgsafe.nemesis.runner import Plan, run
from msgsafe.nemesis.table import table


def _git(*args: str) -> str:
    here = Path(__file__).resolve().parent
    done = subprocess.run(
        ["git", "-C", str(here), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def _commit() -> str | None:
    """The checkout's commit (with "+" when it has changes), None outside one."""
    try:
        head = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+" if dirty else "")


def _read(done: Path) -> dict[str, Any]:
    report: dict[str, Any] = json.loads(
        (done / "report.json" if done.is_dir() else done).read_text()
    )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="KIND:SEED to run")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--outbox", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--nodes", type=int, default=0, help="broker nodes (0: the kind's)")
    parser.add_argument("--dir", type=Path, default=Path("nemesis-runs"))
    parser.add_argument(
        "--from",
        dest="done",
        type=Path,
        nargs="*",
        default=[],
        help="runs already made: their directories or report files",
    )
    parser.add_argument("--keep", type=Path, help="write each new run's report here")
    args = parser.parse_args()
    reports = [_read(d) for d in args.done]
    commit = _commit() if args.runs else None
    suffix = "" if args.outbox == "sqlite" else f"-{args.outbox}"
    for spec in args.runs:
        kind, _, seed = spec.partition(":")
        plan = Plan(
            kind=kind,
            minutes=args.minutes,
            seed=int(seed),
            dir=(args.dir / (spec.replace(":", "-") + suffix)).resolve(),
            nodes=args.nodes,
            outbox=args.outbox,
        )
        outcome = run(plan, say=lambda line: print(line, file=sys.stderr, flush=True))
        report = outcome.report()
        if commit is not None:
            report["commit"] = commit
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            name = f"{plan.dir.name}-{args.minutes:g}m.json"
            (args.keep / name).write_text(json.dumps(report, indent=1) + "\n")
        reports.append(report)
    print(table(reports))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
