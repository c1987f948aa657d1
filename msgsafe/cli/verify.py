"""``msgsafe verify URL DESTINATION``: a loss checker to run while injecting faults.

A sequence-numbered producer writes ``--count`` messages over ``--keys`` streams
(message ``n`` goes to stream ``n % keys`` with sequence number ``n // keys``); a
verifying consumer reads them back and counts, per stream, what is lost (accepted and
never read), duplicated (read more than once) and out of order (read after a higher
sequence number of its stream). Exit 1 on any loss.

Sends that raised were never accepted, so they are not expected back; the report names
why they raised: each error type with its count and one example message (the human
report's table, ``errors`` in ``--json``, and INFO log lines).

The two halves can run apart (``--phase produce`` / ``--phase consume`` with the same
``--run``, ``--count`` and ``--keys``), so faults — or an operator deleting messages —
can happen between them.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    out,
    parse_pairs,
    print_json,
    translate_errors,
    url_param,
    with_options,
)
from msgsafe.cli._readback import start_at_beginning
from msgsafe.consumer import Consumer
from msgsafe.errors import AuthenticationError, ConnectError, MsgsafeError, ProtocolMismatch
from msgsafe.message import Receipt
from msgsafe.producer import Producer

__all__ = ["StreamCounts", "error_summary", "verify"]

log = logging.getLogger(__name__)

RUN_HEADER = "msgsafe-verify-run"
STREAM_HEADER = "msgsafe-verify-stream"
SEQ_HEADER = "msgsafe-verify-seq"


class Phase(StrEnum):
    both = "both"
    produce = "produce"
    consume = "consume"


@dataclass(slots=True)
class StreamCounts:
    """What one stream (key) looked like to the verifying consumer."""

    key: str
    expected: int = 0
    received: int = 0  #: distinct sequence numbers read
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    lost_seqs: list[int] = field(default_factory=list)


def _stream_key(run: str, index: int) -> str:
    return f"verify-{run}-{index}"


def error_summary(errors: Iterable[BaseException]) -> list[dict[str, object]]:
    """One entry per error type of ``errors``, the most frequent first (then by name):
    ``{"type": "Unroutable", "count": 200, "example": "no queue bound for 'q'"}``, the
    example being the first error of that type in ``errors``."""
    counts: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for exc in errors:
        name = type(exc).__name__
        counts[name] += 1
        examples.setdefault(name, str(exc))
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [{"type": name, "count": n, "example": examples[name]} for name, n in ranked]


def _said(errors: list[dict[str, object]]) -> str:
    """``200 Unroutable, 3 Rejected``: the error types, for one line of text."""
    return ", ".join(f"{e['count']} {e['type']}" for e in errors)


def verify(
    url: Annotated[str, typer.Argument(help=f"Broker URL. {URL_FORMS}", callback=url_param)],
    destination: Annotated[str, typer.Argument(help="Queue, topic or address to check.")],
    count: Annotated[int, typer.Option(help="Messages to produce (over all keys).")] = 1000,
    keys: Annotated[int, typer.Option(help="Streams (message keys), each numbered 0, 1, ...")] = 4,
    run: Annotated[
        str | None, typer.Option(help="Run id (default: random); ties the phases together.")
    ] = None,
    phase: Annotated[Phase, typer.Option(help="both, or only produce / consume.")] = Phase.both,
    group: Annotated[
        str | None,
        typer.Option(
            help="Consumer group (default: one per run, reading the destination from its "
            "beginning)."
        ),
    ] = None,
    timeout: Annotated[
        float,
        typer.Option(help="Stop consuming after this many seconds without a new message."),
    ] = 15.0,
    join_timeout: Annotated[
        float,
        typer.Option(
            help="Seconds allowed for the first message (joining a consumer group and a "
            "rebalance after a broker restart can take a while)."
        ),
    ] = 60.0,
    outbox: Annotated[
        Path | None, typer.Option(help="Producer outbox file (default: per broker).")
    ] = None,
    option: Annotated[
        list[str] | None, typer.Option("--option", "-o", help="Adapter option NAME=VALUE.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Produce sequence-numbered messages and check every one comes back.

    Prints lost, duplicated and out-of-order counts per key. Exit 0 when nothing was
    lost, 1 on any loss (or a failed send), 3 when it could not run.
    """
    if count < 1 or keys < 1:
        raise typer.BadParameter("--count and --keys must be >= 1")
    options = dict(parse_pairs(option, "--option"))
    run_id = run or secrets.token_hex(4)
    result: dict[str, object] = {"run": run_id, "destination": destination, "count": count}
    failed: dict[int, BaseException] = {}
    errors: list[dict[str, object]] = []
    with translate_errors(as_json=as_json):
        full_url = with_options(url, options)
        if phase is not Phase.consume:
            confirmed, stored, failed = _produce(
                url, destination, run_id, count, keys, outbox, options
            )
            errors = error_summary(failed[n] for n in sorted(failed))
            result.update(confirmed=confirmed, stored=stored, failed=len(failed), errors=errors)
            for e in errors:
                log.info(
                    "run %s: %s send(s) raised %s, e.g. %s",
                    run_id,
                    e["count"],
                    e["type"],
                    e["example"],
                )
            if not as_json:
                err.print(
                    f"run {run_id}: produced {count}: {confirmed} confirmed, {stored} stored, "
                    f"{len(failed)} failed" + (f" ({_said(errors)})" if errors else ""),
                    markup=False,
                )
                if errors:
                    _print_errors(errors)
        if phase is not Phase.produce:
            if group is None:
                group = f"msgsafe-verify-{run_id}"
                start_at_beginning(full_url, destination, group)
            streams, foreign = _consume(
                full_url,
                destination,
                run_id,
                count,
                keys,
                group,
                (join_timeout, timeout),
                failed,
            )
            result["streams"] = [asdict(s) for s in streams]
            result["foreign"] = foreign
            for name in ("lost", "duplicated", "out_of_order"):
                result[name] = sum(getattr(s, name) for s in streams)
            result["received"] = sum(s.received for s in streams)
            if result["received"] == 0 and result["lost"]:
                # Not one record of the run came back: more likely the read than the
                # messages (a group that never got its partitions, a wrong destination).
                result["note"] = (
                    f"nothing of run {run_id} was read back within --join-timeout "
                    f"({join_timeout:g} s); read it again with --phase consume --run {run_id} "
                    "(MSGSAFE_LOG_LEVEL=INFO shows what the consumer saw)"
                )
            if not as_json:
                _print_table(run_id, streams)
                if "note" in result:
                    err.print(str(result["note"]), markup=False)
    lost = int(str(result.get("lost", 0)))
    if as_json:
        print_json(result)
    elif phase is not Phase.produce:
        if lost:
            verdict = f"[bold red]lost = {lost}[/]"
        elif failed:
            # Messages whose send raised were never accepted: "lost = 0" would claim
            # more than was checked.
            verdict = (
                f"[bold red]{len(failed)} not accepted[/] "
                f"(send raised: {escape(_said(errors))}), none lost"
            )
        else:
            verdict = "[bold green]lost = 0[/]"
        out.print(
            f"run {escape(run_id)}: {result['received']} of {count} received, {verdict}, "
            f"{result['duplicated']} duplicated, {result['out_of_order']} out of order"
        )
    else:
        out.print(
            f"run {run_id}: produced; check with --phase consume --run {run_id}", markup=False
        )
    exit_with(ExitCode.LOSS if lost or failed else ExitCode.OK)


