"""AsyncConsumer.run with an inbox, on memory:// and a real SQLite inbox: async handlers
write through ``tx`` (an AsyncTransaction on the inbox's transaction), each message's
effects are applied once through a crash between commit and ack, retries follow the
injected clock, a key's effects keep their order, poison goes to the dead letters with
its headers, and what a handler raises (or a cancelled handler) leaves nothing behind.
The statements run on the thread that holds the transaction while the loop goes on."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sqlite3
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import pytest

from msgsafe import AsyncConsumer, AsyncDelivery, AsyncProducer, RetryPolicy
from msgsafe.aio import AsyncTransaction
from msgsafe.consuming.dead_letter import (
    DLQ_ATTEMPTS,
    DLQ_ERROR,
    DLQ_ERROR_TYPE,
    DLQ_MESSAGE_ID,
    DLQ_SOURCE,
)
from msgsafe.errors import ClosedError
from msgsafe.inbox import open_inbox
from msgsafe.ports import InboxStore, Processed
from msgsafe.telemetry.stats import ConsumerStats
from msgsafe.testing import MemoryBroker
from tests.support.clock import LeapingClock
from tests.support.commands import signalled
from tests.support.waiting import wait_until
from tests.unit.consuming.test_run import leftover, send, url

_R = TypeVar("_R")


def database(tmp_path: Path) -> Path:
    """The application's database: its effects table, the inbox's tables beside it."""
    path = tmp_path / "app.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE effects (message_id TEXT NOT NULL, key TEXT, body BLOB)")
    return path


def effects(path: Path) -> list[tuple[str, str, bytes]]:
    """The effect rows in the order they were committed."""
    with sqlite3.connect(path) as db:
        return db.execute("SELECT message_id, key, body FROM effects ORDER BY rowid").fetchall()


async def apply(d: AsyncDelivery, tx: AsyncTransaction) -> None:
    await tx.execute(
        "INSERT INTO effects VALUES (?, ?, ?)", (d.message_id, (d.key or b"").decode(), d.body)
    )


class WatchedInbox:
    """An :class:`~msgsafe.ports.InboxStore` around a real one that notes the thread
    each transaction ran on and, once the id ``crash_after`` is committed, calls
    ``crash`` before the consumer can acknowledge it."""

    def __init__(self, inner: InboxStore, *, crash_after: str | None = None) -> None:
        self.inner = inner
        self.crash_after = crash_after
        self.crash: Callable[[], None] = lambda: None
        self.threads: dict[str, int] = {}

    def process(
        self, message_id: str, work: Callable[[Any], _R], *, source: str, attempt: int = 1
    ) -> Processed[_R]:
        self.threads[message_id] = threading.get_ident()
        processed = self.inner.process(message_id, work, source=source, attempt=attempt)
        if processed.ran and message_id == self.crash_after:
            self.crash()
        return processed

    def handled(self, message_ids: Sequence[str]) -> set[str]:
        return self.inner.handled(message_ids)

    def record_attempt(self, message_id: str, *, source: str) -> int:
        return self.inner.record_attempt(message_id, source=source)

    def prune(self, *, older_than_s: float) -> int:
        return self.inner.prune(older_than_s=older_than_s)

    def close(self) -> None:
        self.inner.close()


def run_until(
    broker: MemoryBroker,
    handler: Callable[..., Any],
    done: Callable[[ConsumerStats], object],
    *,
    within: float = 20.0,
    **options: Any,
) -> ConsumerStats:
    """``await AsyncConsumer(...).run(handler, **options)`` on ``broker``'s queue "q" in
    an event loop of its own, stopped once ``done(stats)`` (failing the test when that
    takes longer than ``within`` seconds, or the run ends first); the final stats. With
    ``dead_letter``, an :class:`AsyncProducer` sends the dead letters."""

    async def main() -> ConsumerStats:
        consumer = AsyncConsumer(url(broker))
        await consumer.subscribe("q")
        async with contextlib.AsyncExitStack() as stack:
            if "dead_letter" in options:
                producer = AsyncProducer(url(broker), outbox=False)
                options["dead_letter_producer"] = await stack.enter_async_context(producer)
            running = asyncio.ensure_future(consumer.run(handler, **options))
            try:
                await asyncio.to_thread(
                    wait_until,
                    lambda: done(consumer.stats()) or running.done(),
                    within,
                    "the run's work",
                    interval=0.01,
                )
            finally:
                consumer.stop()
                await running
        stats = consumer.stats()
        assert done(stats), f"the run ended before its work was done: {stats}"
        return stats

    return asyncio.run(main())


def counting(calls: Counter[str]) -> Callable[[AsyncDelivery, AsyncTransaction], Any]:
    """A handler that applies the message's effect and counts its calls in ``calls``."""

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        calls[str(d.message_id)] += 1
        await apply(d, tx)

    return handler


