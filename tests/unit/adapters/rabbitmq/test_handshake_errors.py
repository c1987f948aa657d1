"""pika's "probable authentication error" guesses: a connection dropped during the
handshake (a node booting, stopping or pausing) is transient; a broker's refusal is not."""

from __future__ import annotations

from pika import exceptions as pe

from msgsafe.adapters.rabbitmq._errors import open_error
from msgsafe.errors import AuthenticationError, ConnectError


def _lost() -> pe.StreamLostError:
    return pe.StreamLostError("Stream connection lost: ConnectionResetError(104, 'reset')")


def test_stream_lost_after_start_ok_is_a_connect_error() -> None:
    err = open_error(pe.ProbableAuthenticationError(repr(_lost())), "127.0.0.1:5672")
    assert isinstance(err, ConnectError)


def test_stream_lost_after_tune_ok_is_a_connect_error() -> None:
    err = open_error(pe.ProbableAccessDeniedError(repr(_lost())), "127.0.0.1:5672")
    assert isinstance(err, ConnectError)


def test_broker_refusal_stays_an_authentication_error() -> None:
    closed = pe.ConnectionClosedByBroker(403, "ACCESS_REFUSED - Login was refused")
    err = open_error(pe.ProbableAuthenticationError(repr(closed)), "127.0.0.1:5672")
    assert isinstance(err, AuthenticationError)


def test_a_tls_peer_that_ends_the_session_is_a_certificate_refusal_over_tls() -> None:
    """A TLS 1.3 server that wants a client certificate sends its alert after the
    handshake; when pika sees only the EOF, the port (asked in the clear) speaks TLS.
    Over amqps:// that is no protocol mismatch but the certificate refusal; over amqp://
    it is the mismatch."""
    import socket
    import threading

    from msgsafe.errors import CertificateError, ProtocolMismatch

    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def answer_with_a_tls_alert() -> None:
        for _ in range(2):
            conn, _ = server.accept()
            with conn:
                conn.recv(64)
                conn.sendall(b"\x15\x03\x03\x00\x02\x02\x28")  # a TLS handshake-failure alert

    thread = threading.Thread(target=answer_with_a_tls_alert, daemon=True)
    thread.start()
    lost = pe.IncompatibleProtocolError("StreamLostError: SSLEOFError(8, 'EOF occurred')")
    try:
        over_tls = open_error(lost, f"127.0.0.1:{port}", tls=True)
        plain = open_error(lost, f"127.0.0.1:{port}", tls=False)
    finally:
        thread.join(5)
        server.close()
    assert isinstance(over_tls, CertificateError) and "client certificate" in str(over_tls)
    assert isinstance(plain, ProtocolMismatch) and "amqps://" in str(plain)
