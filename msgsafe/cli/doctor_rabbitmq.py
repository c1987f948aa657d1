"""RabbitMQ settings that decide whether a confirmed message survives node failures and
partitions: queue types (classic, mirrored, quorum), durability, node count and
``cluster_partition_handling``.

Two sources, and we say which one answered: the management HTTP API (when the plugin is
enabled: nodes, partitions, every queue's type and policy), and the AMQP connection
itself (server properties, and for each named queue an equivalence probe that tells a
quorum queue from a classic one without changing anything).
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from typing import Any

from msgsafe.cli.findings import Finding, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import AuthenticationError, ConnectError, MissingExtra

__all__ = ["check_rabbitmq"]

_TIMEOUT_S = 5.0
_CURRENT = re.compile(r"current is the value '([^']*)'")


def check_rabbitmq(url: BrokerUrl, queues: Sequence[str], management: str | None) -> list[Finding]:
    """Findings for the broker at ``url``, the named ``queues`` and, through the
    management API at ``management`` (default: port 15672 of the URL's first host),
    the whole cluster."""
    findings: list[Finding] = []
    connection = _connect(url)
    try:
        findings.append(_server(connection))
        api = _Management(url, management)
        overview = api.get("/api/overview")
        cluster_name = _server_properties(connection).get("cluster_name")
        if isinstance(cluster_name, bytes):
            cluster_name = cluster_name.decode(errors="replace")
        if isinstance(overview, dict) and overview.get("cluster_name") != cluster_name:
            # NOTE: the default management address is a guess (port 15672 of the first
            # host); an API that speaks for another cluster must not be believed.
            overview = (
                f"{api.base} belongs to cluster {overview.get('cluster_name')!r}, "
                f"not {cluster_name!r}"
            )
            api.disable()
        if isinstance(overview, str):
            findings.append(
                Finding(
                    Severity.UNKNOWN,
                    "cluster",
                    "nodes, partitions, cluster_partition_handling",
                    "unknown",
                    f"the management API did not answer ({overview}); AMQP does not expose "
                    "the node count or partition state, so they are not guessed",
                    "rabbitmq-plugins enable rabbitmq_management (or pass --management URL); "
                    "rabbitmqctl cluster_status shows nodes and partitions",
                    "rabbit-partitions",
                )
            )
        else:
            findings.extend(_cluster(api, overview))
        vhost = url.path or "/"
        listed = api.get(f"/api/queues/{urllib.parse.quote(vhost, safe='')}")
        by_name = {q["name"]: q for q in listed} if isinstance(listed, list) else {}
        names = list(queues) or sorted(by_name)
        for name in names:
            if "/" in name:
                findings.append(
                    Finding(
                        Severity.INFO,
                        f"destination {name}",
                        "queue type",
                        "n/a",
                        "an exchange/routing-key destination: check the queues bound to it",
                    )
                )
            elif name in by_name:
                findings.extend(_queue_from_api(name, by_name[name]))
            else:
                findings.append(_queue_probe(connection, name))
    finally:
        _close(connection)
    return findings


# --- the AMQP connection ----------------------------------------------------------------


def _connect(url: BrokerUrl) -> Any:
    try:
        import pika
        import pika.exceptions

        from msgsafe.adapters.rabbitmq._errors import cause
    except ImportError as exc:
        raise MissingExtra("rabbitmq", "pika") from exc
    user = url.username or "guest"
    password = url.password.reveal() if url.password else "guest"
    last: Exception | None = None
    for endpoint in url.endpoints:
        params = pika.ConnectionParameters(
            host=endpoint.host,
            port=endpoint.port,
            virtual_host=url.path or "/",
            credentials=pika.PlainCredentials(user, password),
            connection_attempts=1,
            socket_timeout=_TIMEOUT_S,
            blocked_connection_timeout=_TIMEOUT_S,
            ssl_options=_ssl(endpoint.host) if url.tls else None,
        )
        try:
            return pika.BlockingConnection(params)
        except pika.exceptions.ProbableAuthenticationError as exc:
            raise AuthenticationError(
                "the broker refused the credentials", endpoint=url.redacted()
            ) from exc
        except pika.exceptions.AMQPError as exc:
            last = exc
    raise ConnectError(
        f"no RabbitMQ node answered: {cause(last) if last else 'no endpoint'}",
        endpoint=url.redacted(),
    ) from last


def _ssl(host: str) -> Any:
    import ssl

    import pika

    return pika.SSLOptions(ssl.create_default_context(), host)


def _close(connection: Any) -> None:
    import pika.exceptions

    with contextlib.suppress(pika.exceptions.AMQPError):
        connection.close()


def _server_properties(connection: Any) -> dict[str, Any]:
    # NOTE: pika keeps connection.start's server-properties on the impl object only.
    props = getattr(getattr(connection, "_impl", None), "server_properties", None)
    return dict(props or {})


def _server(connection: Any) -> Finding:
    props = _server_properties(connection)

    def text(name: str) -> str:
        value = props.get(name, "")
        return value.decode(errors="replace") if isinstance(value, bytes) else str(value)

    caps = props.get("capabilities") or {}
    confirms = bool(caps.get("publisher_confirms"))
    value = f"{text('product')} {text('version')}, cluster {text('cluster_name') or '?'}"
    if not confirms:
        return Finding(
            Severity.CRITICAL,
            "broker",
            "publisher confirms",
            "not offered",
            "without publisher confirms nothing the broker took is acknowledged",
            "use a broker with publisher confirms (RabbitMQ 2.3+)",
            "rabbit-ha",
        )
    return Finding(Severity.INFO, "broker", "server", value)


def _queue_probe(connection: Any, name: str) -> Finding:
    """Tell the type of ``name`` over AMQP alone.

    NOTE: RabbitMQ answers a redeclare whose arguments differ from the queue's with
    PRECONDITION_FAILED naming the argument and its current value, and changes nothing;
    a redeclare that matches (a durable quorum queue) is a no-op. A missing queue is
    never created: the passive declare runs first.
    """
    import pika.exceptions

    subject = f"queue {name}"
    try:
        channel = connection.channel()
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return Finding(
                Severity.WARNING,
                subject,
                "exists",
                "no",
                "publishing to a missing queue is unroutable (msgsafe raises Unroutable)",
                f"declare it as a quorum queue (x-queue-type=quorum), e.g. msgsafe send "
                f"-o declare=quorum ... {name}",
            )
        return _probe_unknown(subject, exc.reply_text)
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        channel.close()
    except pika.exceptions.ChannelClosedByBroker as exc:
        reason = str(exc.reply_text)
        if "'durable'" in reason:
            return _transient(subject)
        if "x-queue-type" in reason:
            match = _CURRENT.search(reason)
            kind = match.group(1) if match else "classic"
            return _queue_type(subject, kind, mirrored=None)
        return _probe_unknown(subject, reason)
    return _queue_type(subject, "quorum", mirrored=None)


def _probe_unknown(subject: str, reason: object) -> Finding:
    return Finding(
        Severity.UNKNOWN,
        subject,
        "queue type",
        "unknown",
        f"the equivalence probe was inconclusive ({reason}); not guessing",
        "enable rabbitmq_management, or: rabbitmqctl list_queues name type durable policy",
        "rabbit-ha",
    )


def _transient(subject: str) -> Finding:
    return Finding(
        Severity.CRITICAL,
        subject,
        "durable",
        "false",
        "a non-durable queue and its messages disappear when its node restarts",
        "recreate it durable, as a quorum queue",
        "rabbit-ha",
    )


def _queue_type(subject: str, kind: str, *, mirrored: bool | None) -> Finding:
    if kind == "quorum":
        return Finding(Severity.OK, subject, "queue type", "quorum")
    if kind == "stream":
        return Finding(
            Severity.INFO,
            subject,
            "queue type",
            "stream",
            "streams replicate like quorum queues; consumers track offsets themselves",
        )
    if mirrored:
        return Finding(
            Severity.CRITICAL,
            subject,
            "queue type",
            "classic, mirrored",
            "when the master's node fails an unsynchronised mirror can be promoted and the "
            "messages it had not received are gone; a partition can leave two masters",
            "migrate to a quorum queue (x-queue-type=quorum)",
            "rabbit-ha",
        )
    return Finding(
        Severity.CRITICAL,
        subject,
        "queue type",
        "classic" if mirrored is False else "classic (mirroring policy not visible over AMQP)",
        "a classic queue lives on one node: if that node's disk is lost, so are its "
        "confirmed messages (mirrored classic queues lose unsynchronised ones on fail-over)",
        "migrate to a quorum queue (x-queue-type=quorum)",
        "rabbit-ha",
    )


# --- the management API -------------------------------------------------------------------


class _Management:
    """A tiny client of the management HTTP API; every failure becomes a reason string."""

    def __init__(self, url: BrokerUrl, base: str | None) -> None:
        host = url.endpoints[0].host if url.endpoints else "127.0.0.1"
        scheme = "https" if url.tls else "http"
        self.base = (base or f"{scheme}://{host}:15672").rstrip("/")
        user = url.username or "guest"
        password = url.password.reveal() if url.password else "guest"
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        self._auth = f"Basic {token}"
        self._disabled = False

    def disable(self) -> None:
        """Answer nothing from now on (the API belongs to another cluster)."""
        self._disabled = True

    def get(self, path: str) -> Any:
        if self._disabled:
            return "management API not used"
        request = urllib.request.Request(self.base + path, headers={"Authorization": self._auth})
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            return f"HTTP {exc.code} from {self.base}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            reason = getattr(exc, "reason", exc)
            return f"{self.base}: {reason}"


def _cluster(api: _Management, overview: Any) -> list[Finding]:
    findings: list[Finding] = []
    nodes = api.get("/api/nodes")
    if isinstance(nodes, str):
        return [Finding(Severity.UNKNOWN, "cluster", "nodes", "unknown", nodes)]
    count = len(nodes)
    running = sum(1 for n in nodes if n.get("running"))
    if count >= 3:
        findings.append(Finding(Severity.OK, "cluster", "nodes", f"{running}/{count} running"))
    else:
        findings.append(
            Finding(
                Severity.WARNING,
                "cluster",
                "nodes",
                str(count),
                "quorum queues need 3 nodes to survive one node's loss; pause_minority on "
                "2 nodes pauses both on any partition",
                "run 3 (or 5) nodes",
                "rabbit-partitions",
            )
        )
    partitioned = [n["name"] for n in nodes if n.get("partitions")]
    if partitioned:
        findings.append(
            Finding(
                Severity.CRITICAL,
                "cluster",
                "partitions",
                ", ".join(partitioned),
                "the cluster is partitioned now: both sides may accept writes that one side "
                "will discard when it heals",
                "resolve the partition; set cluster_partition_handling = pause_minority",
                "rabbit-partitions",
            )
        )
    findings.append(
        Finding(
            Severity.UNKNOWN,
            "cluster",
            "cluster_partition_handling",
            "unknown",
            "the management API does not expose it; with the default 'ignore' a partition "
            "splits the cluster and healing discards one side's writes",
            "check: rabbitmqctl environment | grep cluster_partition_handling; "
            "set cluster_partition_handling = pause_minority",
            "rabbit-partitions",
        )
    )
    return findings


def _queue_from_api(name: str, queue: dict[str, Any]) -> list[Finding]:
    subject = f"queue {name}"
    if not queue.get("durable", True):
        return [_transient(subject)]
    kind = str(queue.get("type", "classic"))
    policy = queue.get("effective_policy_definition") or {}
    mirrored = isinstance(policy, dict) and "ha-mode" in policy
    return [_queue_type(subject, kind, mirrored=mirrored)]
