"""``msgsafe outbox status|list|quarantine|drain|replay|purge|salvage``: inspect and
operate outboxes (``watch``, the live view, is :mod:`msgsafe.cli.outbox_watch`).

Every command but ``salvage`` also takes a ``postgresql://`` URL in place of the file
(the table a fleet shares, ``?table=`` as for the producer): the same figures and
operations on that table while producers and forwarders use it; the URL is shown
without its password. The URL, and ``--url``, may be ``env:NAME`` or ``@PATH``
(read from an environment variable or a file: no password in ``ps``).

``status`` with no path lists every default outbox (the user's data directory) with its
destination and waiting count. A file belongs to one process at a time: while a producer
holds it these commands exit with :class:`~msgsafe.errors.OutboxLocked` (code 3) instead
of interleaving with it. Message ids that a file does not hold are errors (code 2), and
nothing is changed. ``drain`` forwards to the destination the rows name; ``--url`` only
supplies what rows never store (credentials).
"""

from __future__ import annotations

import datetime as dt
import shlex
import sys
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal, TypeAlias

import typer
from rich.markup import escape
from rich.table import Table

from msgsafe.adapters import destination_check, open_transport
from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    fail,
    out,
    parse_pairs,
    print_json,
    print_table,
    secret_url,
    translate_errors,
)
from msgsafe.endpoints import BrokerUrl, parse_url
from msgsafe.errors import AuthenticationError, ConnectError, OutboxLocked
from msgsafe.message import Envelope
from msgsafe.outbox import Forwarder, SqliteOutbox
from msgsafe.outbox._pg_url import is_store_url, parse_store_url
from msgsafe.outbox.destination import destination_of, destination_of_target
from msgsafe.outbox.discovery import default_dir, find_outboxes
from msgsafe.outbox.salvage import salvage as salvage_file
from msgsafe.ports import Transport, transport_capabilities

if TYPE_CHECKING:
    from msgsafe.outbox.postgres import PostgresOutbox

    #: What these commands operate: an outbox file, or a PostgreSQL outbox table.
    OperatedStore: TypeAlias = SqliteOutbox | PostgresOutbox

__all__ = ["PathArg", "app", "broker_for", "label", "opened"]

app = typer.Typer(
    help=(
        "Inspect and operate outboxes (messages waiting for their broker): a SQLite "
        "file, or a PostgreSQL table given by its postgresql:// URL. "
        "`msgsafe outbox status` with no argument lists every default outbox file."
    ),
    no_args_is_help=True,
)

#: What every command's store argument says it takes.
STORE_HELP = f"The outbox: a SQLite file, or a postgresql:// URL (its table). {URL_FORMS}"
PathArg = Annotated[Path, typer.Argument(help=STORE_HELP)]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON instead of tables.")]
LimitOpt = Annotated[int, typer.Option(help="Rows to show at most.")]
IdsArg = Annotated[list[str] | None, typer.Argument(help="Message ids (or --all).")]
AllOpt = Annotated[bool, typer.Option("--all", help="Every quarantined message.")]
YesOpt = Annotated[
    bool, typer.Option("--yes", "-y", help="Do not ask (needed when stdin is not a terminal).")
]


def _spec(path: Path) -> str:
    # A Path collapses the URL's // into /: made a URL again.
    from msgsafe.cli.outbox_forward import store_spec

    return store_spec(str(path))


def label(path: Path) -> str:
    """How ``path`` is shown: the file, or the PostgreSQL URL without its password."""
    spec = _spec(path)
    return parse_store_url(spec).redacted if is_store_url(spec) else str(path)


