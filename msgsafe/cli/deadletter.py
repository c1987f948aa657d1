"""``msgsafe deadletter list|show|replay|purge``: look at and act on the dead letters
``Consumer.run(dead_letter=DEST)`` sent (:mod:`msgsafe.consuming.dead_letter`).

Reading never removes anything: the dead letters are received and given back (on
RabbitMQ and AMQP 1.0 held unsettled, then released: on AMQP 1.0 a read raises no
delivery count, so reading often never makes a broker with a delivery limit move a dead
letter on; on Kafka read from the beginning by a throwaway group that commits nothing).
A dead letter is named by its original message id (``x-msgsafe-dlq-message-id``), or
its own id when it has none.

``replay`` sends each chosen dead letter, with its ORIGINAL message id, through a
msgsafe Producer to its origin (``x-msgsafe-dlq-source``) or ``--to``; the dead letter
is acknowledged (removed) only after the replay's receipt (CONFIRMED or STORED), and
given back when the send fails. On Kafka nothing can be removed: the audit log records
the replay. ``purge`` acknowledges chosen dead letters; on Kafka it refuses.

Exit codes: 0 done; 1 a replay failed (its dead letter stays); 2 bad usage, an id
that is not there (nothing is changed), or purge on Kafka; 3 the broker could not be
reached or the destination does not exist.
"""

from __future__ import annotations

import base64
import datetime as dt
import getpass
import json
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import platformdirs
import typer

from msgsafe.checks import inspector_for
from msgsafe.cli._output import (
    URL_FORMS,
    ExitCode,
    err,
    exit_with,
    fail,
    out,
    print_json,
    print_table,
    translate_errors,
    url_param,
    with_options,
)
from msgsafe.consumer import Consumer
from msgsafe.consuming.dead_letter import (
    DEAD_LETTER_HEADERS,
    DLQ_AT,
    DLQ_ATTEMPTS,
    DLQ_ERROR,
    DLQ_ERROR_TYPE,
    DLQ_MESSAGE_ID,
    DLQ_SOURCE,
)
from msgsafe.endpoints import parse_url, traits
from msgsafe.errors import MsgsafeError
from msgsafe.message import Delivery, Status
from msgsafe.producer import Producer

__all__ = [
    "REPLAYED_AT",
    "REPLAYED_BY",
    "REPLAYED_FROM",
    "app",
    "default_audit_file",
    "list_",
    "purge",
    "reading_options",
    "replay",
    "show",
]

app = typer.Typer(
    help=(
        "Look at and act on dead letters (messages whose handler kept failing, sent "
        "aside by Consumer.run(dead_letter=DEST)): list, show, replay, purge."
    ),
    no_args_is_help=True,
)

REPLAYED_BY = "x-msgsafe-replayed-by"  #: the OS user who replayed the message
REPLAYED_AT = "x-msgsafe-replayed-at"  #: when, ISO-8601 in UTC
REPLAYED_FROM = "x-msgsafe-replayed-from"  #: the dead-letter destination it came from
#: The dead-letter headers kept on a replay, renamed: the history of the failure.
_KEPT_AS_REPLAYED = {
    DLQ_ATTEMPTS: "x-msgsafe-replayed-attempts",
    DLQ_ERROR_TYPE: "x-msgsafe-replayed-error-type",
}

#: The first read's wait on Kafka, where a new group must be assigned partitions first.
_KAFKA_JOIN_S = 15.0
#: Error text in ``list`` is cut to this many characters.
_ERROR_SHOWN = 60
#: ``show`` prints at most this many characters of a body unless --full.
_BODY_SHOWN = 4096

