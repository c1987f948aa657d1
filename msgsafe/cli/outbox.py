"""``msgsafe outbox status|list|quarantine|drain|replay|purge PATH``: inspect and operate
an outbox file.

The file belongs to one process at a time: while a producer holds it these commands exit
with :class:`~msgsafe.errors.OutboxLocked` (code 3) instead of interleaving with it.
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Literal

import typer
from rich.markup import escape
from rich.table import Table

from msgsafe.adapters import open_transport
from msgsafe.cli._output import (
    ExitCode,
    err,
    exit_with,
    fail,
    out,
    parse_pairs,
    print_json,
    translate_errors,
)
from msgsafe.endpoints import parse_url
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox

__all__ = ["app"]

app = typer.Typer(
    help="Inspect and operate an outbox file (messages waiting for their broker).",
    no_args_is_help=True,
)

PathArg = Annotated[Path, typer.Argument(help="The outbox file (SQLite).")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON instead of tables.")]
LimitOpt = Annotated[int, typer.Option(help="Rows to show at most.")]
IdsArg = Annotated[list[str] | None, typer.Argument(help="Message ids (or --all).")]
AllOpt = Annotated[bool, typer.Option("--all", help="Every quarantined message.")]


@contextmanager
def _opened(path: Path, as_json: bool) -> Iterator[SqliteOutbox]:
    if not path.is_file():
        fail(f"no outbox file at {path}", as_json=as_json)
    with translate_errors(as_json=as_json):
        store = SqliteOutbox(path)
        try:
            yield store
        finally:
            store.close()


def _key(envelope: Envelope) -> str | None:
    return None if envelope.key is None else envelope.key.decode(errors="replace")


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
def status(path: PathArg, as_json: JsonOpt = False) -> None:
    """Depth, bytes, oldest age and quarantined count."""
    with _opened(path, as_json) as store:
        stats = store.stats()
        first = store.list(limit=1)
        target = first[0].target if first else None
    data = {
        "path": str(path),
        "target": target,
        "waiting": stats.depth,
        "bytes": stats.bytes,
        "oldest_age_s": stats.oldest_age_s,
        "quarantined": stats.quarantined,
    }
    if as_json:
        print_json(data)
        return
    table = Table(title=escape(f"outbox {path}"), show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("target", escape(target or "-"))
    table.add_row("waiting", str(stats.depth))
    table.add_row("bytes", str(stats.bytes))
    age = "-" if stats.oldest_age_s is None else f"{stats.oldest_age_s:.1f} s"
    table.add_row("oldest waiting", age)
    table.add_row("quarantined", str(stats.quarantined))
    out.print(table)


@app.command(name="list")
def list_(path: PathArg, limit: LimitOpt = 50, offset: int = 0, as_json: JsonOpt = False) -> None:
    """Waiting messages in queue order."""
    with _opened(path, as_json) as store:
        entries = store.list(limit=limit, offset=offset)
    now = time.time()
    rows = [
        {
            "message_id": e.envelope.message_id,
            "destination": e.envelope.destination,
            "key": _key(e.envelope),
            "size": e.envelope.size,
            "attempts": e.attempts,
            "ready_in_s": max(0.0, e.ready_at - now) if e.ready_at else 0.0,
            "created_at": _when(e.envelope.created_at),
            "last_error": e.last_error,
        }
        for e in entries
    ]
    if as_json:
        print_json(rows)
        return
    _print_table(
        f"waiting in {path}",
        ("message id", "destination", "key", "size", "attempts", "ready in", "error"),
        [
            (
                str(row["message_id"]),
                str(row["destination"]),
                str(row["key"] or "-"),
                str(row["size"]),
                str(row["attempts"]),
                f"{row['ready_in_s']:.1f} s",
                str(row["last_error"] or "-"),
            )
            for row in rows
        ],
    )


@app.command()
def quarantine(
    path: PathArg, limit: LimitOpt = 50, offset: int = 0, as_json: JsonOpt = False
) -> None:
    """Messages moved aside after a permanent error, with that error."""
    with _opened(path, as_json) as store:
        entries = store.quarantined(limit=limit, offset=offset)
    rows = [
        {
            "message_id": e.envelope.message_id,
            "destination": e.envelope.destination,
            "key": _key(e.envelope),
            "attempts": e.attempts,
            "error": e.error,
            "quarantined_at": _when(e.quarantined_at),
        }
        for e in entries
    ]
    if as_json:
        print_json(rows)
        return
    _print_table(
        f"quarantined in {path}",
        ("message id", "destination", "key", "attempts", "when", "error"),
        [
            (
                str(row["message_id"]),
                str(row["destination"]),
                str(row["key"] or "-"),
                str(row["attempts"]),
                str(row["quarantined_at"]),
                str(row["error"]),
            )
            for row in rows
        ],
    )


@app.command()
def replay(
    path: PathArg, ids: IdsArg = None, all_: AllOpt = False, as_json: JsonOpt = False
) -> None:
    """Move quarantined messages back to the end of the queue."""
    selected = _selection(ids, all_)
    with _opened(path, as_json) as store:
        moved = store.replay(selected)
    if as_json:
        print_json({"replayed": moved})
    else:
        out.print(f"{moved} message(s) moved back to the queue")


@app.command()
def purge(
    path: PathArg,
    ids: IdsArg = None,
    all_: AllOpt = False,
    waiting: Annotated[
        bool, typer.Option("--waiting", help="Also delete messages still waiting to be sent.")
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete quarantined messages (and with --waiting, waiting ones) for good."""
    selected = _selection(ids, all_)
    what = "every quarantined" if selected == "all" else f"{len(selected)} quarantined"
    if waiting:
        what += " and waiting (never sent!)"
    if not yes and not typer.confirm(f"Delete {what} message(s) in {path} for good?", err=True):
        err.print("nothing deleted")
        exit_with(ExitCode.ERROR)
    with _opened(path, as_json) as store:
        deleted = store.purge(selected, waiting=waiting)
    if as_json:
        print_json({"purged": deleted})
    else:
        out.print(f"{deleted} message(s) deleted")