@contextmanager
def opened(path: Path, as_json: bool) -> Iterator[OperatedStore]:
    """The store ``path`` names, closed on exit: the SQLite file (exit 1 when missing or
    held by a producer), or the PostgreSQL table of a ``postgresql://`` URL (shared: it
    is operated on beside the fleet using it)."""
    spec = _spec(path)
    if is_store_url(spec):
        with translate_errors(as_json=as_json):
            from msgsafe.outbox.postgres import PostgresOutbox  # the optional extra

            pg = PostgresOutbox.from_url(spec)
        try:
            yield pg
        finally:
            pg.close()
        return
    if not path.is_file():
        fail(f"no outbox file at {path}", as_json=as_json)
    with translate_errors(as_json=as_json):
        try:
            store = SqliteOutbox(path)
        except OutboxLocked as exc:
            # NOTE: the owner opens the file in SQLite's exclusive locking mode: not even
            # a reader gets in beside it, so no command can read it from outside.
            fail(
                f"{exc}. That process forwards it: read its figures there "
                "(Producer.stats(), or the OpenTelemetry metrics msgsafe.outbox.depth, "
                "msgsafe.outbox.oldest_age and msgsafe.outbox.drained), or run this command "
                "once the process has stopped.",
                as_json=as_json,
            )
        try:
            yield store
        finally:
            store.close()


def _key(envelope: Envelope) -> str | None:
    return None if envelope.key is None else envelope.key.decode(errors="replace")


