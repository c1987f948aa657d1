"""msgsafe.compat.kafka_python: config translation, send()'s checks, and the futures'
contract against the memory broker (resolved on the reporting thread, stored and failed
messages, get(timeout), callbacks, flush, close)."""

from __future__ import annotations

import json
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kafka
import kafka.errors as kafka_errors
import pytest
from confluent_kafka import KafkaError
from kafka.producer.future import FutureRecordMetadata as RealFuture
from kafka.producer.future import RecordMetadata

from msgsafe.compat import CompatWarning
from msgsafe.compat import kafka_python as kp
from msgsafe.compat._kafka_python_config import KAFKA_PYTHON_3, translate
from msgsafe.compat._kafka_python_future import (
    FutureRecordMetadata,
    Outcomes,
    StoredRecordMetadata,
    kafka_python_error,
)
from msgsafe.testing import MemoryBroker


@pytest.fixture
def producer(memory_broker: MemoryBroker, tmp_path: Path) -> Iterator[kp.KafkaProducer]:
    p = _producer(memory_broker, tmp_path)
    try:
        yield p
    finally:
        p.close(5)


def _producer(broker: MemoryBroker, tmp_path: Path, **configs: Any) -> kp.KafkaProducer:
    configs.setdefault("msgsafe_outbox", str(tmp_path / "outbox.sqlite3"))
    configs.setdefault("delivery_timeout_ms", 2000)
    return kp.KafkaProducer(
        bootstrap_servers=["127.0.0.1:1"], _url=f"memory://{broker.name}", **configs
    )


# --- config --------------------------------------------------------------------------------


def test_servers_as_string_or_list_and_the_defaults() -> None:
    assert translate({}).librdkafka["bootstrap.servers"] == "localhost"
    got = translate({"bootstrap_servers": ["a:9092", " b:9093 "]}).librdkafka
    assert got["bootstrap.servers"] == "a:9092,b:9093"
    assert got["partitioner"] == "murmur2_random"  # kafka-python's default placement
    assert got["message.max.bytes"] == 1048576  # kafka-python's max_request_size
    assert translate({"bootstrap_servers": "a:1,b:2"}).librdkafka["bootstrap.servers"] == "a:1,b:2"
    with pytest.raises(kafka_errors.KafkaConfigurationError):
        translate({"bootstrap_servers": 5})


def test_settings_librdkafka_has_are_translated_and_defaults_are_not_forced() -> None:
    got = translate(
        {
            "linger_ms": 20,
            "batch_size": 1000,
            "compression_type": "gzip",
            "delivery_timeout_ms": 30000,
            "security_protocol": "SASL_SSL",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "u",
            "sasl_plain_password": "p",
            "ssl_cafile": "/ca.pem",
            "ssl_check_hostname": False,
            "client_id": "app",
        }
    )
    lib = got.librdkafka
    assert lib["linger.ms"] == 20 and lib["batch.size"] == 1000
    assert lib["compression.type"] == "gzip" and lib["message.timeout.ms"] == 30000
    assert lib["sasl.username"] == "u" and lib["sasl.password"] == "p"
    assert lib["ssl.ca.location"] == "/ca.pem"
    assert lib["ssl.endpoint.identification.algorithm"] == "none"
    assert lib["client.id"] == "app" and got.config["client_id"] == "app"
    assert "p" not in repr(got)  # credentials never in the repr
    # kafka-python's own defaults (120 s delivery timeout ...) do not replace msgsafe's.
    assert "message.timeout.ms" not in translate({}).librdkafka


def test_weak_settings_are_overridden_with_a_warning() -> None:
    got = translate({"acks": 1, "enable_idempotence": False, "retries": 0})
    assert len(got.warnings) == 3
    assert got.config["acks"] == -1 and got.config["enable_idempotence"] is True
    assert translate({"acks": "all"}).warnings == ()
    lowered = translate({"max_in_flight_requests_per_connection": 10})
    assert lowered.librdkafka["max.in.flight"] == 5 and lowered.warnings


def test_explicit_idempotence_with_a_conflict_raises_as_kafka_python_3() -> None:
    with pytest.raises(kafka_errors.KafkaConfigurationError, match="acks=1"):
        translate({"enable_idempotence": True, "acks": 1})
    with pytest.raises(kafka_errors.KafkaConfigurationError, match="retries=0"):
        translate({"enable_idempotence": True, "retries": 0})