@app.command()
def drain(
    path: PathArg,
    url: Annotated[str, typer.Option(help="Broker URL to forward to.")],
    timeout: Annotated[float, typer.Option(help="Seconds to keep trying.")] = 30.0,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Forward the waiting messages to URL now; exit 1 if some remain after --timeout."""
    options = dict(parse_pairs(option, "--option"))
    with _opened(path, as_json) as store, translate_errors(as_json=as_json):
        broker = parse_url(url)
        first = store.list(limit=1)
        if first and first[0].target and first[0].target != broker.redacted():
            err.print(
                f"note: the messages were stored for {first[0].target}; "
                f"forwarding them to {broker.redacted()}",
                markup=False,
            )
        before = store.pending()
        transport = open_transport(broker, options)
        forwarder = Forwarder(store, transport)
        try:
            remaining = forwarder.drain(timeout)
            stats = forwarder.stats()
        finally:
            transport.close(10.0)
    data = {
        "before": before,
        "delivered": stats.delivered,
        "remaining": remaining,
        "quarantined": stats.quarantined,
        "last_error": stats.last_error,
    }
    if as_json:
        print_json(data)
    else:
        out.print(
            f"{stats.delivered} delivered, {remaining} remaining, "
            f"{stats.quarantined} quarantined"
            + (f" (last error: {stats.last_error})" if stats.last_error and remaining else ""),
            markup=False,
        )
    exit_with(ExitCode.LOSS if remaining else ExitCode.OK)


def _selection(ids: list[str] | None, all_: bool) -> list[str] | Literal["all"]:
    if all_ and ids:
        raise typer.BadParameter("give message ids or --all, not both")
    if not all_ and not ids:
        raise typer.BadParameter("give message ids or --all")
    return "all" if all_ else list(ids or [])


def _print_table(title: str, columns: Sequence[str], cells: Iterable[Sequence[str]]) -> None:
    # Every cell is text from the store (ids, keys, errors): escaped, never rich markup.
    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in cells:
        table.add_row(*map(escape, row))
    out.print(table)
