"""Consumer.run with an inbox and a BatchPolicy, on memory:// and a real SQLite inbox: a
run of messages committed in one transaction, every id counted — none lost, each
message's effects applied once, the ones the inbox holds skipped, a poison message
dead-lettered alone while the rest of its batch commits, per-key order kept."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest

from msgsafe import BatchPolicy, Consumer, Delivery, Producer, RetryPolicy
from msgsafe.errors import ConfigurationError
from msgsafe.inbox import open_inbox
from msgsafe.inbox.sqlite import SqliteInbox
from msgsafe.ports import InboxCapabilities
from msgsafe.testing import MemoryBroker
from tests.support.clock import LeapingClock
from tests.unit.consuming.test_run import leftover, run_until, send, url


def _database(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (message_id TEXT NOT NULL, key BLOB)")
    return path


def _effects(path: Path) -> list[str]:
    """Every effect's message id, in commit order."""
    with sqlite3.connect(path) as db:
        return [row[0] for row in db.execute("SELECT message_id FROM effects ORDER BY rowid")]


def _apply(deliveries: list[Delivery], tx: Any) -> None:
    for d in deliveries:
        tx.execute("INSERT INTO effects VALUES (?, ?)", (d.message_id, d.key))


def _by_key(ids: list[str], keys: dict[str, str | None]) -> dict[str | None, list[str]]:
    order: dict[str | None, list[str]] = defaultdict(list)
    for message_id in ids:
        order[keys[message_id]].append(message_id)
    return dict(order)


def test_batches_commit_each_message_once_in_key_order(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = _database(tmp_path)
    items = [(f"k{i % 5}" if i % 7 else None, b"%d" % i) for i in range(300)]
    ids = send(memory_broker, items)
    keys = {message_id: key for message_id, (key, _) in zip(ids, items, strict=True)}
    done_before = ids[10:20]  # committed by an earlier process that died before the acks
    inbox = open_inbox(f"sqlite:///{db}")
    for message_id in done_before:
        inbox.process(
            message_id,
            lambda tx, m=message_id: _apply([_Fake(m, keys[m])], tx),  # type: ignore[list-item]
            source="q",
        )
    inbox.close()
    sizes: list[int] = []
    lock = threading.Lock()

    def handler(deliveries: list[Delivery], tx: Any) -> None:
        with lock:
            sizes.append(len(deliveries))
        _apply(deliveries, tx)

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().acked == len(ids),
        inbox=f"sqlite:///{db}",
        batch=BatchPolicy(max_messages=64),
        concurrency=2,
    )
    effects = _effects(db)
    assert Counter(effects) == Counter(ids), Counter(effects) - Counter(ids)  # once each
    # Per key, the effects were committed in the order the messages were sent (unkeyed
    # ones have no order to keep).
    run = [m for m in effects if m not in done_before]
    sent = [m for m in ids if m not in done_before]
    assert _by_key(run, keys) | {None: []} == _by_key(sent, keys) | {None: []}
    stats = consumer.stats()
    assert (stats.handled, stats.skipped, stats.batches_split) == (290, 10, 0)
    assert max(sizes) > 1 and sum(sizes) == 290 and max(sizes) <= 64
    assert stats.batches == len(sizes) < 290  # each list was one transaction
    with sqlite3.connect(db) as conn:  # every count went with its commit
        assert conn.execute("SELECT count(*) FROM msgsafe_inbox_attempts").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM msgsafe_inbox").fetchone() == (300,)
    assert leftover(memory_broker) == []


class _Fake:
    """What _apply reads of a delivery."""

    def __init__(self, message_id: str, key: str | None) -> None:
        self.message_id = message_id
        self.key = None if key is None else key.encode()


