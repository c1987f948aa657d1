"""What a port speaks, asked in one or two short exchanges.

A client whose own handshake the peer dropped, or answered with bytes of another
protocol, asks the port directly so that its error can say what to use instead
(:class:`~msgsafe.errors.ProtocolMismatch`) rather than treat a broker of the wrong kind
as an outage to retry forever. Each question costs at most :data:`PROBE_S`; a refused
port costs nothing.

What the brokers answer (measured on RabbitMQ 3.10, Apache Kafka 4.1, ActiveMQ Artemis
2.40, Qpid Broker-J 9.2):

- an AMQP header of a version the broker does not speak: the header it does speak
  (RabbitMQ without the AMQP 1.0 plugin: ``AMQP 0 0 9 1``; Artemis: ``AMQP 3 1 0 0``);
- anything at all sent to a TLS listener: a TLS alert or handshake record (``0x15 0x03``
  or ``0x16 0x03``);
- an AMQP header sent to Kafka: nothing, the connection closed; an ApiVersions request:
  its answer, with our correlation id;
- an ApiVersions request sent to an AMQP 1.0 broker: nothing, the connection closed.
"""

from __future__ import annotations

import socket
import struct

__all__ = [
    "AMQP091_HEADER",
    "AMQP10_HEADER",
    "CLIENT_CERT_ALERTS",
    "KAFKA_ADVICE",
    "PLAIN_NOT_TLS",
    "PROBE_S",
    "client_certificate_refused",
    "identify_peer",
    "spoken_in_reply",
    "split_endpoint",
]

#: The longest one question may take (connect, send, first bytes of the answer).
PROBE_S = 0.5
AMQP091_HEADER = b"AMQP\x00\x00\x09\x01"
AMQP10_HEADER = b"AMQP\x00\x01\x00\x00"
#: A TLS client answered with bytes that are no TLS record (OpenSSL: "wrong version
#: number"): the port is a plain listener.
PLAIN_NOT_TLS = "this port speaks plain TCP, not TLS"
#: TLS alerts a server sends when it refuses the client's certificate (OpenSSL's names,
#: upper case in Python's ssl errors, lower case in proton's and librdkafka's text).
CLIENT_CERT_ALERTS = {
    "certificate required": "the broker requires a client certificate: give tls_cert_file= "
    "and tls_key_file=",
    "unknown ca": "the broker does not trust our client certificate (signed by a CA it does "
    "not know): give tls_cert_file= a certificate its CA signed",
    "bad certificate": "the broker refused our client certificate (bad certificate)",
    "certificate expired": "the broker refused our client certificate: it has expired",
    "certificate unknown": "the broker refused our client certificate (certificate unknown)",
}
#: What a ``kafka://`` URL should use instead, by what its port speaks.
KAFKA_ADVICE = {
    "AMQP 0-9-1": "use amqp://",
    "AMQP 1.0": "use amqp10://",
    "TLS": "give the URL TLS (kafka+ssl://) or use the broker's plain listener",
}
_CORRELATION = 7
#: ApiVersions v0, correlation id 7, client id "msgsafe": any Kafka broker answers it.
KAFKA_PROBE = struct.pack(">ihhih", 17, 18, 0, _CORRELATION, 7) + b"msgsafe"


def split_endpoint(endpoint: str) -> tuple[str, int] | None:
    """``host:port`` (``[v6]:port``) as a pair, or None when it has no port."""
    host, _, port_text = endpoint.rpartition(":")
    if not host or not port_text.isdigit():
        return None
    return host.strip("[]"), int(port_text)


def _ask(host: str, port: int, hello: bytes) -> bytes:
    try:
        with socket.create_connection((host, port), timeout=PROBE_S) as sock:
            sock.settimeout(PROBE_S)
            sock.sendall(hello)
            return sock.recv(8)
    except OSError:
        return b""


def spoken_in_reply(reply: bytes) -> str | None:
    """The protocol whose first bytes ``reply`` holds: ``"AMQP 0-9-1"``, ``"AMQP 1.0"``,
    ``"TLS"``; None for anything else (or nothing)."""
    if reply[:4] == b"AMQP":
        if reply[4:8] == AMQP091_HEADER[4:]:
            return "AMQP 0-9-1"
        if reply[4:6] in (b"\x00\x01", b"\x02\x01", b"\x03\x01"):
            return "AMQP 1.0"
        return None
    if reply[:1] in (b"\x15", b"\x16") and reply[1:2] == b"\x03":
        return "TLS"
    return None


def identify_peer(endpoint: str, *, header: bytes | None, kafka: bool) -> str | None:
    """What the peer at ``endpoint`` speaks: ``"AMQP 0-9-1"``, ``"AMQP 1.0"``, ``"TLS"``
    or ``"Kafka"``; None when it cannot be told (refused, silent, something else).

    ``header``: an AMQP header to send first (an AMQP broker answers with the header it
    speaks, a TLS port with an alert); None to skip that question. ``kafka``: when the
    peer said nothing to the header (or it was skipped), ask Kafka's question.
    At most two questions, so at most ``2 * PROBE_S``.
    """
    where = split_endpoint(endpoint)
    if where is None:
        return None
    host, port = where
    reply = b"" if header is None else _ask(host, port, header)
    if reply or not kafka:
        return spoken_in_reply(reply)
    answer = _ask(host, port, KAFKA_PROBE)
    if len(answer) == 8 and struct.unpack(">i", answer[4:8])[0] == _CORRELATION:
        return "Kafka"
    return spoken_in_reply(answer)


def client_certificate_refused(text: str) -> str | None:
    """What to tell the caller when ``text`` (a TLS error) shows the server's alert that
    it refused our client certificate, or has none; None for any other failure. No
    retry can fix it, like a server certificate that does not verify."""
    lowered = text.lower().replace("_", " ")
    for alert, said in CLIENT_CERT_ALERTS.items():
        if f"alert {alert}" in lowered:
            return said
    return None
