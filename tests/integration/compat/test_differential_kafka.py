"""confluent_kafka and msgsafe.compat.confluent_kafka side by side on the session Kafka
cluster: each scenario runs with each client (the real one with ``acks=all`` and
idempotence, the guarantees the wrapper enforces) and the wrapper must observe what the
real client observes (see ``differential.py``)."""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import confluent_kafka as real_ck
import pytest

from msgsafe.cluster.kafka import KafkaCluster
from msgsafe.compat import confluent_kafka as wrapped_ck
from msgsafe.message import MESSAGE_ID_HEADER
from tests.integration.compat.differential import Side, differ, new_topic, sides
from tests.support.kafka_ledger import earliest_consumer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


def _side(name: str, cluster: KafkaCluster, tmp_path: Path) -> Side:
    base: dict[str, Any] = {
        "bootstrap.servers": cluster.bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "message.timeout.ms": 20_000,
    }
    if name == "real":
        return Side("real", real_ck, lambda **extra: real_ck.Producer({**base, **extra}), base)
    outbox = str(tmp_path / f"outbox-{uuid.uuid4().hex[:6]}.sqlite3")
    return Side(
        "wrapper",
        wrapped_ck,
        lambda **extra: wrapped_ck.Producer({**base, "msgsafe.outbox": outbox, **extra}),
        base,
    )


side, real = sides(_side, "kafka_cluster")


def _topic(cluster: KafkaCluster, partitions: int = 3) -> str:
    return new_topic(cluster, "diff", partitions)


def _consume(cluster: KafkaCluster, topic: str, count: int) -> list[Any]:
    """The first ``count`` records of ``topic`` (in partition order) as a real consumer
    sees them: value, key and headers."""
    consumer = earliest_consumer(cluster.bootstrap, "diff")
    consumer.subscribe([topic])
    records: list[Any] = []
    deadline = time.monotonic() + 60
    try:
        while len(records) < count:
            assert time.monotonic() < deadline, f"only {len(records)} of {count} consumed"
            msg = consumer.poll(0.5)
            if msg is None or msg.error() is not None:
                continue
            records.append((msg.value(), msg.key(), msg.headers()))
    finally:
        consumer.close()
    return records


def _code(err: Any) -> Any:
    return None if err is None else err.name()


# --- constructors and errors ---------------------------------------------------------------