def test_unknown_and_unsupported_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="Unrecognized configs"):
        translate({"no_such_setting": 1})
    with pytest.raises(kafka_errors.KafkaConfigurationError, match="transactions"):
        translate({"transactional_id": "t"})
    with pytest.raises(kafka_errors.KafkaConfigurationError, match="OAUTHBEARER"):
        translate({"sasl_oauth_token_provider": object()})
    # kafka-python's own networking knobs are accepted (and unused).
    assert translate({"api_version": (4, 0), "metrics_enabled": False}).warnings == ()


def test_a_custom_partitioner_is_not_called() -> None:
    assert translate({"partitioner": kafka.partitioner.DefaultPartitioner()}).warnings == ()
    assert translate({"partitioner": lambda *a: 0}).warnings


def test_serializers_are_called_as_the_installed_kafka_python_calls_them() -> None:
    seen: list[Any] = []

    class Ser(kafka.serializer.Serializer):  # type: ignore[misc]
        def serialize(self, topic: str, headers: Any, data: Any = None) -> bytes:
            seen.append((topic, headers, data))
            return b"s"

    got = translate({"value_serializer": Ser()})
    assert got.value_serializer is not None
    assert got.value_serializer("t", [("h", b"1")], "v") == b"s"
    assert seen == ([("t", [("h", b"1")], "v")] if KAFKA_PYTHON_3 else [("t", "v", None)])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain = translate({"key_serializer": str.encode}).key_serializer
    assert plain is not None and plain("t", [], "k") == b"k"
    assert [w.category for w in caught] == ([DeprecationWarning] if KAFKA_PYTHON_3 else [])


# --- errors and metadata -------------------------------------------------------------------


def test_kafka_errors_become_kafka_python_exceptions() -> None:
    too_large = kafka_python_error(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE, "big"))
    assert isinstance(too_large, kafka_errors.MessageSizeTooLargeError)
    timed_out = kafka_python_error(KafkaError(KafkaError._MSG_TIMED_OUT, "late"))
    assert isinstance(timed_out, kafka_errors.KafkaTimeoutError)
    other = kafka_python_error(KafkaError(KafkaError._FS, "disk"))
    assert type(other) is kafka_errors.KafkaError and "disk" in str(other)


def test_the_future_is_kafka_pythons_and_stored_metadata_is_record_metadata() -> None:
    future = FutureRecordMetadata("t", 1, 2, -1, 123, Outcomes())
    assert isinstance(future, RealFuture)
    stored = StoredRecordMetadata("t", -1, kafka.TopicPartition("t", -1), -1, 5, None, 1, 2, -1)
    assert isinstance(stored, RecordMetadata) and stored.stored
    assert stored == RecordMetadata("t", -1, kafka.TopicPartition("t", -1), -1, 5, None, 1, 2, -1)
    with pytest.raises(kafka_errors.KafkaTimeoutError):
        future.get(timeout=0.01)


# --- send / futures --------------------------------------------------------------------------


def test_send_resolves_futures_on_the_reporting_thread(
    producer: kp.KafkaProducer, memory_broker: MemoryBroker
) -> None:
    threads: list[int] = []
    values: list[Any] = []
    futures = []
    for i in range(20):
        f = producer.send("t", f"v{i}".encode(), key=b"k", headers=[("h", b"12")])
        f.add_callback(lambda md: (threads.append(threading.get_ident()), values.append(md)))
        futures.append(f)
    producer.flush(10)
    assert all(f.is_done and f.succeeded() for f in futures)
    assert threading.get_ident() not in threads or len(threads) == 20  # flush may serve too
    md = futures[0].get(1)
    assert isinstance(md, RecordMetadata) and not isinstance(md, StoredRecordMetadata)
    assert md.topic == "t" and md.serialized_key_size == 1 and md.serialized_value_size == 2
    assert md.serialized_header_size == 3 and md.checksum is None
    assert not futures[0].stored()
    ids = [str(f.message_id()) for f in futures]
    assert sorted(ids) == sorted(memory_broker.ids("t"))


def test_a_stored_message_succeeds_with_stored_metadata(
    producer: kp.KafkaProducer, memory_broker: MemoryBroker
) -> None:
    memory_broker.refuse_writes()
    future = producer.send("t", b"x", key=b"k")
    md = future.get(10)
    assert isinstance(md, StoredRecordMetadata) and md.offset == -1 and md.partition == -1
    assert future.stored() and producer.pending() == 1
    assert producer.metrics()["msgsafe"]["record-stored-total"] == 1  # type: ignore[index]
    memory_broker.accept_writes()


