"""``msgsafe send`` and ``msgsafe consume``: messages from and to a shell pipe.

``send`` turns each stdin line into one message and prints one receipt per line, in
input order; ``consume`` prints one body per line and acknowledges a message only after
its line was written and flushed (at-least-once: a crash before the flush redelivers).
"""

from __future__ import annotations

import base64
import json
import shlex
import sys
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Annotated

import typer

from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    out,
    parse_pairs,
    translate_errors,
    url_param,
    with_options,
)
from msgsafe.consumer import Consumer
from msgsafe.endpoints import parse_url
from msgsafe.errors import MsgsafeError
from msgsafe.message import Delivery, Receipt
from msgsafe.producer import Producer

__all__ = ["consume", "send"]

#: Receipts awaited at once; bounds memory however long the input is.
_WINDOW = 10_000

UrlArg = Annotated[
    str,
    typer.Argument(
        help=f"Broker URL, e.g. amqp://guest:guest@host:5672/%2F. {URL_FORMS}",
        callback=url_param,
    ),
]
DestArg = Annotated[str, typer.Argument(help="Queue, topic or address.")]
OptionOpt = Annotated[
    list[str] | None,
    typer.Option("--option", "-o", help="Adapter option NAME=VALUE (repeatable)."),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON lines instead of text.")]


def send(
    url: UrlArg,
    destination: DestArg,
    key: Annotated[str | None, typer.Option(help="Key of every message (ordering).")] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="Header NAME=VALUE (repeatable).")
    ] = None,
    outbox: Annotated[
        Path | None,
        typer.Option(help="Outbox file (default: one per broker in the user's data dir)."),
    ] = None,
    no_outbox: Annotated[
        bool, typer.Option("--no-outbox", help="Fail instead of storing when unconfirmed.")
    ] = False,
    send_timeout: Annotated[float, typer.Option(help="Seconds one send may take.")] = 30.0,
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send each stdin line as one message; print a receipt per line.

    Exit 0 when the broker confirmed every line; 7 when every line is safe but some only
    in the outbox (its path and the command that forwards it are printed: nothing
    forwards them once this command has exited); 1 when any send failed.
    """
    headers = dict(parse_pairs(header, "--header"))
    options = dict(parse_pairs(option, "--option"))
    spec: bool | Path = False if no_outbox else (outbox if outbox is not None else True)
    failed = 0
    counts = {"confirmed": 0, "stored": 0, "failed": 0}
    with translate_errors(as_json=as_json):
        producer = Producer(with_options(url, options), outbox=spec, send_timeout=send_timeout)
        where: Path | None = getattr(producer.outbox, "path", None)
        try:
            pending: deque[tuple[int, Future[Receipt]]] = deque()
            for number, raw in enumerate(sys.stdin.buffer, start=1):
                body = raw[:-1] if raw.endswith(b"\n") else raw
                pending.append(
                    (number, producer.send_async(destination, body, key=key, headers=headers))
                )
                while len(pending) >= _WINDOW:
                    failed += _report(*pending.popleft(), send_timeout, counts, as_json)
            while pending:
                failed += _report(*pending.popleft(), send_timeout, counts, as_json)
        finally:
            producer.close()
    if not as_json:
        err.print(
            f"{counts['confirmed']} confirmed, {counts['stored']} stored, {counts['failed']} failed"
        )
    if counts["stored"]:
        _tell_stored(counts["stored"], where, url)
    if failed:
        exit_with(ExitCode.LOSS)
    exit_with(ExitCode.STORED if counts["stored"] else ExitCode.OK)


def _tell_stored(stored: int, where: Path | None, url: str) -> None:
    """Say where the stored messages wait and how to forward them (on stderr, also with
    --json: stdout holds only receipts)."""
    if where is None:  # pragma: no cover - the command's outboxes are files
        err.print(f"{stored} message(s) wait in the outbox, not yet at the broker", markup=False)
        return
    command = f"msgsafe outbox drain {shlex.quote(str(where))}"
    try:
        secret = parse_url(url).password is not None
    except MsgsafeError:  # pragma: no cover - the producer parsed it already
        secret = False
    if secret:
        # The outbox keeps no credentials; the broker will ask for them.
        command += " --url URL"
    err.print(
        f"{stored} message(s) are only in the outbox {where}, not at the broker yet; "
        "nothing forwards them now that this command ends (a later send to the same "
        f"broker does). Forward them with: {command}",
        markup=False,
    )


def _report(
    number: int,
    future: Future[Receipt],
    timeout: float,
    counts: dict[str, int],
    as_json: bool,
) -> int:
    try:
        receipt = future.result(timeout)
    except MsgsafeError as exc:
        counts["failed"] += 1
        if as_json:
            error = f"{type(exc).__name__}: {exc}"
            _json_line({"line": number, "status": "failed", "error": error})
        else:
            out.print(f"failed    line {number}: {type(exc).__name__}: {exc}", markup=False)
        return 1
    except TimeoutError:
        counts["failed"] += 1
        if as_json:
            _json_line({"line": number, "status": "failed", "error": "SendTimeout"})
        else:
            out.print(f"failed    line {number}: not confirmed or stored in time", markup=False)
        return 1
    counts[receipt.status.value] += 1
    if as_json:
        _json_line(
            {"line": number, "message_id": receipt.message_id, "status": receipt.status.value}
        )
    else:
        out.print(f"{receipt.status.value:<9} {receipt.message_id}", markup=False)
    return 0


def consume(
    url: UrlArg,
    destination: DestArg,
    count: Annotated[int | None, typer.Option(help="Stop after this many messages.")] = None,
    group: Annotated[str | None, typer.Option(help="Consumer group / shared queue.")] = None,
    timeout: Annotated[
        float | None, typer.Option(help="Stop after this many seconds without a message.")
    ] = None,
    dedup: Annotated[bool, typer.Option(help="Drop copies of messages already seen.")] = True,
    option: OptionOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Print each message's body on its own line (JSON lines with --json), acknowledging
    it once written."""
    options = dict(parse_pairs(option, "--option"))
    if count is not None and count < 1:
        raise typer.BadParameter("--count must be >= 1")
    seen = 0
    with (
        translate_errors(as_json=as_json),
        Consumer(with_options(url, options), group=group, dedup=dedup) as consumer,
    ):
        consumer.subscribe(destination)
        last = time.monotonic()
        while count is None or seen < count:
            wait = 1.0 if timeout is None else max(0.0, min(1.0, last + timeout - time.monotonic()))
            want = 64 if count is None else min(64, count - seen)
            batch = consumer.poll(wait, max_messages=want)
            if not batch:
                if timeout is not None and time.monotonic() - last >= timeout:
                    break
                continue
            last = time.monotonic()
            for delivery in batch:
                _write(delivery, as_json)
                delivery.ack()
                seen += 1
    if not as_json:
        err.print(f"{seen} consumed")
    exit_with(ExitCode.OK)


def _write(delivery: Delivery, as_json: bool) -> None:
    if as_json:
        try:
            body: dict[str, str] = {"body": delivery.body.decode()}
        except UnicodeDecodeError:
            body = {"body_base64": base64.b64encode(delivery.body).decode()}
        _json_line(
            {
                "message_id": delivery.message_id,
                "key": None if delivery.key is None else delivery.key.decode(errors="replace"),
                "headers": dict(delivery.headers),
                "redelivered": delivery.redelivered,
                **body,
            }
        )
        return
    sys.stdout.buffer.write(delivery.body + b"\n")
    sys.stdout.buffer.flush()


def _json_line(data: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(data, sort_keys=True) + "\n")
    sys.stdout.flush()
