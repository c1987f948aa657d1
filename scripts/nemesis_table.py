"""The nemesis evidence table: run seeds, print one Markdown table.

    python3 scripts/nemesis_table.py --minutes 3 --dir D qpid:1234 artemis:5678

runs ``msgsafe nemesis KIND --minutes 3 --seed S --dir D/KIND-S`` for each ``KIND:SEED``,
one after another (progress on stderr; ``--outbox postgres`` for the shared PostgreSQL
outbox with forwarders, ``--nodes N`` for another cluster size), and prints a row per run
(:mod:`msgsafe.nemesis.table`); ``--from D/qpid-1234 ...`` adds the rows of runs already
made (their ``report.json``) without running anything. Exit 0 only when every run passed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from msgsafe.nemesis.runner import Plan, run
from msgsafe.nemesis.table import table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="*", help="KIND:SEED to run")
    parser.add_argument("--minutes", type=float, default=3.0)
    parser.add_argument("--outbox", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--nodes", type=int, default=0, help="broker nodes (0: the kind's)")
    parser.add_argument("--dir", type=Path, default=Path("nemesis-runs"))
    parser.add_argument(
        "--from", dest="done", type=Path, nargs="*", default=[], help="run dirs already made"
    )
    args = parser.parse_args()
    reports = [json.loads((d / "report.json").read_text()) for d in args.done]
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
        reports.append(outcome.report())
    print(table(reports))
    return 0 if all(r["ok"] for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
