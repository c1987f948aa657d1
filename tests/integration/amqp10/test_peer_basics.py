"""The AMQP 1.0 adapter against the proton test peer, for what no real broker here can be
made to send on demand: every outcome (``rejected``, ``released``, ``modified``, never
settled) on one healthy connection, and a TLS listener with a throw-away CA (the session's
Artemis pair has no TLS acceptor). Everything else runs on Artemis (``test_basics.py``)."""

from __future__ import annotations

import time

import pytest

from msgsafe.errors import (
    CertificateError,
    ConfirmTimeout,
    Refused,
    Rejected,
)
from msgsafe.message import Envelope
from tests.fixtures.amqp10 import PeerFactory, TlsFiles
from tests.integration.amqp10._open import transport_for
from tests.support.amqp10_peer import stored_count

pytestmark = pytest.mark.integration


def test_outcomes_map_to_typed_errors(amqp10_peers: PeerFactory) -> None:
    peer = amqp10_peers.start()
    with transport_for(f"amqp10://127.0.0.1:{peer.port}", confirm_timeout=1.0) as t:
        rejected = t.publish(Envelope.build("reject/orders", b"x")).exception(10)
        assert isinstance(rejected, Rejected)
        assert rejected.condition is not None
        assert "amqp:precondition-failed" in rejected.condition
        released = t.publish(Envelope.build("release/orders", b"x")).exception(10)
        assert isinstance(released, Refused) and "released" in str(released)
        modified = t.publish(Envelope.build("modify/orders", b"x")).exception(10)
        assert isinstance(modified, Refused) and "modified" in str(modified)
        started = time.monotonic()
        silent = t.publish(Envelope.build("silent/orders", b"x")).exception(10)
        assert isinstance(silent, ConfirmTimeout) and silent.maybe_delivered
        assert time.monotonic() - started < 2.0
        # The connection is still good after every refusal.
        t.publish(Envelope.build("orders", b"ok")).result(10)


def test_tls_verifies_the_peer_name(amqp10_peers: PeerFactory, amqp10_tls: TlsFiles) -> None:
    peer = amqp10_peers.start(tls=amqp10_tls)
    url = f"amqp10s://localhost:{peer.port}"
    with transport_for(url, tls_ca_file=str(amqp10_tls.ca)) as t:
        t.publish(Envelope.build("orders", b"over tls")).result(10)
    # Not trusted (system CAs only): refused for good (no retry can fix it), nothing sent.
    with transport_for(url, confirm_timeout=1.0) as t:
        err = t.publish(Envelope.build("orders", b"x")).exception(10)
        assert isinstance(err, CertificateError), repr(err)
    # Explicit opt-out.
    with transport_for(url, tls_verify=False) as t:
        t.publish(Envelope.build("orders", b"unverified")).result(10)
    assert stored_count(amqp10_peers.store(), "orders") == 2
