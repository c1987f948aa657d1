"""``msgsafe nemesis KIND``: randomized, composed faults on a real cluster, with a checker.

Starts a KIND cluster (as ``msgsafe cluster up``), producer processes with outboxes and a
consumer, applies the faults a schedule drawn from ``--seed`` gives, heals, drains, reads
back and checks (:mod:`msgsafe.nemesis.runner`). Progress on stderr; the report on stdout
(``--json``: one object). Exit 0 only when every invariant holds (lost = 0, unexpected =
0, per-key order, outboxes empty after the heal, and no fault action or worker failed);
1 when one does not; 3 when the run could not start (a broker not installed).

``--outbox postgres``: the producers share one PostgreSQL outbox (a primary and a
synchronous standby) drained by ``--forwarders`` ``msgsafe outbox forward`` processes,
and the schedule adds the primary's SIGKILL with the standby's promotion, and forwarder
SIGKILL and SIGSTOP past its lease.

Run as root with the SQLite outbox, each producer's outbox is on a tmpfs of its own and
the schedule adds a full disk under one (``--no-disk-faults``: not). On Kafka, RabbitMQ
and Qpid it adds leadership moved on purpose (a reassignment and a preferred election; a
drained node; a transfer of mastership).
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from msgsafe.cli._output import ExitCode, err, exit_with, fail, out, print_json
from msgsafe.cluster.base import ClusterError
from msgsafe.nemesis.runner import KINDS, OUTBOXES, Plan, run

__all__ = ["nemesis"]


def _kind(value: str) -> str:
    if value not in KINDS:
        raise typer.BadParameter(f"unknown kind {value!r} (known: {', '.join(sorted(KINDS))})")
    return value


def _outbox(value: str) -> str:
    if value not in OUTBOXES:
        raise typer.BadParameter(f"unknown outbox {value!r} (known: {', '.join(OUTBOXES)})")
    return value


def nemesis(
    kind: Annotated[
        str, typer.Argument(help=f"One of: {', '.join(sorted(KINDS))}.", callback=_kind)
    ],
    minutes: Annotated[
        float, typer.Option("--minutes", min=0.25, help="How long faults are applied.")
    ] = 2.0,
    seed: Annotated[
        int | None, typer.Option("--seed", help="The schedule's seed (random if omitted).")
    ] = None,
    dir: Annotated[
        Path | None,
        typer.Option("--dir", help="Where the history, report and picture go (a new temp dir)."),
    ] = None,
    producers: Annotated[int, typer.Option("--producers", min=1, help="Producer processes.")] = 3,
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, help="Broker nodes (default: 3; Artemis: a pair)."),
    ] = None,
    outbox: Annotated[
        str,
        typer.Option(
            "--outbox",
            callback=_outbox,
            help="sqlite: an outbox file per producer; postgres: one shared PostgreSQL "
            "outbox (primary + standby) drained by forwarder processes, with database "
            "and forwarder faults.",
        ),
    ] = "sqlite",
    forwarders: Annotated[
        int,
        typer.Option("--forwarders", min=1, help="Forwarder processes (--outbox postgres)."),
    ] = 2,
    disk_faults: Annotated[
        bool | None,
        typer.Option(
            "--disk-faults/--no-disk-faults",
            help="Each producer's SQLite outbox on a size-limited tmpfs, filled by disk "
            "faults (default: when run as root with the SQLite outbox).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run producers and a consumer against a KIND cluster under randomized, composed
    faults (broker SIGKILL/SIGSTOP, producer SIGKILL/SIGSTOP, network faults through a proxy),
    then heal, drain, read back and check that no receipted message was lost; as root,
    a full disk under a producer's outbox (a size-limited tmpfs), and where the brokers
    allow it (Kafka, RabbitMQ, Qpid) leadership moved on purpose.

    --outbox postgres: the producers share a PostgreSQL outbox (primary + synchronous
    standby) that --forwarders `msgsafe outbox forward` processes drain; faults add the
    primary's SIGKILL with the standby promoted, and a forwarder SIGKILLed or SIGSTOPped
    past its lease.

    The same --seed replays the same schedule; the report prints the command. The run's
    directory keeps the history (history/*.jsonl), report.json, picture.svg (send rate,
    confirm latency, outbox depth and unseen messages over time, faults shaded) and, when
    the run fails, the brokers' logs and data (cluster/) and the workers' logs (logs/);
    cluster/ also when its outboxes took over a minute to be empty after a fault ended."""
    if disk_faults and outbox != "sqlite":
        raise typer.BadParameter(
            "disk faults fill a producer's SQLite outbox: not with --outbox postgres"
        )
    chosen = seed if seed is not None else secrets.randbelow(2**31)
    where = dir if dir is not None else Path(tempfile.mkdtemp(prefix=f"msgsafe-nemesis-{kind}-"))
    plan = Plan(
        kind=kind,
        minutes=minutes,
        seed=chosen,
        dir=where.resolve(),
        producers=producers,
        nodes=nodes or 0,
        outbox=outbox,
        forwarders=forwarders,
        disk_faults=disk_faults,
    )
    try:
        outcome = run(plan, say=lambda line: err.print(line, markup=False, highlight=False))
    except ClusterError as exc:
        fail(f"the cluster could not be run: {str(exc).splitlines()[0]}", as_json=as_json)
    report = outcome.report()
    if as_json:
        print_json(report)
    else:
        v = outcome.verdict
        recovery = "never" if v.recovery_s is None else f"{v.recovery_s:.1f} s"
        worst = "never" if v.worst_recovery_s is None else f"{v.worst_recovery_s:.1f} s"
        out.print(
            f"{kind} seed {chosen} ({outbox} outbox): {len(outcome.schedule.windows)} faults; "
            f"attempted={v.attempted} receipted={v.receipted} (confirmed {v.confirmed}, "
            f"stored {v.stored}) failed={v.failed} (refused {v.refused}, in doubt "
            f"{v.in_doubt}, of which arrived {v.in_doubt_arrived}) "
            f"cut_short={v.cut_short} "
            f"received={v.received}",
            markup=False,
        )
        out.print(
            f"lost={v.lost} unexpected={v.unexpected} denied={v.denied} "
            f"duplicates={v.duplicates} "
            f"order_violations={v.order_violations} recovery={recovery} "
            f"(the slowest after any fault: {worst})",
            markup=False,
        )
        for problem in v.problems() + outcome.notes:
            out.print(f"[red]FAIL[/red] {escape(problem)}")
        out.print(f"{'[green]ok[/green]' if outcome.ok else '[red]failed[/red]'}: {where}")
        out.print(f"picture: {where / 'picture.svg'}", markup=False)
        out.print(f"replay: {report['replay']}", markup=False)
    exit_with(ExitCode.OK if outcome.ok else ExitCode.LOSS)
