"""The two checks every TLS test makes on a real listener: a good certificate carries
messages end to end (every id counted), and a certificate that can never verify fails
closed (a typed CertificateError within 2 s, nothing stored as if the broker were down,
the next send refused too: no plain-TCP fallback)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

import msgsafe
from msgsafe import Status
from msgsafe.errors import AuthenticationError, CertificateError

__all__ = ["WITHIN_S", "assert_fails_closed", "assert_refused_login", "round_trip"]

#: Documented: a certificate that cannot verify is refused within 2 s.
WITHIN_S = 2.0


def round_trip(
    url: str,
    destination: str,
    *,
    count: int = 50,
    ignore: Callable[[bytes], bool] = lambda body: False,
    timeout: float = 30.0,
    **producer_options: object,
) -> tuple[int, int]:
    """Send ``count`` messages (each CONFIRMED), consume them back through ``url``;
    assert none lost and every duplicate a known id. Returns (sent, received)."""
    sent: set[str] = set()
    with msgsafe.Producer(url, outbox=False, **producer_options) as producer:
        for i in range(count):
            receipt = producer.send(destination, f"m{i}".encode())
            assert receipt.status is Status.CONFIRMED
            sent.add(receipt.message_id)
    received: set[str] = set()
    deadline = time.monotonic() + timeout
    with msgsafe.Consumer(url) as consumer:
        consumer.subscribe(destination)
        while not sent <= received and time.monotonic() < deadline:
            for delivery in consumer.poll(max_messages=100, timeout=1.0):
                if not ignore(delivery.body):
                    received.add(delivery.message_id)
                delivery.ack()
    assert sent - received == set(), f"lost {len(sent - received)} of {len(sent)}"
    assert received <= sent, "received ids that were never sent"
    return len(sent), len(received)


def _refused(
    url: str, outbox: Path, error: type[AuthenticationError], secret: str | None
) -> tuple[float, str]:
    """``send()`` through ``url`` (with an outbox) raises ``error``, stores nothing, and
    the next send is refused too; (seconds the first took, the error's text)."""
    producer = msgsafe.Producer(url, outbox=outbox)
    try:
        start = time.monotonic()
        with pytest.raises(error) as caught:
            producer.send("security-faults", b"x")
        took = time.monotonic() - start
        assert producer.pending() == 0, "stored as if the broker were down"
        with pytest.raises(error):
            producer.send("security-faults", b"y")
    finally:
        producer.close(timeout=1)
    text = str(caught.value)
    if secret is not None:
        assert secret not in text and secret not in repr(caught.value), "credentials in an error"
    return took, text


def assert_fails_closed(url: str, outbox: Path, *, secret: str | None = None) -> str:
    """A CertificateError within :data:`WITHIN_S`, nothing stored, no second chance (see
    :func:`_refused`). Returns the error's text."""
    took, text = _refused(url, outbox, CertificateError, secret)
    assert took < WITHIN_S, took
    return text


def assert_refused_login(url: str, outbox: Path, *, secret: str) -> float:
    """An AuthenticationError (not a certificate's), nothing stored, no second chance;
    returns the seconds the first send took."""
    took, text = _refused(url, outbox, AuthenticationError, secret)
    assert "certificate" not in text, text
    return took