def next_life(broker: MemoryBroker, db: Path, calls: Counter[str], left: int) -> ConsumerStats:
    """A new process on the same database: a run until the ``left`` messages found on
    the broker are acknowledged; then each message's handler ran once (``calls``), its
    effect was applied once, and nothing is left."""
    stats = run_until(
        broker, counting(calls), lambda s: s.acked == left, inbox=f"sqlite:///{db}", concurrency=3
    )
    ids = broker.ids("q")
    assert calls == Counter({m: 1 for m in ids}), calls - Counter(set(ids))
    assert Counter(m for m, _, _ in effects(db)) == Counter({m: 1 for m in ids})
    assert leftover(broker) == []
    return stats


def test_effects_once_through_a_crash_between_commit_and_ack(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """The process "dies" right after the inbox committed one message: its connection
    goes (the broker takes back every unacknowledged delivery) and the acknowledgement
    that follows reaches nobody. The next process gets the message again, finds it in
    the inbox and acknowledges it without calling the handler."""
    db = database(tmp_path)
    ids = send(memory_broker, [(f"k{i % 6}", b"%d" % i) for i in range(60)])
    calls: Counter[str] = Counter()
    handler = counting(calls)
    inbox = WatchedInbox(open_inbox(f"sqlite:///{db}"), crash_after=ids[25])

    async def first_life() -> None:
        consumer = AsyncConsumer(url(memory_broker))
        await consumer.subscribe("q")
        inbox.crash = lambda: consumer.sync.close(0)  # the connection dies with the process
        await consumer.run(handler, inbox=inbox, concurrency=3)  # ends: its consumer closed

    asyncio.run(first_life())
    recorded = inbox.handled(ids)
    backlog = [str(d.message_id) for d in leftover(memory_broker)]
    # The crux: committed with its effect, and still on the broker, unacknowledged.
    assert ids[25] in recorded and ids[25] in backlog
    assert set(backlog) | recorded == set(ids)
    committed_again = [m for m in backlog if m in recorded]

    inbox.close()
    stats = next_life(memory_broker, db, calls, len(backlog))
    assert stats.skipped == len(committed_again) >= 1
    assert stats.handled == len(backlog) - stats.skipped


def test_retries_on_the_injected_clock_and_poison_to_the_dead_letters(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = database(tmp_path)
    # One key: the flaky message waits behind the poison's retries, so the one clock
    # leaps for one of them at a time.
    poison, flaky = send(memory_broker, [("a", b"poison"), ("a", b"flaky")])
    clock = LeapingClock()
    attempts: dict[bytes, list[tuple[int, float]]] = defaultdict(list)

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        attempts[d.body].append((d.attempt, clock.now()))
        await apply(d, tx)  # written each time, kept only by the attempt that commits
        if d.body == b"poison" or d.attempt < 3:
            raise RuntimeError(f"cannot handle {d.body!r} yet")

    policy = RetryPolicy(initial=0.1, multiplier=2.0, maximum=10.0, max_attempts=4, jitter=False)

    stats = run_until(
        memory_broker,
        handler,
        lambda stats: memory_broker.count("dlq") == 1 and stats.handled == 1,
        inbox=f"sqlite:///{db}",
        concurrency=2,
        retry=policy,
        dead_letter="dlq",
        clock=clock,
    )
    assert (stats.retried, stats.dead_lettered, stats.handled, stats.acked) == (3 + 2, 1, 1, 2)
    # Each message's schedule from its first attempt, the flaky one's after the poison's.
    schedule = {
        body: [(a, round(t - tried[0][1], 9)) for a, t in tried] for body, tried in attempts.items()
    }
    assert schedule == {
        b"poison": [(1, 0.0), (2, 0.1), (3, 0.3), (4, 0.7)],
        b"flaky": [(1, 0.0), (2, 0.1), (3, 0.3)],
    }
    # Only the flaky message's third attempt committed; the inbox says which it was.
    assert [m for m, _, _ in effects(db)] == [flaky]
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT message_id, attempt FROM msgsafe_inbox").fetchall() == [
            (flaky, 3)
        ]
    [letter] = memory_broker.messages("dlq")
    assert letter.body == b"poison" and letter.key == b"a"
    assert attempts[b"flaky"][0][1] >= attempts[b"poison"][-1][1]
    assert letter.headers[DLQ_MESSAGE_ID] == poison
    assert letter.headers[DLQ_ATTEMPTS] == "4"
    assert letter.headers[DLQ_SOURCE] == "q"
    assert letter.headers[DLQ_ERROR_TYPE] == "RuntimeError"
    assert letter.headers[DLQ_ERROR] == "cannot handle b'poison' yet"
    assert leftover(memory_broker) == []


def test_a_keys_effects_keep_their_order_under_concurrency(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = database(tmp_path)
    items: list[tuple[str | None, bytes]] = [(f"k{i % 8}", b"%d" % i) for i in range(160)]
    ids = send(memory_broker, items)
    sent_order: dict[str, list[str]] = defaultdict(list)
    for (key, _), message_id in zip(items, ids, strict=True):
        sent_order[str(key)].append(message_id)
    active: set[str] = set()
    overlaps: list[str] = []
    #: (key, effects of its key committed before its transaction, expected).
    seen_before: list[tuple[str, int, int]] = []

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        key = (d.key or b"").decode()
        if key in active:
            overlaps.append(key)
        active.add(key)
        [(before,)] = await tx.execute("SELECT count(*) FROM effects WHERE key = ?", (key,))
        await asyncio.sleep(0)  # the loop runs others meanwhile
        await apply(d, tx)
        active.discard(key)
        seen_before.append((key, before, sent_order[key].index(str(d.message_id))))

    stats = run_until(
        memory_broker,
        handler,
        lambda stats: stats.handled == len(ids),
        inbox=f"sqlite:///{db}",
        concurrency=4,
    )
    assert (stats.acked, stats.retried, stats.skipped, stats.in_flight) == (160, 0, 0, 0)
    assert overlaps == []
    assert [(key, b) for key, b, expected in seen_before if b != expected] == []
    committed: dict[str, list[str]] = defaultdict(list)
    for message_id, key, _ in effects(db):
        committed[key].append(message_id)
    assert committed == sent_order
    assert leftover(memory_broker) == []


def test_statements_run_on_the_transactions_thread_while_the_loop_goes_on(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    db = database(tmp_path)
    [message_id] = send(memory_broker, [("k", b"one")])
    inbox = WatchedInbox(open_inbox(f"sqlite:///{db}"))
    gate = threading.Event()
    seen: dict[str, Any] = {}

    async def open_gate() -> None:
        await asyncio.sleep(0)
        gate.set()

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        seen["loop"] = threading.get_ident()
        # The statement waits for the gate, which only the loop opens: had the statement
        # held the loop, the gate would stay shut until the wait timed out (False).
        seen["waited"], _ = await asyncio.gather(tx.call(lambda _: gate.wait(10)), open_gate())
        seen["tx"] = await tx.call(lambda _: threading.get_ident())
        seen["insert"] = await tx.execute(
            "INSERT INTO effects VALUES (?, 'k', ?)", (d.message_id, d.body)
        )
        await tx.executemany(
            "INSERT INTO effects VALUES (?, 'k', ?)", [("extra", b"1"), ("extra", b"2")]
        )
        seen["rows"] = await tx.execute("SELECT count(*) FROM effects")
        seen["rowcount"] = await tx.call(
            lambda conn: conn.execute("DELETE FROM effects WHERE message_id = 'extra'").rowcount
        )
        seen["tx_object"] = tx

    run_until(memory_broker, handler, lambda stats: stats.handled == 1, inbox=inbox)
    with pytest.raises(ClosedError, match="handler has returned"):
        asyncio.run(seen["tx_object"].execute("SELECT 1"))  # kept past its handler
    inbox.close()
    assert seen["waited"] is True
    assert seen["tx"] == inbox.threads[message_id] != seen["loop"]
    assert (seen["insert"], seen["rows"], seen["rowcount"]) == ([], [(3,)], 2)
    assert effects(db) == [(message_id, "k", b"one")]


def test_what_a_handler_raises_is_rolled_back_and_retried(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """A driver error the handler lets through, a handler cancelled half-way and a
    plain exception are failures alike: the transaction is rolled back, the delivery
    retried; a driver error the handler catches is its own business."""
    db = database(tmp_path)
    ids = send(
        memory_broker,
        [("a", b"bad-sql"), ("b", b"cancelled"), ("c", b"caught"), ("d", b"raises")],
    )
    by_body: dict[bytes, str] = {}
    failures: list[tuple[bytes, str]] = []

    async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
        by_body[d.body] = str(d.message_id)
        await apply(d, tx)
        if d.body == b"bad-sql":
            await tx.execute("INSERT INTO no_such_table VALUES (1)")  # every attempt
        if d.body == b"caught":
            try:
                await tx.execute("SELECT * FROM no_such_table")
            except sqlite3.OperationalError as exc:
                failures.append((d.body, str(exc)))
        if d.attempt == 1 and d.body == b"cancelled":
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # as a timeout around the handler's own work would
            await asyncio.sleep(0)
        if d.attempt == 1 and d.body == b"raises":
            raise KeyError("first attempt")

    stats = run_until(
        memory_broker,
        handler,
        lambda stats: stats.handled == 3 and memory_broker.count("dlq") == 1,
        inbox=f"sqlite:///{db}",
        concurrency=4,
        retry=RetryPolicy(initial=0.0, max_attempts=2),
        dead_letter="dlq",
        clock=LeapingClock(),
    )
    assert (stats.retried, stats.dead_lettered, stats.acked) == (3, 1, 4)
    assert failures == [(b"caught", "no such table: no_such_table")]
    assert Counter(m for m, _, _ in effects(db)) == Counter(
        {by_body[b"cancelled"]: 1, by_body[b"caught"]: 1, by_body[b"raises"]: 1}
    )
    [letter] = memory_broker.messages("dlq")
    assert letter.headers[DLQ_MESSAGE_ID] == by_body[b"bad-sql"] == ids[0]
    assert letter.headers[DLQ_ERROR_TYPE] == "sqlite3.OperationalError"
    assert leftover(memory_broker) == []


def test_a_stop_lets_open_transactions_commit_and_gives_back_the_rest(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """Stopped (and its task cancelled) while a handler is inside its transaction: that
    handler ends, its transaction commits and its delivery is acknowledged; what had not
    started is given back unacknowledged, and the next run applies it, each effect once."""
    db = database(tmp_path)
    ids = send(memory_broker, [(f"k{i % 3}", b"%d" % i) for i in range(30)])
    calls: Counter[str] = Counter()

    async def first_life() -> ConsumerStats:
        inside = asyncio.Event()
        release = asyncio.Event()

        async def handler(d: AsyncDelivery, tx: AsyncTransaction) -> None:
            calls[str(d.message_id)] += 1
            await apply(d, tx)
            inside.set()
            await release.wait()  # the handler's work, its transaction open

        consumer = AsyncConsumer(url(memory_broker))
        await consumer.subscribe("q")
        running = asyncio.ensure_future(
            consumer.run(handler, inbox=f"sqlite:///{db}", concurrency=3)
        )
        await asyncio.wait_for(inside.wait(), 10)
        consumer.stop()  # as SIGTERM does: no handler starts from now on
        running.cancel()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await running
        return consumer.stats()

    stats = asyncio.run(first_life())
    inbox = open_inbox(f"sqlite:///{db}")
    try:
        recorded = inbox.handled(ids)
    finally:
        inbox.close()
    # Workers already waiting for SQLite's write lock when the stop came ran theirs too.
    assert 1 <= stats.handled <= 3 and stats.acked == stats.handled == len(recorded)
    assert stats.in_flight == 0
    rest = {str(d.message_id) for d in leftover(memory_broker)}
    assert rest == set(ids) - recorded

    again = next_life(memory_broker, db, calls, len(rest))
    assert (again.handled, again.skipped) == (len(rest), 0)


_SIGNALLED_RUN = """
import asyncio, json, signal, sqlite3, sys
from msgsafe import AsyncConsumer, Consumer, Producer
from msgsafe.inbox import open_inbox
from msgsafe.testing import MemoryBroker

db = sys.argv[1]
with sqlite3.connect(db) as conn:
    conn.execute("CREATE TABLE effects (message_id TEXT NOT NULL)")
MemoryBroker.install(MemoryBroker("signalled"))
with Producer("memory://signalled", outbox=False) as p:
    ids = [p.send("q", b"%d" % i, key="k%d" % (i % 3)).message_id for i in range(30)]
previous = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
handled = []

async def handler(d, tx):
    await tx.execute("INSERT INTO effects VALUES (?)", (d.message_id,))
    print("handling", flush=True)
    await asyncio.sleep(0.2)  # the handler's work, its transaction open
    handled.append(d.message_id)

async def main():
    consumer = AsyncConsumer("memory://signalled")
    await consumer.subscribe("q")
    await consumer.run(handler, inbox="sqlite:///" + db, concurrency=2, stop_timeout=10)
    return consumer.stats()

stats = asyncio.run(main())
restored = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == previous
inbox = open_inbox("sqlite:///" + db)
recorded = sorted(inbox.handled(ids))
with sqlite3.connect(db) as conn:
    effects = [r[0] for r in conn.execute("SELECT message_id FROM effects")]
with Consumer("memory://signalled").subscribe("q") as again:
    back = [d.message_id for d in again.poll(0.5, max_messages=100)]
print(json.dumps({
    "ids": ids, "handled": handled, "acked": stats.acked, "recorded": recorded,
    "effects": effects, "back": back, "restored": restored,
}))
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_async_run_after_its_open_transactions(
    tmp_path: Path, signum: int
) -> None:
    """SIGTERM or SIGINT through the loop's signal handlers while a handler is inside
    its transaction: it ends and commits, then the run stops; every message is either
    handled once (effect, record, acknowledgement) or back on the broker untouched."""
    script = tmp_path / "run.py"
    script.write_text(_SIGNALLED_RUN)
    report = signalled(script, str(tmp_path / "app.db"), signum=signum)
    handled = report["handled"]
    assert 0 < len(handled) < 30 and report["acked"] == len(handled)
    assert sorted(handled) == report["recorded"] == sorted(report["effects"])
    # None lost, none acknowledged unhandled: each was handled then acked, or is back.
    assert sorted(handled + report["back"]) == sorted(report["ids"])
    assert report["restored"]
