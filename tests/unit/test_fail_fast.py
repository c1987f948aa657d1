"""Fail fast, bounded: a send to a cluster whose every host refuses ends at once (the
first send included); to a host that accepts TCP and never answers, within
``connect_timeout`` (default 2 s). Loopback only: a port freed just before (refused) and a
listener that never accepts (its backlog completes the TCP handshake, nothing speaks).

Bounds are asserted with a 3x margin over the documented figure; the figures themselves
are measured by ``benchmarks/bench_failfast.py``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from msgsafe import Producer, Status
from msgsafe.errors import ConnectError
from msgsafe.outbox.sqlite import SqliteOutbox
from tests.support.ports import refused_port

SCHEMES = ["amqp", "amqp10", "kafka"]
#: Documented (measured by benchmarks/bench_failfast.py): every host refusing ->
#: send() returns within 100 ms.
#: Documented default connect_timeout.
CONNECT_TIMEOUT_S = 2.0
MARGIN = 3.0
#: The refused-host tests set a long connect_timeout, so that "at once" (not waiting for
#: it) is asserted with room for a loaded machine: proton's container start alone took
#: 1.0-1.4 s for amqp10's first send at load 9 on 2 cores.
REFUSED_CONNECT_TIMEOUT_S = 10.0
#: What "at once" is asserted as: well inside that connect_timeout.
REFUSED_BOUND_S = REFUSED_CONNECT_TIMEOUT_S / 2


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
    url = f"{scheme}://127.0.0.1:{refused_port()},127.0.0.1:{refused_port()}/"
    producer = Producer(url, outbox=False, connect_timeout=REFUSED_CONNECT_TIMEOUT_S)
    try:
        took = []
        for _ in range(5):
            elapsed, outcome = _timed_send(producer)
            assert isinstance(outcome, ConnectError), outcome
            assert outcome.maybe_delivered is False
            took.append(elapsed)
        # NOTE: the claim is "without waiting for connect_timeout"; the 100 ms figure is
        # the benchmark's, so the bound here is half of a connect_timeout set long.
        assert max(took) < REFUSED_BOUND_S, took
    finally:
        start = time.monotonic()
        producer.close()
        assert time.monotonic() - start < 1.0 * MARGIN


@pytest.mark.parametrize("scheme", SCHEMES)
def test_every_host_refusing_stores_at_once(scheme: str, tmp_path: Path) -> None:
    url = f"{scheme}://127.0.0.1:{refused_port()}/"
    producer = Producer(
        url, outbox=tmp_path / "outbox.db", connect_timeout=REFUSED_CONNECT_TIMEOUT_S
    )
    try:
        took = []
        for _ in range(5):
            elapsed, outcome = _timed_send(producer)
            assert getattr(outcome, "status", None) is Status.STORED, outcome
            took.append(elapsed)
        assert max(took) < REFUSED_BOUND_S, took
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


#: Documented: Ctrl-C in a process sending through an outage exits within 2 s.
SIGINT_S = 2.0

# NOTE: the child takes Ctrl-C's default handling back: a suite started as a background
# job of a non-interactive shell hands its children SIGINT ignored, and a Python started
# so never raises KeyboardInterrupt (the test then waited out its 30 s).
SEND_LOOP = textwrap.dedent(
    """
    import signal, sys, msgsafe
    signal.signal(signal.SIGINT, signal.default_int_handler)
    producer = msgsafe.Producer(sys.argv[1], outbox=sys.argv[2])
    print("ready", flush=True)
    try:
        while True:
            receipt = producer.send("orders", b"x")
            print(receipt.message_id, receipt.status.name, flush=True)
    except KeyboardInterrupt:
        producer.close(1.0)
    """
)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_ctrl_c_during_an_outage_exits_at_once_and_loses_nothing(
    scheme: str, tmp_path: Path
) -> None:
    path = tmp_path / "outbox.db"
    url = f"{scheme}://127.0.0.1:{refused_port()}/"
    child = subprocess.Popen(
        [sys.executable, "-c", SEND_LOOP, url, str(path)], stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    lines = [child.stdout.readline()]
    assert lines[0].strip() == "ready"
    while len(lines) < 50:  # sending through the outage: receipts are coming
        lines.append(child.stdout.readline())
    start = time.monotonic()
    os.kill(child.pid, signal.SIGINT)
    rest, _ = child.communicate(timeout=30)
    took = time.monotonic() - start
    assert child.returncode == 0
    assert took < SIGINT_S * MARGIN, took
    receipted = {line.split()[0] for line in lines[1:] + rest.splitlines() if line.strip()}
    assert all(line.split()[1] == "STORED" for line in lines[1:] if line.strip())
    store = SqliteOutbox(path)
    try:
        waiting = {entry.envelope.message_id for entry in store.list(limit=10**9)}
    finally:
        store.close()
    lost = receipted - waiting
    assert len(receipted) >= 49 and not lost, (len(receipted), len(lost))
