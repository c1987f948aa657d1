"""AMQP 1.0 peers: what the open frame advertises (container, product, offered
capabilities, ``failover-server-list``). AMQP 1.0 says nothing about how the broker
stores or replicates a queue, so that is reported as unknown, never assumed."""

from __future__ import annotations

import contextlib
from typing import Any

from msgsafe.cli.findings import Finding, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import ConnectError, MissingExtra

__all__ = ["check_amqp10"]

_TIMEOUT_S = 5.0


def check_amqp10(url: BrokerUrl) -> list[Finding]:
    """Findings from the first peer in ``url`` that opens a connection."""
    try:
        from proton import ProtonException
        from proton.utils import BlockingConnection
    except ImportError as exc:
        raise MissingExtra("amqp10", "python-qpid-proton") from exc
    last: Exception | None = None
    for endpoint in url.endpoints:
        host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
        scheme = "amqps" if endpoint.tls else "amqp"
        try:
            connection = BlockingConnection(
                f"{scheme}://{host}:{endpoint.port}",
                timeout=_TIMEOUT_S,
                sasl_enabled=True,
                allowed_mechs="PLAIN" if url.username else "ANONYMOUS",
                allow_insecure_mechs=True,
                user=url.username,
                password=url.password.reveal() if url.password else None,
            )
        except (ProtonException, OSError) as exc:
            last = exc
            continue
        try:
            return _findings(url, str(endpoint), connection.conn)
        finally:
            with contextlib.suppress(ProtonException, OSError):
                connection.close()
    raise ConnectError(
        f"no AMQP 1.0 peer opened a connection: {type(last).__name__}", endpoint=url.redacted()
    ) from last


def _findings(url: BrokerUrl, endpoint: str, conn: Any) -> list[Finding]:
    props = dict(conn.remote_properties or {})
    caps = [str(c) for c in (conn.remote_offered_capabilities or [])]
    product = " ".join(str(props.get(k, "")) for k in ("product", "version")).strip()
    findings = [
        Finding(
            Severity.INFO,
            f"peer {endpoint}",
            "open frame",
            f"container {conn.remote_container}; {product or 'product not advertised'}; "
            f"capabilities: {', '.join(caps) or 'none'}",
        )
    ]
    failover = props.get("failover-server-list")
    if failover:
        findings.append(
            Finding(
                Severity.OK,
                f"peer {endpoint}",
                "failover-server-list",
                f"{len(failover)} peer(s)",
                "the client learns the other cluster members from the peer itself",
                "",
                "amqp-failover",
            )
        )
    elif len(url.endpoints) < 2:
        findings.append(
            Finding(
                Severity.WARNING,
                f"peer {endpoint}",
                "failover-server-list",
                "not advertised",
                "one host in the URL and no advertised fail-over peers: when this peer "
                "fails, sends go to the outbox until it returns",
                "list every cluster member in the URL (amqp10://h1:5672,h2:5672)",
                "amqp-failover",
            )
        )
    else:
        findings.append(
            Finding(
                Severity.INFO,
                f"peer {endpoint}",
                "failover-server-list",
                "not advertised",
                f"the client fails over across the {len(url.endpoints)} hosts in the URL",
            )
        )
    if "rabbitmq" in product.lower():
        # NOTE: measured against RabbitMQ 3.10: a transfer to /amq/queue/NAME for a queue
        # that does not exist is settled "accepted" and dropped; AMQP 1.0 has no
        # mandatory flag, so no client can tell it from a delivered message.
        findings.append(
            Finding(
                Severity.WARNING,
                f"peer {endpoint}",
                "unroutable messages",
                "accepted and dropped",
                "RabbitMQ's AMQP 1.0 plugin accepts a message for a queue that does not "
                "exist (never declared, or deleted) and drops it",
                "declare every queue before sending, or publish with amqp:// (0-9-1), where "
                "msgsafe sends mandatory and an unroutable message is a typed error",
            )
        )
    findings.append(
        Finding(
            Severity.UNKNOWN,
            "queues",
            "durability and replication",
            "unknown",
            "AMQP 1.0 does not advertise how a node stores or replicates messages; not guessing",
            "check with the broker's own tools (Qpid: HA group quorum and sync policy; "
            "RabbitMQ: msgsafe doctor amqp://... for queue types)",
            "qpid-ha",
        )
    )
    return findings