def _produce(
    url: str,
    destination: str,
    run: str,
    count: int,
    keys: int,
    outbox: Path | None,
    options: dict[str, str],
) -> tuple[int, int, dict[int, BaseException]]:
    """Produce the run; returns confirmed and stored counts and, by message number, the
    error of each send that raised (the caller was told: those are not expected back)."""
    spec: bool | Path = outbox if outbox is not None else True
    failed: dict[int, BaseException] = {}
    futures: list[Future[Receipt]] = []
    # The run's first message goes straight to the broker, without an outbox: a broker
    # that is down, refuses the login or speaks another protocol ends the command here
    # with that cause (exit 3), within connect_timeout, instead of a run of STORED
    # messages waiting for a drain and a table of zeros.
    first_confirmed = 1
    with Producer(with_options(url, options), outbox=False) as probe:
        try:
            probe.send(
                destination,
                json.dumps({"run": run, "stream": 0, "seq": 0}).encode(),
                key=_stream_key(run, 0),
                headers={RUN_HEADER: run, STREAM_HEADER: "0", SEQ_HEADER: "0"},
            )
        except (ConnectError, AuthenticationError, ProtocolMismatch):
            raise  # the broker cannot be used at all: the command cannot run
        except MsgsafeError as exc:
            # Refused or rejected, this message only: the caller was told, as for any
            # send that raised; the run goes on.
            failed[0] = exc
            first_confirmed = 0
    with Producer(with_options(url, options), outbox=spec, send_timeout=120.0) as producer:
        progress = Progress(TextColumn("producing"), BarColumn(), MofNCompleteColumn(), console=err)
        with progress:
            task = progress.add_task("produce", total=count)
            progress.advance(task)  # the first message, confirmed above
            for n in range(1, count):
                index, seq = n % keys, n // keys
                body = json.dumps({"run": run, "stream": index, "seq": seq}).encode()
                future = producer.send_async(
                    destination,
                    body,
                    key=_stream_key(run, index),
                    headers={RUN_HEADER: run, STREAM_HEADER: str(index), SEQ_HEADER: str(seq)},
                )
                future.add_done_callback(lambda _f: progress.advance(task))
                futures.append(future)
            producer.flush(180.0)
        producer.drain(timeout=60.0)
    confirmed, stored = first_confirmed, 0
    for n, future in enumerate(futures, start=1):
        try:
            receipt = future.result(0)
        except (MsgsafeError, TimeoutError) as exc:
            failed[n] = exc
            continue
        if receipt.status.value == "confirmed":
            confirmed += 1
        else:
            stored += 1
    return confirmed, stored, failed


