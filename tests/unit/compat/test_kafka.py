"""msgsafe.compat.confluent_kafka: config mapping, and the produce/poll/flush contract
against the memory broker (callbacks on the polling thread, stored and failed reports)."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException

from msgsafe.compat import CompatWarning
from msgsafe.compat._kafka_config import translate_config
from msgsafe.compat.confluent_kafka import OFFSET_INVALID, STATUS_HEADER, Producer
from msgsafe.endpoints import parse_url
from msgsafe.errors import ConfigurationError
from msgsafe.testing import MemoryBroker

Report = tuple[KafkaError | None, object, int]


def _producer(
    broker: MemoryBroker, tmp_path: Path, extra: dict[str, object] | None = None
) -> Producer:
    config: dict[str, object] = {
        "bootstrap.servers": "127.0.0.1:1",
        "msgsafe.outbox": str(tmp_path / "outbox.sqlite3"),
        "message.timeout.ms": 2000,
    }
    config.update(extra or {})
    return Producer(config, _url=f"memory://{broker.name}")


class Recorder:
    def __init__(self) -> None:
        self.reports: list[Report] = []

    def __call__(self, err: KafkaError | None, msg: object) -> None:
        self.reports.append((err, msg, threading.get_ident()))


# --- config --------------------------------------------------------------------------------


def test_bootstrap_and_security_become_the_url() -> None:
    cfg = translate_config({"bootstrap.servers": "PLAINTEXT://a:9092, b:9093"})
    assert cfg.url == "kafka://a:9092,b:9093"
    cfg = translate_config({"bootstrap.servers": "a:9093", "security.protocol": "SSL"})
    assert cfg.url == "kafka+ssl://a:9093"
    cfg = translate_config(
        {
            "bootstrap.servers": "a:9093",
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": "SCRAM-SHA-512",
            "sasl.username": "u@x",
            "sasl.password": "p:w/d",
        }
    )
    url = parse_url(cfg.url)
    assert (url.scheme, url.username, url.password and url.password.reveal()) == (
        "kafka+ssl",
        "u@x",
        "p:w/d",
    )
    assert cfg.options["sasl_mechanism"] == "SCRAM-SHA-512"
    assert "p:w/d" not in repr(cfg)


def test_weak_settings_are_overridden_with_a_warning() -> None:
    cfg = translate_config(
        {"bootstrap.servers": "a:1", "acks": 1, "enable.idempotence": False, "linger.ms": 20}
    )
    assert "librdkafka" not in cfg.options  # neither acks nor idempotence passes through
    assert cfg.options["linger_ms"] == 20.0
    assert any("acks=all" in w for w in cfg.warnings)
    assert any("idempotence" in w for w in cfg.warnings)
    with pytest.warns(CompatWarning, match="acks=all"):
        Producer({"bootstrap.servers": "a:1", "acks": "0", "msgsafe.outbox": False})


def test_safe_settings_warn_nothing_and_the_rest_passes_through() -> None:
    cfg = translate_config(
        {
            "bootstrap.servers": "a:1",
            "acks": "all",
            "enable.idempotence": True,
            "message.timeout.ms": 5000,
            "queue.buffering.max.messages": 500,
            "socket.keepalive.enable": True,
            "partitioner": "murmur2_random",
        }
    )
    assert cfg.warnings == ()
    assert cfg.options["confirm_timeout"] == 5.0
    assert cfg.options["max_in_flight"] == 500 and cfg.queue_max == 500
    assert cfg.options["librdkafka"] == {
        "socket.keepalive.enable": "true",
        "partitioner": "murmur2_random",
    }


def test_unsupported_settings_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="transactions"):
        translate_config({"bootstrap.servers": "a:1", "transactional.id": "t"})
    assert translate_config({"acks": "all"}).url == ""  # made without brokers, as librdkafka
    with pytest.raises(ConfigurationError, match=r"sasl\.username"):
        translate_config({"bootstrap.servers": "a:1", "security.protocol": "SASL_PLAINTEXT"})


# --- produce / poll / flush ----------------------------------------------------------------


def test_confirmed_reports_are_served_on_the_polling_thread(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    rec = Recorder()
    p = _producer(memory_broker, tmp_path)
    for i in range(50):
        p.produce("t", f"v{i}", key=f"k{i % 3}", headers={"h": b"1"}, on_delivery=rec)
    assert len(rec.reports) == 0  # nothing runs before poll()
    assert p.flush(5) == 0 and len(p) == 0
    assert len(rec.reports) == 50
    assert {tid for _, _, tid in rec.reports} == {threading.get_ident()}
    err, msg, _ = rec.reports[0]
    assert err is None
    assert msg.topic() == "t" and msg.value() == b"v0" and msg.key() == b"k0"  # type: ignore[attr-defined]
    assert msg.error() is None and not msg.stored()  # type: ignore[attr-defined]
    assert (STATUS_HEADER, b"confirmed") in msg.headers()  # type: ignore[attr-defined]
    assert ("h", b"1") in msg.headers()  # type: ignore[attr-defined]
    ids = [m.message_id() for _, m, _ in rec.reports]  # type: ignore[attr-defined]
    assert sorted(ids) == sorted(memory_broker.ids("t"))
    p.close()


def test_poll_counts_and_len(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    rec = Recorder()
    p = _producer(memory_broker, tmp_path, {"on_delivery": rec})  # default callback from the config
    p.produce("t", b"a")
    p.produce("t", b"b", callback=rec)
    assert len(p) == 2
    served = 0
    while served < 2:
        served += p.poll(1.0)
    assert len(p) == 0 and len(rec.reports) == 2
    assert p.poll(0) == 0
    p.close()


def test_stored_message_reports_offset_invalid_and_is_forwarded(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    rec = Recorder()
    p = _producer(memory_broker, tmp_path)
    memory_broker.refuse_writes()
    p.produce("t", b"stored-one", on_delivery=rec)
    while not rec.reports:
        p.poll(1.0)
    err, msg, _ = rec.reports[0]
    assert err is None
    assert msg.offset() == OFFSET_INVALID == -1001  # type: ignore[attr-defined]
    assert msg.stored()  # type: ignore[attr-defined]
    assert (STATUS_HEADER, b"stored") in msg.headers()  # type: ignore[attr-defined]
    assert p.pending() == 1 and memory_broker.ids("t") == []
    memory_broker.accept_writes()
    assert p.flush(10) == 0
    assert p.pending() == 0
    assert memory_broker.ids("t") == [msg.message_id()]  # type: ignore[attr-defined]
    p.close()


def test_permanent_error_reaches_the_callback_as_a_kafka_error(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    rec = Recorder()
    p = _producer(memory_broker, tmp_path)
    memory_broker.reject_next(1)
    p.produce("t", b"x", on_delivery=rec)
    p.flush(5)
    err, msg, _ = rec.reports[0]
    assert isinstance(err, KafkaError)
    assert err.code() == KafkaError.INVALID_RECORD and not err.retriable()
    assert msg.error() is err  # type: ignore[attr-defined]
    assert (STATUS_HEADER, b"failed") in msg.headers()  # type: ignore[attr-defined]
    p.close()


def test_without_an_outbox_a_transient_failure_is_a_retriable_timeout(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    rec = Recorder()
    p = _producer(memory_broker, tmp_path, {"msgsafe.outbox": False})
    memory_broker.refuse_writes()
    p.produce("t", b"x", on_delivery=rec)
    p.flush(5)
    err = rec.reports[0][0]
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT and err.retriable()
    p.close()


def test_too_large_raises_like_confluent(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    p = _producer(memory_broker, tmp_path, {"message.max.bytes": 10})
    rec = Recorder()
    with pytest.raises(KafkaException) as raised:  # refused in produce(), as librdkafka does
        p.produce("t", b"x" * 100, on_delivery=rec)
    assert raised.value.args[0].code() == KafkaError.MSG_SIZE_TOO_LARGE
    with pytest.raises(KafkaException):  # headers count too
        p.produce("t", b"x", on_delivery=rec, headers=[("h", b"y" * 20)])
    p.produce("t", b"x" * 5, on_delivery=rec)
    assert p.flush(5) == 0 and len(rec.reports) == 1 and rec.reports[0][0] is None
    p.close()


def test_buffer_error_when_reports_are_not_served(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    p = _producer(memory_broker, tmp_path, {"queue.buffering.max.messages": 3})
    for _ in range(3):
        p.produce("t", b"x")
    with pytest.raises(BufferError):
        p.produce("t", b"x")
    assert p.flush(5) == 0
    p.produce("t", b"x")  # room again
    p.close()


def test_argument_errors(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    p = _producer(memory_broker, tmp_path)
    with pytest.warns(CompatWarning, match="partition"):
        p.produce("t", b"x", partition=2)  # placed by key, as the warning says
    with pytest.raises(TypeError, match="partition"):
        p.produce("t", b"x", partition="2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="tombstone"):
        p.produce("t", None)  # memory:// has no null value; Kafka takes it (integration)
    with pytest.raises(TypeError):
        p.produce("t", 42)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        p.produce("", b"x")
    with pytest.warns(CompatWarning, match="timestamp"):
        p.produce("t", b"x", timestamp=1234)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p.produce("t", b"x", timestamp=1234)  # warned once only
    assert len(p) == 3
    p.close()
    with pytest.raises(RuntimeError, match="closed"):  # as confluent-kafka
        p.produce("t", b"after close")


def test_callback_exception_propagates_from_poll(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    def boom(err: object, msg: object) -> None:
        raise RuntimeError("user bug")

    p = _producer(memory_broker, tmp_path)
    p.produce("t", b"x", on_delivery=boom)
    with pytest.raises(RuntimeError, match="user bug"):
        p.flush(5)
    assert len(p) == 0
    p.close()


# --- the constructor and the rest of the surface ----------------------------------------


def test_keyword_config_default_topic_config_and_logger(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    import logging

    with warnings.catch_warnings():
        warnings.simplefilter("error", CompatWarning)
        producer = Producer(
            **{"bootstrap.servers": "127.0.0.1:1", "msgsafe.outbox": str(tmp_path / "o.db")},
            logger=logging.getLogger("legacy"),
            _url=f"memory://{memory_broker.name}",
        )
    assert producer.close() is True
    merged = Producer(
        {"bootstrap.servers": "127.0.0.1:1", "default.topic.config": {"message.timeout.ms": 1234}},
        _url=f"memory://{memory_broker.name}",
    )
    assert merged._confirm_timeout == 1.234
    merged.close()


def test_a_bad_setting_raises_kafka_exception_with_invalid_arg() -> None:
    with pytest.raises(KafkaException) as info:
        Producer({"bootstrap.servers": "127.0.0.1:1", "bogus.setting": 1, "msgsafe.outbox": False})
    assert info.value.args[0].code() == KafkaError._INVALID_ARG


def test_without_bootstrap_servers_made_and_failing_on_use() -> None:
    producer = Producer({"message.timeout.ms": 100})
    record = Recorder()
    producer.produce("t", b"v", on_delivery=record)
    assert producer.flush(5) == 0
    [(err, _msg, _thread)] = record.reports
    assert err is not None and err.code() == KafkaError._MSG_TIMED_OUT
    producer.close()


def test_closed_producer_raises_runtime_error_and_with_closes(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    with _producer(memory_broker, tmp_path) as producer:
        producer.produce("t", b"v")
    assert memory_broker.ids("t") != []  # leaving the block flushed
    for call in (lambda: producer.produce("t", b"x"), lambda: producer.poll(0), producer.flush):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    assert len(producer) == 0 and producer.close() is True


def test_produce_batch_purge_and_credentials(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    producer = _producer(memory_broker, tmp_path)
    record = Recorder()
    messages: list[dict[str, object]] = [
        {"value": b"a"},
        {"value": b"b", "key": b"k", "headers": [("h", b"1"), ("h", None)]},
        {"value": b"c", "partition": 3},
    ]
    with pytest.warns(CompatWarning, match="partition"):
        assert producer.produce_batch("t", messages, on_delivery=record) == 3
    assert not any("_error" in message for message in messages)
    with pytest.raises(TypeError, match="index 1 must be a dict"):
        producer.produce_batch("t", [{"value": b"ok"}, "not a dict"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="value at index 0"):
        producer.produce_batch("t", [{"value": 123}])
    with pytest.raises(TypeError, match="expected configuration dict"):
        Producer()
    with pytest.warns(CompatWarning, match="purge"):
        assert producer.purge() is None
    with pytest.warns(CompatWarning, match="list_topics"):
        producer.set_sasl_credentials("u", "p")
    assert producer.flush(5) == 0 and len(record.reports) == 3
    assert [m.body for m in memory_broker.messages("t")] == [b"a", b"b", b"c"]
    producer.close()


@pytest.mark.timeout(120)
def test_flush_returns_while_other_threads_poll_flush_and_produce(
    memory_broker: MemoryBroker, tmp_path: Path
) -> None:
    """Each round: 200 messages, then flush() (no timeout) on four threads while two
    more poll and one produces 50 more, confirms arriving over time (5 ms each); every
    flush must return within 10 s."""
    memory_broker.delay_confirms(0.005)
    producer = _producer(memory_broker, tmp_path)
    errors: list[BaseException] = []

    def guarded(work: Callable[[], object]) -> Callable[[], None]:
        def run() -> None:
            try:
                work()
            except BaseException as exc:  # pragma: no cover - reported below
                errors.append(exc)

        return run

    def poll_until_empty() -> None:
        while len(producer) > 0:
            producer.poll(0.01)

    def produce_more() -> None:
        for _ in range(50):
            producer.produce("t", b"late")

    for _ in range(5):
        for _ in range(200):
            producer.produce("t", b"x")
        work: list[Callable[[], object]] = [producer.flush] * 4
        work += [poll_until_empty, poll_until_empty, produce_more]
        threads = [threading.Thread(target=guarded(w), daemon=True) for w in work]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not any(t.is_alive() for t in threads), "flush() did not return"
        assert errors == []
    assert producer.flush(10) == 0
    assert len(memory_broker.ids("t")) == 5 * 250
    producer.close()
