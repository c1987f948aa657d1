"""The Kafka client (:mod:`msgsafe.adapters.kafka.client`) on its own: runs handed to
librdkafka in one call, where a run stops, reports counted per run or kept for failures
only, the record headers, and a renewed producer.

Most of it needs no broker: an address where nothing listens keeps every message in
librdkafka's queue, and a purge reports them. The records as consumers read them come
from librdkafka's mock cluster (a broker in this process keeps the unit tier free of
brokers to start).
"""

from __future__ import annotations

import ctypes
import socket

import pytest
from confluent_kafka import KafkaError

from msgsafe.adapters.kafka.client import ID_HEADER, KafkaClient, ReportRun, message_headers
from msgsafe.errors import ConfigurationError, Refused, TransientError
from msgsafe.message import new_message_ids
from tests.support.kafka_ledger import consume_until
from tests.support.kafka_mock import MockKafkaCluster, _librdkafka

TOPIC = "client"


def _nowhere() -> str:
    """A kafka:// URL of a loopback port where nothing listens."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"kafka://127.0.0.1:{probe.getsockname()[1]}"


class _Runs:
    """The runs a test's ReportRun handed over once complete."""

    def __init__(self) -> None:
        self.done: list[ReportRun] = []

    def __call__(self, run: ReportRun) -> None:
        self.done.append(run)


def test_message_headers_put_the_id_first_in_one_object() -> None:
    assert message_headers("id-1") == {ID_HEADER: "id-1"}
    assert message_headers("id-1", []) == {ID_HEADER: "id-1"}
    assert message_headers("id-1", [("a", b"1"), ("b", None)]) == [
        (ID_HEADER, "id-1"),
        ("a", b"1"),
        ("b", None),
    ]


def test_a_run_stops_at_the_message_librdkafka_refused_and_a_purge_reports_the_rest() -> None:
    client = KafkaClient.for_url(_nowhere(), {"max_in_flight": 5})
    runs = _Runs()
    values = [b"v%d" % i for i in range(8)]
    ids = new_message_ids(8)
    run = ReportRun(runs, 0, 5)
    taken, refused = client.produce_run(TOPIC, values, None, ids, None, run, 0, len(values))
    assert taken == 5 and isinstance(refused, BufferError)
    assert not runs.done
    client.purge()
    assert client.drain(10) == 0
    assert runs.done == [run]
    assert [value for _, _, value in run.failures] == values[:5]
    assert {err.code() for err, _, _ in run.failures} == {KafkaError._PURGE_QUEUE}
    error = client.error(run.failures[0][0], ids[0])
    assert isinstance(error, Refused) and error.message_id == ids[0]


def test_a_run_counts_the_messages_that_never_reached_librdkafka() -> None:
    runs = _Runs()
    run = ReportRun(runs, 10, 13)
    run.skip()
    run(None, None)  # type: ignore[arg-type]  # a confirmed report reads nothing of msg
    assert not runs.done
    run.skip()
    assert runs.done == [run] and not run.failures


def test_a_failures_only_lane_keeps_each_failed_delivery() -> None:
    client = KafkaClient.for_url(_nowhere(), {}, failures_only=True)
    count = 3
    taken, refused = client.produce_run(
        TOPIC, [b"a", b"b", b"c"], [b"k", None, b"k"], new_message_ids(count), None, None, 0, count
    )
    assert (taken, refused) == (count, None)
    client.purge(blocking=True)
    assert client.drain(10) == 0
    assert [err.code() for err in client.failures] == [KafkaError._PURGE_QUEUE] * count
    assert isinstance(client.error(client.failures[0]), TransientError)


def test_renew_replaces_the_producer_and_fails_what_the_old_one_held() -> None:
    client = KafkaClient.for_url(_nowhere(), {})
    runs = _Runs()
    run = ReportRun(runs, 0, 2)
    old = client.producer
    assert client.produce_run(TOPIC, [b"a", b"b"], None, ["i1", "i2"], None, run, 0, 2) == (2, None)
    client.renew()
    assert client.producer is not old and client.fatal is None
    assert runs.done == [run] and len(run.failures) == 2


def test_a_bad_option_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError, match="max_in_flight"):
        KafkaClient.for_url(_nowhere(), {"max_in_flight": 0})


def test_a_run_arrives_with_its_ids_and_the_extra_headers(kafka_mock: MockKafkaCluster) -> None:
    kafka_mock.create_topic(TOPIC, partitions=3, replication=3)
    client = KafkaClient.for_url(kafka_mock.url, {})
    runs = _Runs()
    count = 300
    ids = new_message_ids(count)
    keys = [b"k%d" % (i % 7) for i in range(count)]
    values = [b"v%d" % i for i in range(count)]
    half = count // 2
    first, second = ReportRun(runs, 0, half), ReportRun(runs, half, count)
    assert client.produce_run(TOPIC, values, keys, ids, None, first, 0, half) == (half, None)
    extra = [("trace", b"t")]
    assert client.produce_run(TOPIC, values, keys, ids, extra, second, half, count) == (count, None)
    assert client.drain(30) == 0
    assert runs.done and all(not run.failures for run in runs.done)
    headers: dict[str, dict[str, str]] = {}
    received = consume_until(
        kafka_mock.url,
        TOPIC,
        set(ids),
        deadline_s=60,
        on_delivery=lambda d: headers.__setitem__(d.message_id, dict(d.headers)),
    )
    assert set(received) == set(ids) and max(received.values()) == 1
    assert all(headers[i] == {} for i in ids[:half])
    assert all(headers[i] == {"trace": "t"} for i in ids[half:])


def test_a_fatal_error_raised_by_a_purge_reaches_the_error_callback(
    kafka_mock: MockKafkaCluster,
) -> None:
    """confluent-kafka raises a fatal error out of poll(): a purge (which polls) hands it
    to the error callback, the one place that has the producer renewed, instead of
    dropping it (the producer would otherwise stay dead)."""
    kafka_mock.create_topic(TOPIC, partitions=1, replication=3)
    seen: list[KafkaError] = []
    client = KafkaClient.for_url(kafka_mock.url, {}, on_error=seen.append)
    try:
        client.producer.produce(TOPIC, b"x")
        assert client.producer.flush(30) == 0
        lib = _librdkafka()
        lib.rd_kafka_test_fatal_error.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_char_p]
        handle = ctypes.c_void_p.from_address(id(client.producer) + object.__basicsize__)
        assert (
            lib.rd_kafka_test_fatal_error(
                handle.value, KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, b"injected by msgsafe test"
            )
            == 0
        )
        client.purge()
        assert client.fatal is not None and client.fatal.fatal()
        assert any(err.fatal() for err in seen)
    finally:
        client.producer.purge(True, True, False)
