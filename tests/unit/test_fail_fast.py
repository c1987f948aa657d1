"""Fail fast, bounded: a send to a cluster whose every host refuses ends at once (the
first send included); to a host that accepts TCP and never answers, within
``connect_timeout`` (default 2 s). Loopback only: a port freed just before (refused) and a
listener that never accepts (its backlog completes the TCP handshake, nothing speaks).

Bounds are asserted with a 3x margin over the documented figure; the figures themselves
are measured by ``benchmarks/bench_failfast.py``.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe.errors import ConnectError

SCHEMES = ["amqp", "amqp10", "kafka"]
#: Documented: every host refusing -> send() returns within 100 ms.
REFUSED_S = 0.1
#: Documented default connect_timeout.
CONNECT_TIMEOUT_S = 2.0
MARGIN = 3.0


def _refusing_port() -> int:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = int(sock.getsockname()[1])
    sock.close()  # nothing listens there now: connects are refused
    return port


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A loopback port that completes TCP handshakes and never says a word."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield int(sock.getsockname()[1])
    sock.close()


def _timed_send(producer: Producer) -> tuple[float, object]:
    start = time.monotonic()
    try:
        outcome: object = producer.send("orders", b"x")
    except ConnectError as exc:
        outcome = exc
    return time.monotonic() - start, outcome


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_host_refusing_fails_the_first_send_at_once(scheme: str) -> None:
    url = f"{scheme}://127.0.0.1:{_refusing_port()},127.0.0.1:{_refusing_port()}/"
    producer = Producer(url, outbox=False)
    try:
        took = []
        for _ in range(5):
            elapsed, outcome = _timed_send(producer)
            assert isinstance(outcome, ConnectError), outcome
            assert outcome.maybe_delivered is False
            took.append(elapsed)
        assert max(took) < REFUSED_S * MARGIN, took
    finally:
        start = time.monotonic()
        producer.close()
        assert time.monotonic() - start < 1.0 * MARGIN


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_host_refusing_stores_at_once(scheme: str, tmp_path: Path) -> None:
    url = f"{scheme}://127.0.0.1:{_refusing_port()}/"
    producer = Producer(url, outbox=tmp_path / "outbox.db")
    try:
        took = []
        for _ in range(5):
            elapsed, outcome = _timed_send(producer)
            assert getattr(outcome, "status", None) is Status.STORED, outcome
            took.append(elapsed)
        assert max(took) < REFUSED_S * MARGIN, took
        assert producer.pending() == 5
    finally:
        producer.close()


@pytest.mark.parametrize("scheme", SCHEMES)
def test_black_holed_host_fails_within_the_connect_timeout(scheme: str, silent_port: int) -> None:
    producer = Producer(f"{scheme}://127.0.0.1:{silent_port}/", outbox=False)
    try:
        elapsed, outcome = _timed_send(producer)
        assert isinstance(outcome, ConnectError), outcome
        assert outcome.maybe_delivered is False
        assert elapsed < CONNECT_TIMEOUT_S * MARGIN, elapsed
    finally:
        start = time.monotonic()
        producer.close()
        assert time.monotonic() - start < 1.0 * MARGIN
