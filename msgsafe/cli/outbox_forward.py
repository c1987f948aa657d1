"""``msgsafe outbox forward STORE --url BROKER_URL``: a forwarder process.

STORE is a SQLite outbox file or a ``postgresql://`` URL (a table a fleet shares: any
number of producers and ``forward`` processes on it, one forwarder per key at a time; see
:mod:`msgsafe.outbox._pg_leases`). The command forwards until SIGTERM or SIGINT, then
stops gracefully: the round in flight is settled (confirmed rows deleted, the rest
released) before it exits 0. ``--until-empty`` exits once the store holds no waiting
message. Every ``--interval`` seconds a status line goes to stderr (``--json``: one JSON
object per line on stdout, ``"event": "status"``), and a summary at the end (``"event":
"done"``). On PostgreSQL it is woken by LISTEN/NOTIFY when rows are put, and polls once
a second besides (for leases that ran out); behind a pooler in transaction mode, where
LISTEN cannot work, it only polls.

``--url`` gives the broker with its credentials (the store never keeps them); without
it, the broker the newest waiting row names. STORE and ``--url`` may name where the URL
is instead of holding it, so that no password shows in ``ps``: ``env:NAME`` (an
environment variable) or ``@PATH`` (the first line of a file).

``last_error`` in the events is the error this run saw since its last delivery (None
once a message went through after it, unless the broker still refuses), with
``last_error_at``: the UTC time it was first seen. A broker that refuses the login keeps every
message waiting (the forwarder retries at its capped backoff; the status line shows the
error) instead of quarantining anything.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import typer

from msgsafe.adapters import destination_check, open_transport
from msgsafe.cli._output import (
    URL_FORMS,
    err,
    fail,
    parse_pairs,
    print_json,
    secret_url,
    translate_errors,
    url_param,
)
from msgsafe.endpoints import parse_url
from msgsafe.outbox import Forwarder, ForwarderStats, SqliteOutbox
from msgsafe.outbox._pg_url import is_store_url
from msgsafe.ports import OutboxStore

__all__ = ["forward", "store_spec"]


#: With ``--until-empty``, fewer waiting messages than this are asked about every 0.2 s;
#: more, every second.
_ASK_OFTEN_BELOW = 10_000


def store_spec(given: str) -> str:
    """``given`` as the user meant it: ``env:NAME`` or ``@PATH`` read (see
    :func:`~msgsafe.cli._output.secret_url`), and a PostgreSQL URL whose ``//`` a Path
    turned into ``/`` made a URL again."""
    given = secret_url(given, "the outbox")
    for scheme in ("postgresql:", "postgres:"):
        if given.startswith(scheme + "/") and not given.startswith(scheme + "//"):
            return scheme + "//" + given[len(scheme) + 1 :]
    return given


def open_any(spec: str) -> tuple[OutboxStore, str]:
    """The store ``spec`` names and how to show it (no password)."""
    if is_store_url(spec):
        from msgsafe.outbox.postgres import PostgresOutbox  # the optional extra

        pg = PostgresOutbox.from_url(spec)
        return pg, pg.redacted
    path = Path(spec).expanduser()
    if not path.is_file():
        raise typer.BadParameter(f"no outbox file at {path}")
    return SqliteOutbox(path), str(path)


def _broker(store: Any, url: str | None) -> str:
    if url is not None:
        return url
    newest = store.list(limit=1)
    if not newest or not newest[0].target:
        raise typer.BadParameter("the store names no broker (no waiting row): give --url")
    return str(newest[0].target)


def forward(
    store: Annotated[
        str,
        typer.Argument(help=f"The outbox: a SQLite file or a postgresql:// URL; {URL_FORMS}"),
    ],
    url: Annotated[
        str | None,
        typer.Option(
            help=f"Broker URL with credentials; default: the one the rows name. {URL_FORMS}",
            callback=url_param,
        ),
    ] = None,
    until_empty: Annotated[
        bool, typer.Option("--until-empty", help="Exit once no message waits.")
    ] = False,
    interval: Annotated[float, typer.Option(help="Seconds between status lines.")] = 1.0,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines on stdout.")] = False,
) -> None:
    """Forward an outbox (SQLite file or postgresql:// URL) until SIGTERM, or with
    --until-empty until nothing waits; a status line every --interval seconds."""
    options = dict(parse_pairs(option, "--option"))
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    try:
        with translate_errors(as_json=as_json):
            opened, shown = open_any(store_spec(store))
            try:
                broker = parse_url(_broker(opened, url))
                transport = open_transport(broker, options)
                # The store's own lease where it declares one (Forwarder reads it); a
                # stored name the protocol refuses is quarantined, as drain does.
                forwarder = Forwarder(opened, transport, admit=destination_check(broker.protocol))
                try:
                    # Woken by the store's NOTIFY where it declares one (Forwarder.start).
                    forwarder.start()
                    errors = _RecentError()
                    reason = _loop(forwarder, stop, until_empty, interval, shown, as_json, errors)
                    forwarder.stop(60.0)
                    stats = forwarder.stats()
                    last_error, last_error_at = errors.sample(stats)
                finally:
                    forwarder.stop(60.0)
                    transport.close(10.0)
            finally:
                opened.close()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = {
        "event": "done",
        "store": shown,
        "target": broker.redacted(),
        "delivered": stats.delivered,
        "waiting": stats.depth,
        "quarantined": stats.quarantined,
        "last_error": last_error,
        "last_error_at": last_error_at,
        "seconds": round(time.monotonic() - started, 3),
        "stopped_by": reason,
    }
    if as_json:
        print_json(summary)
    else:
        err.print(
            f"forwarded {stats.delivered} in {summary['seconds']} s; {stats.depth} waiting, "
            f"{stats.quarantined} quarantined (stopped: {reason})",
            markup=False,
        )


class _RecentError:
    """The forwarder's last error as far as it still matters: the one seen since the
    last delivery, with the UTC time this run first saw it. An error followed by a
    delivery is past (None), unless the broker still refuses. Sampled by the status
    loop and once at the end."""

    def __init__(self) -> None:
        self._error: str | None = None
        self._at: str | None = None
        self._delivered_then = 0

    def sample(self, stats: ForwarderStats) -> tuple[str | None, str | None]:
        """``(last_error, last_error_at)`` for an event built from ``stats``."""
        if stats.last_error != self._error:
            self._error = stats.last_error
            self._at = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            self._delivered_then = stats.delivered
        if self._error is None or (stats.delivered > self._delivered_then and not stats.refusing):
            return None, None
        return self._error, self._at


def _loop(
    forwarder: Forwarder,
    stop: threading.Event,
    until_empty: bool,
    interval: float,
    shown: str,
    as_json: bool,
    errors: _RecentError,
) -> str:
    """Status lines until a signal (``"signal"``) or, with ``until_empty``, until nothing
    waits (``"empty"``)."""
    if interval <= 0:
        fail("--interval must be > 0")
    last_at, last_count = time.monotonic(), 0
    waiting = 0
    while True:
        # NOTE: a big backlog is asked about once a second, not five times: counting
        # it (up to 100,000 rows on PostgreSQL) takes the store's connection from the
        # forwarder's claims, and such a backlog does not empty in a second.
        pause = 0.2 if waiting < _ASK_OFTEN_BELOW else 1.0
        if stop.wait(min(interval, pause) if until_empty else interval):
            return "signal"
        now = time.monotonic()
        # A status line's figures answer --until-empty too (its depth follows the same
        # rule as pending()): on a big PostgreSQL backlog each question reads up to
        # 100,000 rows on the forwarder's own connection, so it is asked once, not twice.
        stats = forwarder.stats() if now - last_at >= interval else None
        if until_empty:
            waiting = forwarder.pending() if stats is None else stats.depth
            if waiting == 0:
                return "empty"
        if stats is None:
            continue
        last_error, last_error_at = errors.sample(stats)
        rate = (stats.delivered - last_count) / (now - last_at)
        last_at, last_count = now, stats.delivered
        line = {
            "event": "status",
            "store": shown,
            "delivered": stats.delivered,
            "rate": round(rate, 1),
            "waiting": stats.depth,
            "quarantined": stats.quarantined,
            "refusing": stats.refusing,
            "last_error": last_error,
            "last_error_at": last_error_at,
        }
        if as_json:
            print_json(line)
        else:
            state = f"refusing: {last_error}" if stats.refusing else "forwarding"
            err.print(
                f"{stats.delivered} delivered ({rate:.0f}/s), {stats.depth} waiting, "
                f"{stats.quarantined} quarantined, {state}",
                markup=False,
            )