def _consume(
    url: str,
    destination: str,
    run: str,
    count: int,
    keys: int,
    group: str,
    timeouts: tuple[float, float],
    failed: Mapping[int, BaseException],
) -> tuple[list[StreamCounts], int]:
    expected = [len(range(i, count, keys)) for i in range(keys)]
    #: (stream, seq) of sends that raised: the caller kept those, they are not expected.
    excused = {(n % keys, n // keys) for n in failed}
    total = count - len(failed)
    seen: list[Counter[int]] = [Counter() for _ in range(keys)]
    highest = [-1] * keys
    out_of_order = [0] * keys
    foreign = 0
    distinct = 0
    with Consumer(url, group=group) as consumer:
        consumer.subscribe(destination)
        join_timeout, timeout = timeouts
        started = time.monotonic()
        last: float | None = None  # when the last new message of this run arrived
        while distinct < total:
            now = time.monotonic()
            if (last is None and now - started >= join_timeout) or (
                last is not None and now - last >= timeout
            ):
                break
            for delivery in consumer.poll(0.5, max_messages=500):
                headers = delivery.headers
                if headers.get(RUN_HEADER) != run:
                    foreign += 1
                    delivery.ack()
                    continue
                try:
                    index, seq = int(headers[STREAM_HEADER]), int(headers[SEQ_HEADER])
                except (KeyError, ValueError):
                    foreign += 1
                    delivery.ack()
                    continue
                if 0 <= index < keys:
                    if seen[index][seq] == 0:
                        distinct += (index, seq) not in excused
                        if seq < highest[index]:
                            out_of_order[index] += 1
                        highest[index] = max(highest[index], seq)
                    seen[index][seq] += 1
                    last = time.monotonic()
                delivery.ack()
    streams = []
    for i in range(keys):
        lost = [s for s in range(expected[i]) if seen[i][s] == 0 and (i, s) not in excused]
        streams.append(
            StreamCounts(
                key=_stream_key(run, i),
                expected=expected[i],
                received=sum(1 for s in seen[i] if s < expected[i]),
                lost=len(lost),
                duplicated=sum(n - 1 for n in seen[i].values() if n > 1),
                out_of_order=out_of_order[i],
                lost_seqs=lost[:20],
            )
        )
    return streams, foreign


def _print_table(run: str, streams: list[StreamCounts]) -> None:
    table = Table(title=f"msgsafe verify — run {run}")
    for column in ("key", "expected", "received", "lost", "duplicated", "out of order"):
        table.add_column(column, justify="left" if column == "key" else "right")
    table.add_column("first lost seq")
    for s in streams:
        lost = f"[bold red]{s.lost}[/]" if s.lost else "0"
        table.add_row(
            escape(s.key),
            str(s.expected),
            str(s.received),
            lost,
            str(s.duplicated),
            str(s.out_of_order),
            ", ".join(map(str, s.lost_seqs[:5])) or "-",
        )
    out.print(table)


def _print_errors(errors: list[dict[str, object]]) -> None:
    table = Table(title="sends that raised (not accepted, not expected back)")
    table.add_column("error")
    table.add_column("count", justify="right")
    table.add_column("example", overflow="fold")
    for e in errors:
        table.add_row(escape(str(e["type"])), str(e["count"]), escape(str(e["example"])))
    out.print(table)
