"""Typed errors on the real cluster: each failure is a msgsafe error the caller can act
on, never a confirm, and the message stays the caller's (no receipt, nothing dropped)."""

from __future__ import annotations

import socket
import time
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest

import msgsafe
from msgsafe.adapters import open_transport
from msgsafe.adapters.rabbitmq import RabbitTransport
from msgsafe.cluster.rabbitmq import RabbitCluster
from msgsafe.endpoints import parse_url
from msgsafe.errors import (
    AuthenticationError,
    ConnectError,
    MessageTooLarge,
    TransientError,
    Unroutable,
)
from msgsafe.message import Envelope
from tests.fixtures.rabbitmq import RabbitUrls
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def transport(rabbit_urls: RabbitUrls) -> Iterator[RabbitTransport]:
    t = open_transport(parse_url(rabbit_urls.cluster), {"declare": "quorum"})
    assert isinstance(t, RabbitTransport)
    try:
        yield t
    finally:
        t.close(5)


def _with_credentials(url: str, user: str, password: str, vhost: str = "") -> str:
    hosts = url.split("@", 1)[1]
    path = f"/{quote(vhost, safe='')}" if vhost else ""
    return f"amqp://{user}:{password}@{hosts}{path}"


def test_unroutable_is_never_confirmed(transport: RabbitTransport) -> None:
    fut = transport.publish(Envelope.build("amq.direct/nobody-listens", b"x"))
    with pytest.raises(Unroutable) as info:
        fut.result(10)
    assert info.value.message_id is not None
    # A missing exchange closes the channel; the error names it and the channel recovers.
    fut = transport.publish(Envelope.build(f"no-such-exchange-{uuid.uuid4().hex}/k", b"x"))
    with pytest.raises(Unroutable, match="no such exchange"):
        fut.result(10)
    queue = f"after-{uuid.uuid4().hex[:8]}"
    assert transport.publish(Envelope.build(queue, b"ok")).result(10) is None


def test_unroutable_through_the_producer_raises(rabbit_urls: RabbitUrls) -> None:
    with (
        msgsafe.Producer(rabbit_urls.cluster, outbox=False, send_timeout=10) as producer,
        pytest.raises(Unroutable),
    ):
        producer.send("amq.direct/nobody-listens", b"x")


def test_wrong_password_is_authentication_error(rabbit_urls: RabbitUrls) -> None:
    url = _with_credentials(rabbit_urls.cluster, "guest", "wrong-password")
    t = open_transport(parse_url(url), {"connect_timeout": 3})
    try:
        started = time.monotonic()
        with pytest.raises(AuthenticationError) as info:
            t.publish(Envelope.build("q", b"x")).result(15)
        assert "wrong-password" not in str(info.value)
        assert time.monotonic() - started < 10
    finally:
        t.close(1)
    with (
        pytest.raises(AuthenticationError),
        msgsafe.Producer(url, outbox=False, send_timeout=15, connect_timeout=3) as producer,
    ):
        producer.send("q", b"x")


def test_unknown_vhost_is_authentication_error(rabbit_urls: RabbitUrls) -> None:
    url = _with_credentials(rabbit_urls.cluster, "guest", "guest", vhost="no-such-vhost")
    t = open_transport(parse_url(url), {"connect_timeout": 3})
    try:
        with pytest.raises(AuthenticationError, match="virtual host"):
            t.publish(Envelope.build("q", b"x")).result(15)
    finally:
        t.close(1)


def test_oversize_is_message_too_large(transport: RabbitTransport, rabbit_urls: RabbitUrls) -> None:
    small = open_transport(parse_url(rabbit_urls.cluster), {"max_message_size": 1000})
    try:
        with pytest.raises(MessageTooLarge):
            small.publish(Envelope.build("q", b"x" * 1001)).result(5)
    finally:
        small.close(1)
    # Properties travel in one frame: headers beyond frame_max are refused before sending
    # (RabbitMQ would close the whole connection with 501 FRAME_ERROR).
    big_headers = {"h": "y" * 200_000}
    with pytest.raises(MessageTooLarge, match="frame"):
        transport.publish(Envelope.build("q", b"x", headers=big_headers)).result(5)


def test_broker_side_size_limit_is_typed(rabbit_cluster: RabbitCluster) -> None:
    """The broker's own max_message_size closes the channel (406); the culprit gets
    MessageTooLarge and the messages in flight beside it are still confirmed."""
    limit = 64 * 1024
    nodes = range(rabbit_cluster.size)
    for i in nodes:
        rabbit_cluster.ctl(i, "eval", f"application:set_env(rabbit, max_message_size, {limit}).")
    try:
        t = open_transport(parse_url(rabbit_cluster.cluster_url()), {"declare": "quorum"})
        queue = f"size-{uuid.uuid4().hex[:8]}"
        try:
            before = [t.publish(Envelope.build(queue, b"a")) for _ in range(50)]
            big = t.publish(Envelope.build(queue, b"b" * (limit + 1)))
            after = [t.publish(Envelope.build(queue, b"c")) for _ in range(50)]
            with pytest.raises(MessageTooLarge):
                big.result(15)
            for fut in before + after:
                assert fut.result(15) is None
        finally:
            t.close(5)
    finally:
        for i in nodes:
            rabbit_cluster.ctl(
                i, "eval", "application:set_env(rabbit, max_message_size, 134217728)."
            )


def test_no_broker_reachable_is_connect_error() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    t = open_transport(parse_url(f"amqp://127.0.0.1:{port}"), {"connect_timeout": 1})
    try:
        started = time.monotonic()
        with pytest.raises(ConnectError) as info:
            t.publish(Envelope.build("q", b"x")).result(10)
        assert isinstance(info.value, TransientError)
        assert time.monotonic() - started < 3
    finally:
        t.close(1)


def test_memory_alarm_blocks_within_the_timeout(rabbit: RabbitCluster) -> None:
    """``connection.blocked`` (a resource alarm) ends in a transient error within
    confirm_timeout, never a hang; once the alarm clears, publishing works again."""
    url = parse_url(rabbit.cluster_url())
    t = open_transport(url, {"confirm_timeout": 3, "blocked_timeout": 2, "declare": "quorum"})
    queue = f"alarm-{uuid.uuid4().hex[:8]}"
    try:
        assert t.publish(Envelope.build(queue, b"before")).result(10) is None
        for i in range(rabbit.size):
            rabbit.ctl(i, "set_vm_memory_high_watermark", "absolute", "1")
        try:
            wait_until(
                lambda: all(
                    "memory" in rabbit.ctl(i, "eval", "rabbit_alarm:get_alarms().")
                    for i in range(rabbit.size)
                ),
                30,
                "the memory alarm on every node",
            )
            started = time.monotonic()
            futures = [t.publish(Envelope.build(queue, b"during")) for _ in range(20)]
            for fut in futures:
                exc = fut.exception(10)
                assert isinstance(exc, TransientError), exc
            assert time.monotonic() - started < 3 + 1.5
        finally:
            for i in range(rabbit.size):
                rabbit.ctl(i, "set_vm_memory_high_watermark", "0.4")
        deadline = time.monotonic() + 30
        while True:
            exc = t.publish(Envelope.build(queue, b"after")).exception(10)
            if exc is None:
                break
            assert isinstance(exc, TransientError), exc
            assert time.monotonic() < deadline, "publishing did not recover after the alarm"
    finally:
        t.close(2)