def _when(epoch: float) -> str:
    return dt.datetime.fromtimestamp(epoch, dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


@app.command()
def status(
    path: Annotated[
        Path | None,
        typer.Argument(help=f"{STORE_HELP} None: every default outbox file, one line each."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Depth, bytes, oldest age and quarantined count of one outbox (a SQLite file or a
    postgresql:// table); with no PATH, every default outbox file with its destination
    and waiting count."""
    if path is None:
        _status_all(as_json)
        return
    with opened(path, as_json) as store:
        stats = store.stats()
        first = store.list(limit=1)
        target = first[0].target if first else None
    data = {
        "path": label(path),
        "target": target,
        "waiting": stats.depth,
        "bytes": stats.bytes,
        "oldest_age_s": stats.oldest_age_s,
        "quarantined": stats.quarantined,
        "estimated": stats.estimated,
    }
    if as_json:
        print_json(data)
        return
    table = Table(title=escape(f"outbox {label(path)}"), show_header=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("target", escape(target or "-"))
    about = "~" if stats.estimated else ""  # a big PostgreSQL table: estimated
    table.add_row("waiting", f"{about}{stats.depth}")
    table.add_row("bytes", f"{about}{stats.bytes}")
    age = "-" if stats.oldest_age_s is None else f"{stats.oldest_age_s:.1f} s"
    table.add_row("oldest waiting", age)
    table.add_row("quarantined", str(stats.quarantined))
    out.print(table)


def _status_all(as_json: bool) -> None:
    # Targets come from the rows, which never hold credentials.
    folder = default_dir()
    found = find_outboxes(folder)
    rows = [
        {
            "path": str(f.path),
            "destination": None if f.destination is None else f.destination.key,
            "target": f.target,
            "waiting": f.waiting,
            "quarantined": f.quarantined,
            "state": f.state,
            "error": f.error,
        }
        for f in found
    ]
    if as_json:
        print_json(rows)
        return
    if not rows:
        out.print(f"no outbox files in {folder}", markup=False)
        return
    print_table(
        f"outboxes in {folder}",
        ("file", "destination", "waiting", "quarantined", "state"),
        [
            (
                Path(str(row["path"])).name,
                str(row["destination"] or "-"),
                "-" if row["waiting"] is None else str(row["waiting"]),
                "-" if row["quarantined"] is None else str(row["quarantined"]),
                str(row["state"]) + (f": {row['error']}" if row["error"] else ""),
            )
            for row in rows
        ],
    )


@app.command(name="list")
def list_(path: PathArg, limit: LimitOpt = 50, offset: int = 0, as_json: JsonOpt = False) -> None:
    """Waiting messages in queue order."""
    with opened(path, as_json) as store:
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
    print_table(
        f"waiting in {label(path)}",
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
    with opened(path, as_json) as store:
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
    print_table(
        f"quarantined in {label(path)}",
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
    """Move quarantined messages back to the end of the queue. An id that is not in the
    quarantine is an error (exit 2) and nothing moves."""
    selected = _selection(ids, all_)
    with opened(path, as_json) as store:
        if selected != "all":
            _require(store, selected, path, ("quarantined",), as_json)
        moved = store.replay(selected)
    if as_json:
        print_json({"replayed": moved})
    else:
        out.print(f"{moved} message(s) moved back to the queue")


@app.command()
def purge(
    path: PathArg,
    ids: Annotated[
        list[str] | None,
        typer.Argument(help="Message ids, waiting or quarantined (or a flag below)."),
    ] = None,
    waiting: Annotated[
        bool, typer.Option("--waiting", help="Every waiting message (never sent!).")
    ] = False,
    quarantined: Annotated[
        bool, typer.Option("--quarantined", help="Every quarantined message.")
    ] = False,
    all_: Annotated[
        bool, typer.Option("--all", help="Every message: waiting and quarantined.")
    ] = False,
    yes: YesOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Delete messages for good: the given ids, or --waiting, --quarantined or --all.

    Asks first; with stdin not a terminal it refuses (exit 2) unless --yes is given.
    An id the outbox does not hold is an error (exit 2) and nothing is deleted.
    """
    scoped = waiting or quarantined or all_
    if scoped and ids:
        raise typer.BadParameter("give message ids or --waiting/--quarantined/--all, not both")
    if not scoped and not ids:
        raise typer.BadParameter("give message ids, or --waiting, --quarantined or --all")
    if all_:
        waiting = quarantined = True
    if ids:
        what = f"{len(ids)} message(s)"
        waiting = quarantined = True
    elif waiting and quarantined:
        what = "every waiting (never sent!) and quarantined message"
    else:
        what = "every waiting (never sent!) message" if waiting else "every quarantined message"
    with opened(path, as_json) as store:
        if ids:
            _require(store, ids, path, ("waiting", "quarantined"), as_json)
        _confirm(f"Delete {what} in {label(path)} for good?", yes, as_json)
        deleted = store.purge(ids or "all", waiting=waiting, quarantined=quarantined)
    if as_json:
        print_json({"purged": deleted})
    else:
        out.print(f"{deleted} message(s) deleted")


def _require(
    store: OperatedStore,
    ids: Sequence[str],
    path: Path,
    places: tuple[str, ...],
    as_json: bool,
) -> None:
    """Exit 2 naming every id of ``ids`` that is not in one of ``places``."""
    found = store.locate(ids)
    missing = [i for i in ids if found.get(i) not in places]
    if not missing:
        return
    where = " or ".join(places)
    shown = ", ".join(missing[:10]) + (
        f" and {len(missing) - 10} more" if len(missing) > 10 else ""
    )
    elsewhere = {i: found[i] for i in missing if i in found}
    note = "; ".join(f"{i} is {place}" for i, place in list(elsewhere.items())[:3])
    fail(
        f"{len(missing)} id(s) not {where} in {label(path)}: {shown}"
        + (f" ({note})" if note else "")
        + "; nothing was changed",
        ExitCode.USAGE,
        as_json=as_json,
    )


def _confirm(question: str, yes: bool, as_json: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        fail(
            "not deleting without confirmation: stdin is not a terminal; add --yes",
            ExitCode.USAGE,
            as_json=as_json,
        )
    if not typer.confirm(question, err=True):
        err.print("nothing deleted")
        exit_with(ExitCode.ERROR)


@app.command()
def drain(
    path: PathArg,
    url: Annotated[
        str | None,
        typer.Option(
            help="Broker URL; default: the one the messages were stored for. Give it when "
            "the broker needs credentials (the outbox never stores them)."
        ),
    ] = None,
    timeout: Annotated[float, typer.Option(help="Seconds to keep trying.")] = 30.0,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Forward the waiting messages now, to the broker they were stored for (or URL).

    Exit 0 when nothing waits and the quarantine is empty; 1 when messages still wait
    after --timeout (how many, and the last error); 8 when nothing waits but the
    quarantine holds messages (a permanent error each: a name the protocol refuses, a
    rejection), with the commands that list and replay them."""
    options = dict(parse_pairs(option, "--option"))
    with opened(path, as_json) as store, translate_errors(as_json=as_json):
        before = store.pending()
        if url is None and before == 0:
            _report_drain(path, before, 0, 0, store.stats().quarantined, 0, None, as_json)
            return
        broker = broker_for(store, path, url, as_json)
        transport = open_transport(broker, options)
        guard = _LoginGuard(transport)
        moved = [0]  # messages this drain quarantined

        def quarantined(_envelope: Envelope, _text: str) -> None:
            moved[0] += 1

        forwarder = Forwarder(
            store,
            guard,
            # A stored name the protocol refuses (a file older than the check) is
            # quarantined, whichever transport would have taken it.
            admit=destination_check(broker.protocol),
            on_quarantine=quarantined,
        )
        try:
            remaining = _forward(forwarder, guard, timeout)
            stats = forwarder.stats()
        except AuthenticationError as exc:
            fail(
                f"AuthenticationError: {exc}; nothing was quarantined. The outbox keeps no "
                f"credentials: give them with --url, e.g. msgsafe outbox drain "
                f"{shlex.quote(label(path))} --url 'amqp://USER:PASSWORD@...'",
                as_json=as_json,
            )
        finally:
            transport.close(10.0)
    _report_drain(
        path,
        before,
        stats.delivered,
        remaining,
        stats.quarantined,
        moved[0],
        stats.last_error,
        as_json,
    )


def broker_for(store: OperatedStore, path: Path, url: str | None, as_json: bool) -> BrokerUrl:
    """Where ``store``'s messages go: ``url``, or the broker the rows were stored for
    (a note when the two differ; exit 3 when neither names one)."""
    # pending() is estimated beyond 100,000 rows (PostgreSQL): past the end, the first.
    newest = store.list(limit=1, offset=max(0, store.pending() - 1)) or store.list(limit=1)
    stored_for = newest[0].target if newest else None
    if url is None and not stored_for:
        fail(f"the messages in {label(path)} name no broker; give --url", as_json=as_json)
    broker = parse_url(secret_url(url, "--url") if url else stored_for or "")
    if stored_for and destination_of_target(stored_for) != destination_of(broker):
        err.print(
            f"note: the messages were stored for {stored_for}; "
            f"forwarding them to {broker.redacted()}",
            markup=False,
        )
    return broker


class _LoginGuard:
    """The transport as the drain's forwarder sees it: a refused login fails a publish
    transiently (the message is released, not quarantined: the login, not the message,
    is wrong) and is remembered for :func:`_forward` to stop on. A
    :class:`~msgsafe.ports.Transport` of its own, wrapping ``transport``."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport
        #: What the wrapped transport declares, but no optional method (batch, callback,
        #: ...): every message must pass through :meth:`publish` to be watched. What the
        #: wire does (tombstones, ordered_rounds) holds through it.
        self.capabilities = transport_capabilities(transport).publish_only()
        self.refused: AuthenticationError | None = None

    @property
    def target(self) -> str:
        return self._transport.target

    def publish(self, envelope: Envelope) -> Future[None]:
        outcome: Future[None] = Future()

        def settle(done: Future[None]) -> None:
            exc = done.exception()
            if isinstance(exc, AuthenticationError):
                self.refused = exc
                outcome.set_exception(ConnectError(f"AuthenticationError: {exc}"))
            elif exc is not None:
                outcome.set_exception(exc)
            else:
                outcome.set_result(None)

        self._transport.publish(envelope).add_done_callback(settle)
        return outcome

    def close(self, timeout: float | None = None) -> None:
        """Close the wrapped transport."""
        self._transport.close(timeout)


def _forward(forwarder: Forwarder, guard: _LoginGuard, timeout: float) -> int:
    """Drain for up to ``timeout`` s, stopping at a refused login."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = forwarder.drain(min(0.5, max(0.0, deadline - time.monotonic())))
        if guard.refused is not None:
            raise guard.refused
        if remaining == 0 or time.monotonic() >= deadline:
            return remaining


def _report_drain(
    path: Path,
    before: int,
    delivered: int,
    remaining: int,
    quarantined: int,
    newly_quarantined: int,
    last_error: str | None,
    as_json: bool,
) -> None:
    """Print what a drain did and exit: 1 while messages wait, 8 when only the
    quarantine holds some, 0 when the outbox is empty (see :func:`drain`)."""
    code = ExitCode.LOSS if remaining else ExitCode.QUARANTINED if quarantined else ExitCode.OK
    data = {
        "before": before,
        "delivered": delivered,
        "remaining": remaining,
        "quarantined": quarantined,
        "newly_quarantined": newly_quarantined,
        "last_error": last_error,
        "exit_code": int(code),
    }
    if as_json:
        print_json(data)
        exit_with(code)
    shown = (remaining or newly_quarantined) and last_error
    out.print(
        f"{delivered} delivered, {remaining} remaining, {quarantined} quarantined"
        + (f" (last error: {last_error})" if shown else ""),
        markup=False,
    )
    where = shlex.quote(label(path))
    if remaining:
        err.print(
            f"error: {remaining} message(s) still wait in {label(path)}"
            + (f" ({last_error})" if last_error else "")
            + f"; nothing was lost: run msgsafe outbox drain {where} again once the "
            "broker takes them (msgsafe outbox list shows each one's last error)",
            markup=False,
        )
    elif quarantined:
        err.print(
            f"note: {quarantined} message(s) are in the quarantine"
            + (f", {newly_quarantined} moved there by this drain" if newly_quarantined else "")
            + f", not delivered: see why with msgsafe outbox quarantine {where}; once the "
            f"cause is fixed, msgsafe outbox replay {where} --all puts them back in line, "
            f"or msgsafe outbox purge {where} --quarantined deletes them (an "
            "InvalidDestination is never delivered: its name is the cause)",
            markup=False,
        )
    exit_with(code)


@app.command()
def salvage(
    path: Annotated[Path, typer.Argument(help="The damaged outbox file (only read).")],
    to: Annotated[
        Path | None,
        typer.Option("--to", help="The new outbox file; default: PATH with .salvaged added."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Copy every intact message of a damaged outbox file into a new file, and report
    how many were copied and what could not be read. PATH is left as it was."""
    target = to if to is not None else path.with_name(f"{path.stem}.salvaged{path.suffix}")
    with translate_errors(as_json=as_json):
        report = salvage_file(path, target)
    data = {
        "source": str(report.source),
        "target": str(report.target),
        "waiting": report.waiting,
        "quarantined": report.quarantined,
        "pages": report.pages,
        "damaged_pages": report.damaged_pages,
        "damaged_records": report.damaged_records,
        "wal": report.wal,
    }
    if as_json:
        print_json(data)
        return
    out.print(
        f"copied {report.waiting} waiting and {report.quarantined} quarantined message(s) "
        f"to {report.target}; skipped {report.damaged_pages} damaged page(s) and "
        f"{report.damaged_records} unreadable record(s) of {report.pages} page(s) "
        f"(write-ahead log: {report.wal}); {report.source} was left as it was.\n"
        f"Move the damaged file aside, then forward the messages with: "
        f"msgsafe outbox drain {shlex.quote(str(report.target))}",
        markup=False,
    )


def _selection(ids: list[str] | None, all_: bool) -> list[str] | Literal["all"]:
    if all_ and ids:
        raise typer.BadParameter("give message ids or --all, not both")
    if not all_ and not ids:
        raise typer.BadParameter("give message ids or --all")
    return "all" if all_ else list(ids or [])
