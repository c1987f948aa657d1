"""Consumer.run with an inbox on memory:// and a real SQLite inbox: the handler writes its
effects through the inbox's transaction, each message's effects are applied once, a
handler that raises leaves nothing behind, and a message the inbox recorded before its
acknowledgement (the process died in between) is acknowledged without the handler."""

from __future__ import annotations

import sqlite3
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from msgsafe import Consumer, Delivery, Producer, RetryPolicy
from msgsafe.errors import ConfigurationError, InboxUnavailable
from msgsafe.inbox import InboxStore, open_inbox
from msgsafe.testing import MemoryBroker
from tests.support.clock import LeapingClock
from tests.unit.consuming.test_run import leftover, run_until, send, url


def _database(tmp_path: Path) -> Path:
    """The application's database, holding its own effects table beside the inbox's."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (message_id TEXT NOT NULL, body BLOB)")
    return path


def _effects(path: Path) -> Counter[str]:
    with sqlite3.connect(path) as db:
        return Counter(row[0] for row in db.execute("SELECT message_id FROM effects"))


def _apply(d: Delivery, tx: Any) -> None:
    tx.execute("INSERT INTO effects VALUES (?, ?)", (d.message_id, d.body))


def _run_dead_lettering(
    broker: MemoryBroker,
    db: Path,
    handler: Any,
    done: Callable[[Consumer], bool],
    *,
    max_attempts: int,
) -> Consumer:
    """``run(handler)`` of a fresh consumer of ``q`` with the SQLite inbox ``db``, retries
    on a leaping clock and the dead-letter queue ``dlq``, until ``done(consumer)``."""
    with Producer(url(broker), outbox=False) as dead_letters:
        consumer = Consumer(url(broker)).subscribe("q")
        run_until(
            consumer,
            handler,
            lambda: done(consumer),
            inbox=f"sqlite:///{db}",
            retry=RetryPolicy(initial=0.0, max_attempts=max_attempts),
            dead_letter="dlq",
            dead_letter_producer=dead_letters,
            clock=LeapingClock(),
        )
    return consumer


def test_each_messages_effects_are_applied_once(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = _database(tmp_path)
    ids = send(memory_broker, [(f"k{i % 5}", b"%d" % i) for i in range(60)])
    failing = set(ids[::7])  # these fail once, after writing their effect
    failed: set[str] = set()
    lock = threading.Lock()

    def handler(d: Delivery, tx: Any) -> None:
        _apply(d, tx)
        with lock:
            if d.message_id in failing and d.message_id not in failed:
                failed.add(str(d.message_id))
                raise RuntimeError("the effect's second half failed")

    consumer = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        consumer,
        handler,
        lambda: consumer.stats().handled == len(ids),
        inbox=f"sqlite:///{db}",
        concurrency=3,
        retry=RetryPolicy(initial=0.0, max_attempts=3),
        on_exhausted="reject",
        clock=LeapingClock(),
    )
    effects = _effects(db)
    assert failed == failing
    # Applied once each, the failed first tries rolled back with their records.
    assert effects == Counter({i: 1 for i in ids}), effects - Counter(set(ids))
    inbox = open_inbox(f"sqlite:///{db}")
    try:
        assert inbox.handled(ids) == set(ids)
    finally:
        inbox.close()
    stats = consumer.stats()
    assert (stats.handled, stats.retried, stats.skipped) == (60, len(failing), 0)
    assert leftover(memory_broker) == []


def test_a_message_recorded_before_its_ack_is_acknowledged_without_the_handler(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """What a redelivery after a crash between commit and ack meets: the inbox already
    holds the id (and the effect), so the handler is not called again."""
    db = _database(tmp_path)
    ids = send(memory_broker, [(None, b"%d" % i) for i in range(10)])
    inbox = open_inbox(f"sqlite:///{db}")
    committed = ids[:4]
    for message_id in committed:
        inbox.process(
            message_id,
            lambda tx, m=message_id: tx.execute("INSERT INTO effects VALUES (?, ?)", (m, b"")),
            source="q",
        )
    called: list[str] = []

    def handler(d: Delivery, tx: Any) -> None:
        called.append(str(d.message_id))
        _apply(d, tx)

    consumer = Consumer(url(memory_broker)).subscribe("q")
    try:
        run_until(
            consumer,
            handler,
            lambda: consumer.stats().acked == len(ids),
            inbox=inbox,
            concurrency=2,
        )
    finally:
        inbox.close()
    assert sorted(called) == sorted(ids[4:])
    assert _effects(db) == Counter({i: 1 for i in ids})
    with sqlite3.connect(db) as conn:  # no attempt counted for the ones skipped
        assert conn.execute("SELECT count(*) FROM msgsafe_inbox_attempts").fetchone() == (0,)
    stats = consumer.stats()
    assert (stats.handled, stats.skipped) == (6, 4)
    assert leftover(memory_broker) == []


def test_a_handler_that_keeps_failing_leaves_no_effect_and_no_record(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = _database(tmp_path)
    [poison] = send(memory_broker, [("k", b"poison")])

    def handler(d: Delivery, tx: Any) -> None:
        _apply(d, tx)
        raise ValueError("cannot handle this one")

    _run_dead_lettering(
        memory_broker, db, handler, lambda c: c.stats().dead_lettered == 1, max_attempts=2
    )
    assert _effects(db) == Counter()
    inbox = open_inbox(f"sqlite:///{db}")
    try:
        assert inbox.handled([poison]) == set()
    finally:
        inbox.close()
    assert [e.headers["x-msgsafe-dlq-message-id"] for e in memory_broker.messages("dlq")] == [
        poison
    ]


def test_attempts_counted_in_the_inbox_go_on_after_the_consumer_is_gone(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """A broker that keeps no delivery count (Kafka; here memory://): the consumer that
    meets a message again after a restart counts on from the inbox, not from 1 (or 2),
    so a message that never gets handled reaches max_attempts however often it dies."""
    db = _database(tmp_path)
    [poison] = send(memory_broker, [("k", b"poison")])
    seen: list[int] = []

    def handler(d: Delivery, tx: Any) -> None:
        seen.append(d.attempt)
        if d.attempt == 2:
            first.stop()  # "killed" during its second attempt: given back
        raise ValueError("cannot handle this one")

    policy = RetryPolicy(initial=0.0, max_attempts=4)
    first = Consumer(url(memory_broker)).subscribe("q")
    run_until(
        first,
        handler,
        lambda: len(seen) >= 2,
        inbox=f"sqlite:///{db}",
        retry=policy,
        on_exhausted="stop",
        clock=LeapingClock(),
    )
    assert seen == [1, 2]
    _run_dead_lettering(
        memory_broker, db, handler, lambda c: c.stats().dead_lettered == 1, max_attempts=4
    )
    # Counted on from the inbox: 3 and 4, not 2 again (the broker's redelivered flag).
    assert seen == [1, 2, 3, 4]
    [dead] = memory_broker.messages("dlq")
    assert dead.headers["x-msgsafe-dlq-attempts"] == "4"
    assert dead.headers["x-msgsafe-dlq-message-id"] == poison
    assert _effects(db) == Counter()


def test_an_inbox_that_is_neither_a_url_nor_a_store_is_refused(
    memory_broker: MemoryBroker,
) -> None:
    with Consumer(url(memory_broker)) as consumer:
        consumer.subscribe("q")
        with pytest.raises(ConfigurationError, match="inbox"):
            consumer.run(lambda d, tx: None, inbox=42)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="sqlite: or postgresql://"):
            consumer.run(lambda d, tx: None, inbox="mysql://db")


class _DownAtFirst:
    """A SQLite inbox whose database takes no writes for its first ``down`` calls."""

    def __init__(self, url: str, down: int) -> None:
        self._inbox = open_inbox(url)
        self.down = down

    def process(self, message_id: str, work: Any, *, source: str, attempt: int = 1) -> Any:
        if self.down > 0:
            self.down -= 1
            raise InboxUnavailable("the database took no writes within 30 s")
        return self._inbox.process(message_id, work, source=source, attempt=attempt)

    def handled(self, message_ids: Any) -> set[str]:
        return self._inbox.handled(message_ids)

    def record_attempt(self, message_id: str, *, source: str) -> int:
        if self.down > 0:  # down for every write, the attempt's count too
            raise InboxUnavailable("the database took no writes within 30 s")
        return self._inbox.record_attempt(message_id, source=source)

    def prune(self, *, older_than_s: float) -> int:
        return self._inbox.prune(older_than_s=older_than_s)

    def close(self) -> None:
        self._inbox.close()


def test_an_unavailable_inbox_gives_the_message_back_not_to_the_dead_letters(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """The database down for longer than the retries last: the handler never failed, so
    nothing is dead-lettered; each message is handled once the database is back, its
    key's order kept."""
    db = _database(tmp_path)
    ids = send(memory_broker, [("k", b"%d" % i) for i in range(5)])
    inbox = _DownAtFirst(f"sqlite:///{db}", down=6)
    assert isinstance(inbox, InboxStore)
    order: list[str] = []

    def handler(d: Delivery, tx: Any) -> None:
        order.append(str(d.message_id))
        _apply(d, tx)

    with Producer(url(memory_broker), outbox=False) as dead_letters:
        consumer = Consumer(url(memory_broker)).subscribe("q")
        try:
            run_until(
                consumer,
                handler,
                lambda: consumer.stats().handled == len(ids),
                inbox=inbox,
                retry=RetryPolicy(initial=0.0, max_attempts=2),
                dead_letter="dlq",
                dead_letter_producer=dead_letters,
                clock=LeapingClock(),
            )
        finally:
            inbox.close()
    assert memory_broker.messages("dlq") == []
    assert order == ids and _effects(db) == Counter({i: 1 for i in ids})
    stats = consumer.stats()
    assert (stats.handled, stats.retried, stats.dead_lettered) == (5, 0, 0)
    assert stats.requeued >= 6  # the head each time (with what followed it of its key)
    assert leftover(memory_broker) == []


def test_a_message_that_kills_its_consumer_is_dead_lettered_after_max_attempts(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """Calls counted in the inbox that never ended (the process died inside the handler,
    three times): the next consumer dead-letters the message without calling the handler
    again, instead of crash-looping on it."""
    db = _database(tmp_path)
    [deadly] = send(memory_broker, [("k", b"deadly")])
    [after] = send(memory_broker, [("k", b"fine")])
    inbox = open_inbox(f"sqlite:///{db}")
    for _ in range(3):  # three processes, each killed during its call
        inbox.record_attempt(deadly, source="q")
    inbox.close()
    called: list[bytes] = []

    def handler(d: Delivery, tx: Any) -> None:
        called.append(d.body)
        _apply(d, tx)

    consumer = _run_dead_lettering(
        memory_broker, db, handler, lambda c: c.stats().handled == 1, max_attempts=3
    )
    assert called == [b"fine"]  # the deadly one never called again; its key went on
    [dead] = memory_broker.messages("dlq")
    assert dead.headers["x-msgsafe-dlq-message-id"] == deadly
    assert dead.headers["x-msgsafe-dlq-attempts"] == "4"
    assert dead.headers["x-msgsafe-dlq-error-type"].endswith(".HandlerDidNotReturn")
    assert _effects(db) == Counter({after: 1})
    assert consumer.stats().dead_lettered == 1
