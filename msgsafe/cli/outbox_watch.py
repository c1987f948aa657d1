"""``msgsafe outbox watch PATH``: a live view of one outbox while it is forwarded.

The view refreshes every ``--interval`` seconds: how many messages wait and their bytes,
the age of the oldest, the quarantine, how many were delivered and at what rate (over
the last few seconds), when the rest should be gone at that rate, the broker's state
(forwarding, or refusing with its last error) and the waiting count per destination.

A ``postgresql://`` URL watches (and forwards, beside the fleet) the table it names.
An outbox file belongs to one process at a time (see :mod:`msgsafe.outbox.sqlite`):
``watch`` forwards the file itself, as ``drain`` does, to the broker its rows name (or
``--url``). A file a producer holds cannot be watched from outside: that process reads
the same figures from ``Producer.stats()`` or its OpenTelemetry metrics.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import Annotated, Protocol

import typer
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from msgsafe.adapters import destination_check, open_transport
from msgsafe.cli._output import URL_FORMS, out, parse_pairs, translate_errors
from msgsafe.cli.outbox import PathArg, broker_for, label, opened
from msgsafe.outbox import Forwarder
from msgsafe.ports import OutboxStats, Transport

__all__ = ["Sample", "Sampler", "render", "watch"]

#: Seconds of history the drain rate is measured over.
_RATE_WINDOW_S = 5.0


@dataclass(frozen=True, slots=True)
class Sample:
    """One refresh of the view."""

    path: str
    target: str | None  #: where the messages go (no credentials), None when not forwarding
    waiting: int
    bytes: int
    oldest_age_s: float | None
    quarantined: int
    delivered: int  #: by this watch since it started
    rate: float | None  #: delivered per second over the last seconds (None: too early)
    refusing: bool
    last_error: str | None
    per_destination: tuple[tuple[str, int], ...]


class WatchedStore(Protocol):
    """What a watch reads of a store (:class:`~msgsafe.outbox.SqliteOutbox` and
    :class:`~msgsafe.outbox.postgres.PostgresOutbox` both have it)."""

    def stats(self) -> OutboxStats: ...

    def destinations(self, limit: int = 20) -> list[tuple[str, int]]: ...


class Sampler:
    """Takes :class:`Sample` s of a store (and of the forwarder draining it); ``name``
    is how the store is shown (default: its file's path)."""

    def __init__(
        self,
        store: WatchedStore,
        forwarder: Forwarder | None,
        target: str | None,
        name: str | None = None,
    ):
        self._store = store
        self._forwarder = forwarder
        self._target = target
        self._path = name if name is not None else str(getattr(store, "path", "?"))
        self._history: deque[tuple[float, int, int]] = deque()

    def take(self) -> Sample:
        now = time.monotonic()
        stats = self._store.stats()
        forwarded = self._forwarder.stats() if self._forwarder is not None else None
        delivered = forwarded.delivered if forwarded is not None else 0
        history = self._history
        history.append((now, delivered, stats.depth))
        while len(history) > 2 and now - history[1][0] >= _RATE_WINDOW_S:
            history.popleft()
        rate = None
        first_at, first_delivered, first_depth = history[0]
        if now - first_at >= 0.5:
            done = delivered - first_delivered if forwarded else first_depth - stats.depth
            rate = max(0, done) / (now - first_at)
        return Sample(
            path=self._path,
            target=self._target,
            waiting=stats.depth,
            bytes=stats.bytes,
            oldest_age_s=stats.oldest_age_s,
            quarantined=stats.quarantined,
            delivered=delivered,
            rate=rate,
            refusing=forwarded.refusing if forwarded is not None else False,
            last_error=forwarded.last_error if forwarded is not None else None,
            per_destination=tuple(self._store.destinations(limit=10)),
        )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def render(sample: Sample) -> RenderableType:
    """The view of one sample (a pure function of it)."""
    table = Table(
        title=escape(f"outbox {sample.path}"),
        caption=escape(f"-> {sample.target}") if sample.target else "not forwarding",
        show_header=False,
        min_width=48,
    )
    table.add_column("what", style="bold")
    table.add_column("value", justify="right")
    waiting_style = "green" if sample.waiting == 0 else "yellow"
    table.add_row("waiting", Text(f"{sample.waiting:,}", style=waiting_style))
    table.add_row("bytes", f"{sample.bytes:,}")
    table.add_row("oldest", _age(sample.oldest_age_s))
    quarantine_style = "red" if sample.quarantined else ""
    table.add_row("quarantined", Text(f"{sample.quarantined:,}", style=quarantine_style))
    table.add_row("delivered", f"{sample.delivered:,}")
    rate = "-" if sample.rate is None else f"{sample.rate:,.0f} msg/s"
    table.add_row("drain rate", rate)
    if sample.rate and sample.waiting:
        table.add_row("empty in", _age(sample.waiting / sample.rate))
    if sample.target is not None:
        state = (
            Text(f"refusing: {sample.last_error or '?'}", style="red")
            if sample.refusing
            else Text("forwarding", style="green")
        )
        table.add_row("broker", state)
    if not sample.per_destination:
        return table
    per = Table(title="waiting per destination", min_width=48)
    per.add_column("destination")
    per.add_column("waiting", justify="right")
    for destination, count in sample.per_destination:
        per.add_row(escape(destination), f"{count:,}")
    return Group(table, per)


def watch(
    path: PathArg,
    url: Annotated[
        str | None,
        typer.Option(
            help=f"Broker URL; default: the one the messages were stored for. {URL_FORMS}"
        ),
    ] = None,
    interval: Annotated[float, typer.Option(help="Seconds between refreshes.")] = 1.0,
    forward: Annotated[
        bool, typer.Option("--forward/--no-forward", help="Forward while watching.")
    ] = True,
    until_empty: Annotated[
        bool, typer.Option("--until-empty", help="Stop once nothing waits.")
    ] = False,
    duration: Annotated[
        float | None, typer.Option("--for", help="Stop after this many seconds.")
    ] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
) -> None:
    """A live view of an outbox while it is forwarded: waiting, oldest, quarantined,
    drain rate, per-destination counts. Ctrl-C stops (what waits stays in the file)."""
    options = dict(parse_pairs(option, "--option"))
    with opened(path, False) as store, translate_errors():
        transport: Transport | None = None
        forwarder: Forwarder | None = None
        target: str | None = None
        if forward and (url is not None or store.pending()):
            broker = broker_for(store, path, url, False)
            target = broker.redacted()
            transport = open_transport(broker, options)
            forwarder = Forwarder(store, transport, admit=destination_check(broker.protocol))
            forwarder.start()
        try:
            _show(Sampler(store, forwarder, target, label(path)), interval, until_empty, duration)
        finally:
            if forwarder is not None:
                forwarder.stop(10.0)
            if transport is not None:
                transport.close(10.0)


def _show(sampler: Sampler, interval: float, until_empty: bool, duration: float | None) -> None:
    from rich.live import Live

    deadline = None if duration is None else time.monotonic() + duration
    sample = sampler.take()
    try:
        with Live(render(sample), console=out, auto_refresh=False) as live:
            while True:
                if until_empty and sample.waiting == 0:
                    break
                if deadline is not None and time.monotonic() >= deadline:
                    break
                # A refresh period, not a synchronisation: the view shows what is there.
                time.sleep(interval)
                sample = sampler.take()
                live.update(render(sample), refresh=True)
    except KeyboardInterrupt:
        pass