def test_constructors_and_a_bad_setting(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        conf = dict(s.config)
        if s.wrapped:
            conf["msgsafe.outbox"] = False
        seen: list[Any] = []
        for make in (
            lambda: s.module.Producer(**conf),
            lambda: s.module.Producer(conf, logger=logging.getLogger("legacy")),
            lambda: s.module.Producer(
                {**conf, "default.topic.config": {"message.timeout.ms": 5000}}
            ),
        ):
            producer = make()
            seen.append((producer.flush(10), len(producer)))
            producer.close()
        try:
            s.module.Producer({**conf, "no.such.setting": "1"})
        except s.module.KafkaException as exc:
            seen.append(("KafkaException", exc.args[0].name()))
        reports: list[Any] = []
        bare = s.module.Producer({"message.timeout.ms": 200})  # no bootstrap.servers
        seen.append(bare.produce("t", b"v", on_delivery=lambda e, m: reports.append(_code(e))))
        seen.append((bare.flush(10), reports))
        return seen

    differ(request, side, real, scenario)


def test_a_message_over_the_default_size_limit(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """No ``message.max.bytes`` given: librdkafka's default (1,000,000 bytes) holds, and a
    larger value is refused in ``produce()`` itself; one under it is delivered."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        producer = s.make()
        seen: list[Any] = []
        reports: list[Any] = []
        for size in (1_000_001, 900_000):
            try:
                producer.produce(
                    topic, b"x" * size, on_delivery=lambda e, m: reports.append(_code(e))
                )
                seen.append((size, "queued"))
            except s.module.KafkaException as exc:
                seen.append((size, "KafkaException", exc.args[0].name()))
        seen.append((producer.flush(30), reports))
        return seen

    differ(request, side, real, scenario)


# --- produce, callbacks, flush, close ------------------------------------------------------


def test_reports_in_order_return_values_and_closing(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        seen: list[Any] = []
        producer = s.make()
        for i in range(20):
            seen.append(
                producer.produce(
                    topic,
                    f"v{i}".encode(),
                    key=b"one-key",
                    on_delivery=lambda e, m: seen.append((_code(e), m.topic(), m.value())),
                )
            )
        seen.append(("flush", producer.flush(30), "len", len(producer), "poll", producer.poll(0)))
        seen.append(("close", producer.close()))
        for call in (
            lambda: producer.produce(topic, b"x"),
            producer.flush,
            lambda: producer.poll(0),
        ):
            try:
                call()
            except RuntimeError as exc:
                seen.append(("RuntimeError", str(exc)))
        with s.make() as in_block:
            in_block.produce(topic, b"in a with block")
        try:
            in_block.produce(topic, b"after the block")
        except RuntimeError:
            seen.append("closed by the with block")
        seen.append(len(_consume(kafka_cluster, topic, 21)))
        return [
            item if not isinstance(item, tuple) or item[1] != topic else item[::2] for item in seen
        ]

    differ(request, side, real, scenario)


def test_callback_exceptions_propagate_from_poll_and_flush(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        seen: list[Any] = []

        def boom(err: Any, msg: Any) -> None:
            raise ValueError(f"callback for {msg.value()!r}")

        producer.produce(topic, b"a", on_delivery=boom)
        try:
            producer.flush(30)
        except ValueError as exc:
            seen.append(("flush raised", str(exc)))
        producer.produce(topic, b"b", on_delivery=boom)
        deadline = time.monotonic() + 30
        while True:
            assert time.monotonic() < deadline, "no report within 30 s"
            try:
                if producer.poll(0.5):
                    break
            except ValueError as exc:
                seen.append(("poll raised", str(exc)))
                break
        seen.append(("then", producer.flush(30), len(producer)))
        producer.close()
        return seen

    differ(request, side, real, scenario)


def test_produce_batch_purge_and_credentials(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        reports: list[Any] = []
        batch = [{"value": b"a"}, {"value": b"b", "key": b"k"}, {"value": "c"}]
        queued = producer.produce_batch(
            topic, batch, on_delivery=lambda e, m: reports.append((_code(e), m.value()))
        )
        errors = [m.get("_error") for m in batch]
        flushed = producer.flush(30)
        credentials = producer.set_sasl_credentials("user", "secret")
        producer.close()
        return [
            queued,
            errors,
            flushed,
            reports,
            credentials,
            len(_consume(kafka_cluster, topic, 3)),
        ]

    differ(request, side, real, scenario)


def test_purge(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """Intended difference: purge() drops messages librdkafka had not sent yet (their
    reports say _PURGE_QUEUE); the wrapper drops nothing, every message is delivered."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make(**{"linger.ms": 2000})  # still queued when purge() runs
        reports: list[Any] = []
        for i in range(3):
            producer.produce(topic, f"{i}", on_delivery=lambda e, m: reports.append(_code(e)))
        seen = [producer.purge(), producer.flush(30), reports]
        producer.close()
        return seen

    observed = differ(request, side, real, scenario, intended=lambda r: [None, 0, [None] * 3])
    if not side.wrapped:
        assert observed == [None, 0, ["_PURGE_QUEUE"] * 3]


# --- data in transit ------------------------------------------------------------------------


def test_headers_as_consumed(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        producer.produce(
            topic,
            b"list",
            key=b"k",
            headers=[
                ("dup", b"1"),
                ("dup", b"2"),
                ("none", None),
                ("raw", b"\xff\xfe\x00"),
                ("text", "é"),
            ],
        )
        producer.produce(topic, b"dict", key=b"k", headers={"a": "x", "b": None})
        producer.produce(topic, b"none", key=b"k")
        try:
            producer.produce(topic, b"bad", headers={"n": 1})
        except TypeError as exc:
            refused = ("TypeError", str(exc))
        producer.flush(30)
        producer.close()
        records = _consume(kafka_cluster, topic, 3)
        # Intended addition: msgsafe's id header, first; the user's headers follow unchanged.
        return [
            (value, key, [h for h in (headers or []) if h[0] != MESSAGE_ID_HEADER] or None)
            for value, key, headers in records
        ] + [refused]

    differ(request, side, real, scenario)


def test_tombstones_as_consumed(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """value=None is a tombstone (a null value, what a compacted topic deletes by), b""
    an empty value: the reports and a real consumer tell the two apart."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster, partitions=1)
        producer = s.make()
        reports: list[Any] = []

        def report(err: Any, msg: Any) -> None:
            reports.append((_code(err), msg.value(), msg.key()))

        producer.produce(topic, None, key=b"deleted", on_delivery=report)
        producer.produce(topic, b"", key=b"empty", on_delivery=report)
        producer.produce(topic, value=None, on_delivery=report)  # a tombstone without key
        producer.produce(topic, key="text-key", on_delivery=report)  # value defaults to None
        batch = [{"value": None, "key": b"b1"}, {"value": b"", "key": b"b2"}]
        queued = producer.produce_batch(topic, batch, on_delivery=report)
        flushed = producer.flush(30)
        producer.close()
        records = [(value, key) for value, key, _ in _consume(kafka_cluster, topic, 6)]
        return [queued, [m.get("_error") for m in batch], flushed, reports, records]

    observed = differ(request, side, real, scenario)
    assert observed[-1][:2] == [(None, b"deleted"), (b"", b"empty")]


def _closed_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_error_cb_when_no_broker_answers(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """error_cb gets librdkafka's connection events (_TRANSPORT, _ALL_BROKERS_DOWN) from
    poll()/flush(), on the thread that calls them. The message's own report differs on
    purpose (stored, not _MSG_TIMED_OUT) and is not compared here."""

    def scenario(s: Side) -> Any:
        codes: set[str] = set()
        threads: set[bool] = set()
        caller = threading.get_ident()

        def on_error(err: Any) -> None:
            codes.add(err.name())
            threads.add(threading.get_ident() == caller)

        wanted = {"_TRANSPORT", "_ALL_BROKERS_DOWN"}
        producer = s.make(
            **{
                "bootstrap.servers": f"127.0.0.1:{_closed_port()}",
                "error_cb": on_error,
                "message.timeout.ms": 3000,
            }
        )
        producer.produce("nowhere", b"x", key=b"k")
        deadline = time.monotonic() + 20
        while not wanted <= codes and time.monotonic() < deadline:
            producer.poll(0.2)
        producer.flush(10)
        # The wrapper's close() gives the outbox (no broker answers) up to its timeout.
        producer.close(0) if s.wrapped else producer.close()
        return [sorted(codes & wanted), sorted(threads)]

    codes, on_caller = differ(request, side, real, scenario)
    assert codes and on_caller == [True]


# --- threads ---------------------------------------------------------------------------------


def test_poll_flush_and_produce_from_several_threads(
    request: pytest.FixtureRequest, side: Side, real: Side, kafka_cluster: KafkaCluster
) -> None:
    """Four threads flush (no timeout), two poll, one produces; all return within 60 s."""

    def scenario(s: Side) -> Any:
        topic = _topic(kafka_cluster)
        producer = s.make()
        served = [0]
        lock = threading.Lock()

        def count(err: Any, msg: Any) -> None:
            with lock:
                served[0] += err is None

        for i in range(300):
            producer.produce(topic, f"{i}", key=str(i % 7), on_delivery=count)

        def poll_until_empty() -> None:
            while len(producer) > 0:
                producer.poll(0.05)

        def produce_more() -> None:
            for i in range(100):
                producer.produce(topic, f"late{i}", on_delivery=count)

        work = [producer.flush] * 4 + [poll_until_empty] * 2 + [produce_more]
        threads = [threading.Thread(target=w, daemon=True) for w in work]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        returned = not any(t.is_alive() for t in threads)
        final = producer.flush(60)
        producer.close()
        return [returned, final, served[0], len(_consume(kafka_cluster, topic, 400))]

    assert differ(request, side, real, scenario) == [True, 0, 400, 400]


def _without(topic: str, item: Any) -> Any:
    if isinstance(item, tuple) and len(item) == 3 and item[1] == topic:
        return (item[0], item[2])
    return item