def test_a_poison_message_is_dead_lettered_alone_and_its_batch_commits(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = _database(tmp_path)
    items = [(f"k{i % 4}", b"%d" % i) for i in range(80)]
    ids = send(memory_broker, items)
    keys = {message_id: key for message_id, (key, _) in zip(ids, items, strict=True)}
    poison = ids[21]
    seen: Counter[str] = Counter()
    lock = threading.Lock()

    def handler(deliveries: list[Delivery], tx: Any) -> None:
        with lock:
            seen.update(str(d.message_id) for d in deliveries)
        _apply(deliveries, tx)  # written, then rolled back with the batch
        if any(d.message_id == poison for d in deliveries):
            raise ValueError("cannot handle this one")

    with Producer(url(memory_broker), outbox=False) as dead_letters:
        consumer = Consumer(url(memory_broker)).subscribe("q")
        run_until(
            consumer,
            handler,
            lambda: consumer.stats().acked == len(ids),
            inbox=f"sqlite:///{db}",
            batch=BatchPolicy(max_messages=32),
            concurrency=2,
            retry=RetryPolicy(initial=0.0, max_attempts=3),
            dead_letter="dlq",
            dead_letter_producer=dead_letters,
            clock=LeapingClock(),
        )
    effects = _effects(db)
    others = [i for i in ids if i != poison]
    assert Counter(effects) == Counter(others)  # once each; none of the poison's
    assert _by_key(effects, keys) == _by_key(others, keys)
    [dead] = memory_broker.messages("dlq")
    assert dead.headers["x-msgsafe-dlq-message-id"] == poison
    # Three attempts, counted in the inbox: the batch's call, which failed for a reason
    # that may be another message's, spent none (it is attempt 1 again, alone).
    assert dead.headers["x-msgsafe-dlq-attempts"] == "3"
    assert seen[poison] == 4
    stats = consumer.stats()
    assert (stats.handled, stats.dead_lettered, stats.retried) == (79, 1, 2)
    assert stats.batches_split >= 1 and stats.batches >= 1
    inbox = open_inbox(f"sqlite:///{db}")
    try:
        assert inbox.handled(ids) == set(others)
    finally:
        inbox.close()
    assert leftover(memory_broker) == []


def test_a_message_whose_earlier_call_never_ended_is_handled_alone(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """A process died inside a batch's handler: on redelivery the inbox's counts say so,
    and those messages are handled one at a time — a message that kills its consumer
    reaches max_attempts on its own, not with its batch."""
    db = _database(tmp_path)
    ids = send(memory_broker, [(f"k{i % 3}", b"%d" % i) for i in range(30)])
    deadly, fine = ids[4], ids[5:8]
    inbox = open_inbox(f"sqlite:///{db}")
    for _ in range(3):  # three processes, each killed during a batch holding it
        inbox.record_attempts([(deadly, "q")])
    inbox.record_attempts([(m, "q") for m in fine])  # in the last of those batches
    inbox.close()
    lists: list[list[str]] = []

    def handler(deliveries: list[Delivery], tx: Any) -> None:
        lists.append([str(d.message_id) for d in deliveries])
        _apply(deliveries, tx)

    with Producer(url(memory_broker), outbox=False) as dead_letters:
        consumer = Consumer(url(memory_broker)).subscribe("q")
        run_until(
            consumer,
            handler,
            lambda: consumer.stats().acked == len(ids),
            inbox=f"sqlite:///{db}",
            batch=BatchPolicy(max_messages=100),
            retry=RetryPolicy(initial=0.0, max_attempts=3),
            dead_letter="dlq",
            dead_letter_producer=dead_letters,
            clock=LeapingClock(),
        )
    called = [m for batch in lists for m in batch]
    assert deadly not in called  # never called again: dead-lettered for its crashes
    for message_id in fine:
        assert [message_id] in lists  # alone
    assert Counter(_effects(db)) == Counter(i for i in ids if i != deadly)
    [dead] = memory_broker.messages("dlq")
    assert dead.headers["x-msgsafe-dlq-error-type"].endswith(".HandlerDidNotReturn")
    assert dead.headers["x-msgsafe-dlq-attempts"] == "4"
    assert leftover(memory_broker) == []


class _CountingInbox(SqliteInbox):
    """A SQLite inbox that counts the calls the run makes."""

    def __init__(self, path: Path, *, declares: bool = True) -> None:
        super().__init__(path)
        self.calls: Counter[str] = Counter()
        if not declares:
            self.capabilities = InboxCapabilities()  # type: ignore[misc]

    def handled(self, message_ids: Any) -> set[str]:
        self.calls["handled"] += 1
        return super().handled(message_ids)

    def record_attempt(self, message_id: str, *, source: str) -> int:
        self.calls["record_attempt"] += 1
        return super().record_attempt(message_id, source=source)

    def record_attempts(self, items: Any) -> dict[str, int]:
        self.calls["record_attempts"] += 1
        return super().record_attempts(items)


@pytest.mark.parametrize("declares", [True, False])
def test_a_call_alone_counts_its_attempt_in_one_statement_where_declared(
    memory_broker: MemoryBroker, tmp_path: Path, declares: bool
) -> None:
    """run(inbox=) without a batch: the count and the handled check of a first call are
    one statement (record_attempts) on an inbox that declares batches; two calls
    (handled, then record_attempt) on one that does not."""
    db = _database(tmp_path)
    ids = send(memory_broker, [("k", b"%d" % i) for i in range(6)])
    inbox = _CountingInbox(db, declares=declares)
    inbox.process(ids[0], lambda tx: None, source="q")  # handled before: skipped

    def handler(d: Delivery, tx: Any) -> None:
        _apply([d], tx)

    consumer = Consumer(url(memory_broker)).subscribe("q")
    try:
        run_until(consumer, handler, lambda: consumer.stats().acked == len(ids), inbox=inbox)
    finally:
        inbox.close()
    if declares:
        assert inbox.calls == Counter(record_attempts=6)
    else:
        assert inbox.calls == Counter(handled=6, record_attempt=5)
    assert Counter(_effects(db)) == Counter(ids[1:])
    assert (consumer.stats().handled, consumer.stats().skipped) == (5, 1)


def test_batch_needs_an_inbox_that_declares_it(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="max_messages"):
        BatchPolicy(max_messages=0)
    with pytest.raises(ConfigurationError, match="max_wait"):
        BatchPolicy(max_wait=-1)
    db = _database(tmp_path)
    plain = _CountingInbox(db, declares=False)
    with Consumer(url(memory_broker)) as consumer:
        consumer.subscribe("q")
        with pytest.raises(ConfigurationError, match="needs an inbox"):
            consumer.run(_apply, batch=BatchPolicy())
        with pytest.raises(ConfigurationError, match=r"capabilities\.batch"):
            consumer.run(_apply, inbox=plain, batch=BatchPolicy())
        with pytest.raises(ConfigurationError, match="BatchPolicy"):
            consumer.run(_apply, inbox=plain, batch=64)  # type: ignore[arg-type]
    plain.close()


def test_a_batch_split_by_a_stop_is_released_uncounted(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = _database(tmp_path)
    ids = send(memory_broker, [(f"k{i % 2}", b"%d" % i) for i in range(10)])
    consumer = Consumer(url(memory_broker)).subscribe("q")
    calls: list[int] = []

    def handler(deliveries: list[Delivery], tx: Any) -> None:
        calls.append(len(deliveries))
        consumer.stop()
        raise RuntimeError("the batch fails as the run stops")

    consumer.run(
        handler, inbox=f"sqlite:///{db}", batch=BatchPolicy(max_messages=64), concurrency=1
    )
    stats = consumer.stats()
    assert len(calls) == stats.batches_split == 1
    # Split after the batch failed, no delivery's own call began (stopped): each went back
    # released, none counted as a failed attempt of its own.
    assert (stats.acked, stats.requeued) == (0, 0)
    assert stats.released == stats.received >= calls[0]
    assert sorted(str(d.message_id) for d in leftover(memory_broker)) == sorted(ids)
    assert _effects(db) == []