def test_a_permanent_failure_fails_the_future_and_calls_errbacks(
    producer: kp.KafkaProducer, memory_broker: MemoryBroker
) -> None:
    memory_broker.reject_next(1)
    errors: list[BaseException] = []
    future = producer.send("t", b"x").add_errback(errors.append)
    with pytest.raises(kafka_errors.KafkaError):
        future.get(10)
    assert future.failed() and errors == [future.exception]


#: kafka-python 2.x checks with ``assert`` what 3.x raises ValueError or TypeError for.
MISUSE = (
    {ValueError: ValueError, TypeError: TypeError}
    if KAFKA_PYTHON_3
    else {
        ValueError: AssertionError,
        TypeError: AssertionError,
    }
)


def test_send_checks_its_arguments_as_kafka_python(producer: kp.KafkaProducer) -> None:
    with pytest.raises(MISUSE[ValueError], match="key or value"):
        producer.send("t")
    with pytest.raises(MISUSE[TypeError], match="list-type"):
        producer.send("t", b"v", headers={"h": b"1"})  # type: ignore[arg-type]
    with pytest.raises(MISUSE[TypeError], match=r"\(str, bytes\)"):
        producer.send("t", b"v", headers=[("h", "text")])  # type: ignore[list-item]
    with pytest.raises(MISUSE[TypeError], match="serialized value"):
        producer.send("t", "not bytes")
    with pytest.raises(ValueError, match=">= 0"):
        producer.send("t", b"v", partition=-2)
    if KAFKA_PYTHON_3:
        with pytest.raises(kafka_errors.MessageSizeTooLargeError):
            producer.send("t", b"x" * 2_000_000)
    else:  # 2.x: the future it returns has failed
        too_large = producer.send("t", b"x" * 2_000_000)
        assert too_large.failed()
        with pytest.raises(kafka_errors.MessageSizeTooLargeError):
            too_large.get(0)
    with pytest.warns(CompatWarning, match="partition"):
        producer.send("t", b"v", partition=1).get(10)


def test_serializers(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    if KAFKA_PYTHON_3:
        serializers = {
            "key_serializer": kafka.serializer.DefaultSerializer(),
            "value_serializer": kafka.serializer.JsonSerializer(),
        }
    else:  # 2.x has no serializer classes; plain callables take the data
        serializers = {
            "key_serializer": str.encode,
            "value_serializer": lambda data: json.dumps(data).encode(),
        }
    p = _producer(memory_broker, tmp_path, **serializers)
    try:
        md = p.send("t", {"a": 1}, key="k").get(10)
        assert md.serialized_value_size == len(b'{"a": 1}') and md.serialized_key_size == 1
    finally:
        p.close(5)


def test_flush_and_close(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    p = _producer(memory_broker, tmp_path)
    futures = [p.send("t", b"v") for _ in range(100)]
    p.close()
    assert all(f.is_done for f in futures)
    assert not p.is_open
    p.close()  # again: nothing
    with pytest.raises(kafka_errors.IllegalStateError if KAFKA_PYTHON_3 else AssertionError):
        p.send("t", b"v")
    with pytest.raises(ValueError, match="Invalid timeout"):
        _producer(memory_broker, tmp_path, msgsafe_outbox=False).close(-1)


def test_close_from_a_callback_does_not_wait(memory_broker: MemoryBroker, tmp_path: Path) -> None:
    p = _producer(memory_broker, tmp_path)
    closed = threading.Event()
    p.send("t", b"v").add_callback(lambda _md: (p.close(10), closed.set()))
    assert closed.wait(10) and not p.is_open


def test_transactions_are_not_enabled(producer: kp.KafkaProducer) -> None:
    for call in (producer.init_transactions, producer.begin_transaction):
        with pytest.raises(kafka_errors.IllegalStateError):
            call()


def test_other_names_are_kafka_pythons() -> None:
    assert kp.KafkaConsumer is kafka.KafkaConsumer and kp.TopicPartition is kafka.TopicPartition
    assert kp.errors is kafka_errors and kp.KafkaAdminClient is kafka.KafkaAdminClient
    assert kp.__all__ == sorted(kp.__all__)