UrlOpt = Annotated[
    str,
    typer.Option(
        "--url", help=f"Broker URL of the dead-letter destination. {URL_FORMS}", callback=url_param
    ),
]
DestArg = Annotated[str, typer.Argument(help="The dead-letter queue, topic or address.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="JSON lines instead of tables.")]
WaitOpt = Annotated[
    float,
    typer.Option(help="Seconds without a new message after which all were read."),
]
SearchOpt = Annotated[int, typer.Option("--limit", help="Dead letters to read at most.")]
IdsOpt = Annotated[
    list[str] | None, typer.Option("--id", help="A dead letter's message id (repeatable).")
]
AllOpt = Annotated[bool, typer.Option("--all", help="Every dead letter.")]


@dataclass(slots=True)
class _Read:
    """What a read found: the deliveries (unsettled) and whether that is all."""

    deliveries: list[Delivery]
    complete: bool
    #: The destination is a log (Kafka): nothing read is removed or given back.
    log: bool


def _id_of(delivery: Delivery) -> str:
    """A dead letter's name: its original message id, else its own."""
    return delivery.headers.get(DLQ_MESSAGE_ID) or delivery.message_id or ""


def _matches(delivery: Delivery, wanted: str) -> bool:
    return wanted in (delivery.headers.get(DLQ_MESSAGE_ID), delivery.message_id)


def reading_options(protocol: str, limit: int) -> dict[str, str]:
    """The adapter options of a read of up to ``limit`` dead letters: every message read
    is held unsettled until the end, so the broker must hand out as many at once."""
    # NOTE: the AMQP 1.0 receiver tops its credit up only as deliveries are settled:
    # with the default window a read stopped at 100 and passed for "that is all".
    known = traits(protocol)
    if not known.unsettled_option:
        return {}
    most = limit if known.unsettled_max is None else min(limit, known.unsettled_max)
    return {known.unsettled_option: str(most)}


@contextmanager
def _reading(url: str, destination: str, limit: int, wait: float, as_json: bool) -> Iterator[_Read]:
    """Read up to ``limit`` dead letters of ``destination``, held unsettled; on exit
    every one not settled by the caller is given back (released, uncounted; on Kafka
    nothing is committed). Exits 3 when the broker cannot be reached or ``destination`` does not
    exist."""
    broker = parse_url(url)
    log = traits(broker.protocol).log
    with translate_errors(as_json=as_json):
        report = inspector_for(broker, {})(destination)
    if any(f.setting == "exists" and f.value == "no" for f in report.findings):
        fail(f"{destination} does not exist at {broker.redacted()}", as_json=as_json)
    options = reading_options(broker.protocol, limit)
    # NOTE: a throwaway group on Kafka starts at the earliest offset and, never
    # acknowledging, commits nothing; a queue's own consumers are not disturbed.
    group = f"msgsafe-deadletter-{uuid.uuid4()}" if log else None
    deliveries: list[Delivery] = []
    complete = False
    with translate_errors(as_json=as_json):
        consumer = Consumer(with_options(url, options), group=group)
        try:
            consumer.subscribe(destination)
            # A new Kafka group is first assigned its partitions (a rebalance, seconds):
            # an empty first poll must not pass for an empty topic.
            first_wait = max(wait, _KAFKA_JOIN_S) if log else wait
            while len(deliveries) < limit:
                batch = consumer.poll(
                    wait if deliveries else first_wait,
                    max_messages=min(500, limit - len(deliveries)),
                )
                if not batch:
                    complete = True
                    break
                deliveries.extend(batch)
            read = _Read(deliveries, complete, log)
            try:
                yield read
            finally:
                if not log:
                    for delivery in deliveries:
                        if delivery.settled is None:
                            delivery.release()
        finally:
            consumer.close()


def _chosen(read: _Read, ids: Sequence[str], all_: bool, as_json: bool) -> list[Delivery]:
    """The deliveries ``ids`` (or --all) name; an id not read is a usage error (exit 2)
    before anything is changed."""
    if all_:
        return list(read.deliveries)
    missing = [i for i in ids if not any(_matches(d, i) for d in read.deliveries)]
    if missing:
        where = "" if read.complete else " (not all dead letters were read: raise --limit)"
        fail(f"no dead letter with id {', '.join(missing)}{where}", ExitCode.USAGE, as_json=as_json)
    return [d for d in read.deliveries if any(_matches(d, i) for i in ids)]


def _selection(ids: list[str] | None, all_: bool) -> list[str]:
    if all_ and ids:
        raise typer.BadParameter("give --id ... or --all, not both")
    if not all_ and not ids:
        raise typer.BadParameter("give --id ID (repeatable) or --all")
    return list(ids or [])


def _summary(read: _Read) -> str:
    count = len(read.deliveries)
    if read.complete:
        return f"{count} dead letter(s) read; that is all"
    return f"{count} dead letter(s) read; the limit was reached, there may be more"


@app.command(name="list")
def list_(
    destination: DestArg,
    url: UrlOpt,
    limit: Annotated[int, typer.Option(help="Dead letters to read at most.")] = 100,
    wait: WaitOpt = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """The dead letters in DESTINATION: id, origin, attempts, error, when; read and given
    back, nothing removed. Says how many were read and whether that is all."""
    if limit < 1:
        raise typer.BadParameter("--limit must be >= 1")
    with _reading(url, destination, limit, wait, as_json) as read:
        rows = [
            {
                "message_id": _id_of(d),
                "source": d.headers.get(DLQ_SOURCE),
                "attempts": d.headers.get(DLQ_ATTEMPTS),
                "error_type": d.headers.get(DLQ_ERROR_TYPE),
                "error": _cut(d.headers.get(DLQ_ERROR, ""), _ERROR_SHOWN),
                "dead_lettered_at": d.headers.get(DLQ_AT),
            }
            for d in read.deliveries
        ]
    if as_json:
        for row in rows:
            print_json(row)
        print_json({"read": len(rows), "complete": read.complete})
        return
    print_table(
        f"dead letters in {destination}",
        ("message id", "source", "attempts", "error type", "error", "at"),
        [
            tuple(
                str(row[k] or "-")
                for k in (
                    "message_id",
                    "source",
                    "attempts",
                    "error_type",
                    "error",
                    "dead_lettered_at",
                )
            )
            for row in rows
        ],
    )
    out.print(_summary(read), markup=False)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


@app.command()
def show(
    destination: DestArg,
    message_id: Annotated[str, typer.Argument(help="The dead letter's message id.")],
    url: UrlOpt,
    limit: SearchOpt = 10_000,
    wait: WaitOpt = 2.0,
    full: Annotated[bool, typer.Option("--full", help="The whole body, not cut.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """One dead letter in full: its headers, key and body (text when UTF-8, else
    base64; cut at 4096 characters unless --full). An id not there exits 2."""
    with _reading(url, destination, limit, wait, as_json) as read:
        (delivery,) = _chosen(read, [message_id], False, as_json)[:1]
    try:
        body, encoding = delivery.body.decode(), "utf-8"
    except UnicodeDecodeError:
        body, encoding = base64.b64encode(delivery.body).decode(), "base64"
    truncated = not full and len(body) > _BODY_SHOWN
    data = {
        "message_id": _id_of(delivery),
        "dead_letter_id": delivery.message_id,
        "key": None if delivery.key is None else delivery.key.decode(errors="replace"),
        "headers": dict(delivery.headers),
        "body": body[:_BODY_SHOWN] if truncated else body,
        "body_encoding": encoding,
        "body_bytes": len(delivery.body),
        "truncated": truncated,
    }
    if as_json:
        print_json(data)
        return
    for name in ("message_id", "dead_letter_id", "key", "body_encoding", "body_bytes"):
        out.print(f"{name}: {data[name]}", markup=False)
    out.print("headers:", markup=False)
    for name, value in sorted(delivery.headers.items()):
        out.print(f"  {name}: {value}", markup=False)
    out.print("body:", markup=False)
    out.print(str(data["body"]), markup=False)
    if truncated:
        out.print(f"(cut at {_BODY_SHOWN} characters: --full shows all)", markup=False)


def default_audit_file() -> Path:
    """Where replays are recorded unless ``--audit`` says otherwise:
    ``$XDG_STATE_HOME/msgsafe/deadletter-audit.jsonl`` (default ``~/.local/state``)."""
    return platformdirs.user_state_path("msgsafe") / "deadletter-audit.jsonl"


def _replay_headers(delivery: Delivery, dead_letters: str, who: str, when: str) -> dict[str, str]:
    """The replayed message's headers: its own, the dead-letter headers gone but
    attempts and error type kept as ``x-msgsafe-replayed-*``, and who replayed it when
    from where."""
    headers = {k: v for k, v in delivery.headers.items() if k not in DEAD_LETTER_HEADERS}
    for dlq, kept in _KEPT_AS_REPLAYED.items():
        if dlq in delivery.headers:
            headers[kept] = delivery.headers[dlq]
    headers[REPLAYED_BY] = who
    headers[REPLAYED_AT] = when
    headers[REPLAYED_FROM] = dead_letters
    return headers


@app.command()
def replay(
    destination: DestArg,
    url: UrlOpt,
    ids: IdsOpt = None,
    all_: AllOpt = False,
    to: Annotated[
        str | None, typer.Option("--to", help="Send here instead of each message's origin.")
    ] = None,
    audit: Annotated[
        Path | None,
        typer.Option(
            help="Append the audit record (JSON lines) here; default "
            "$XDG_STATE_HOME/msgsafe/deadletter-audit.jsonl."
        ),
    ] = None,
    limit: SearchOpt = 10_000,
    wait: WaitOpt = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Send chosen dead letters back to their origin (x-msgsafe-dlq-source) or --to,
    with their original message id, through a Producer; each dead letter is removed only
    after its replay's receipt (CONFIRMED or STORED). A failed send leaves the dead
    letter in place (exit 1). On Kafka nothing is removed; the audit log records the
    replay. Every replay is appended to the audit log and printed."""
    wanted = _selection(ids, all_)
    who = getpass.getuser()
    audit_file = audit if audit is not None else default_audit_file()
    counts = {"confirmed": 0, "stored": 0, "failed": 0}
    records: list[dict[str, object]] = []
    with _reading(url, destination, limit, wait, as_json) as read:
        chosen = _chosen(read, wanted, all_, as_json)
        with translate_errors(as_json=as_json):
            producer = Producer(url)
        try:
            for delivery in chosen:
                records.append(_replay_one(producer, delivery, destination, to, who, counts))
        finally:
            producer.close()
        if read.log:
            for record in records:
                record["dead_letter"] = "kept (Kafka: recorded here, not removed)"
    _append_audit(audit_file, records)
    for record in records:
        if as_json:
            print_json(record)
        else:
            error = f" ({record['error']})" if record.get("error") else ""
            out.print(
                f"{record['status']:<9} {record['message_id']} -> {record['to']}{error}",
                markup=False,
            )
    summary = {**counts, "audit": str(audit_file)}
    if as_json:
        print_json(summary)
    else:
        err.print(
            f"{counts['confirmed']} confirmed, {counts['stored']} stored, "
            f"{counts['failed']} failed; recorded in {audit_file}",
            markup=False,
        )
    if counts["stored"]:
        err.print(
            f"{counts['stored']} replay(s) wait in the producer's outbox: forward them with "
            "msgsafe outbox drain (msgsafe outbox status lists the files)",
            markup=False,
        )
    exit_with(ExitCode.LOSS if counts["failed"] else ExitCode.OK)


def _replay_one(
    producer: Producer,
    delivery: Delivery,
    dead_letters: str,
    to: str | None,
    who: str,
    counts: dict[str, int],
) -> dict[str, object]:
    """Send one dead letter back and settle it after the receipt: acknowledged when
    CONFIRMED or STORED, given back when the send failed. Returns its audit record."""
    when = dt.datetime.now(dt.UTC).isoformat()
    message_id = _id_of(delivery)
    target = to or delivery.headers.get(DLQ_SOURCE)
    record: dict[str, object] = {
        "at": when,
        "by": who,
        "from": dead_letters,
        "to": target,
        "message_id": message_id,
    }
    if not target:
        counts["failed"] += 1
        record.update(status="failed", error=f"no {DLQ_SOURCE} header: give --to")
        return record
    try:
        receipt = producer.send(
            target,
            delivery.body,
            key=delivery.key,
            headers=_replay_headers(delivery, dead_letters, who, when),
            message_id=message_id,
        )
    except MsgsafeError as exc:
        counts["failed"] += 1
        record.update(status="failed", error=f"{type(exc).__name__}: {exc}")
        return record
    counts[receipt.status.value] += 1
    record["status"] = receipt.status.value
    if receipt.status in (Status.CONFIRMED, Status.STORED) and delivery.settled is None:
        # On Kafka acknowledging only commits an offset of a throwaway group: harmless.
        delivery.ack()
    return record


def _append_audit(path: Path, records: Sequence[dict[str, object]]) -> None:
    if not records:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as audit:
            for record in records:
                audit.write(json.dumps(record, sort_keys=True) + "\n")
    except OSError as exc:
        # The replays happened: say so loudly, the records are printed below anyway.
        err.print(f"warning: cannot append to the audit log {path}: {exc}", markup=False)


@app.command()
def purge(
    destination: DestArg,
    url: UrlOpt,
    ids: IdsOpt = None,
    all_: AllOpt = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Really delete them.")] = False,
    limit: SearchOpt = 10_000,
    wait: WaitOpt = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Delete chosen dead letters (RabbitMQ, AMQP 1.0) for good; needs --yes. On Kafka
    it refuses (exit 2): a record cannot be deleted, the topic's retention removes it."""
    wanted = _selection(ids, all_)
    if traits(parse_url(url).protocol).log:
        fail(
            "a Kafka topic's records cannot be deleted one by one: retention.ms removes "
            "them. Replay what must be handled (deadletter replay), and let the topic's "
            "retention expire the rest (or lower it for this topic).",
            ExitCode.USAGE,
            as_json=as_json,
        )
    if not yes:
        fail("purge deletes dead letters for good: give --yes", ExitCode.USAGE, as_json=as_json)
    with _reading(url, destination, limit, wait, as_json) as read:
        chosen = _chosen(read, wanted, all_, as_json)
        for delivery in chosen:
            delivery.ack()
    if as_json:
        print_json({"purged": len(chosen), "message_ids": [_id_of(d) for d in chosen]})
    else:
        out.print(f"{len(chosen)} dead letter(s) deleted from {destination}", markup=False)
