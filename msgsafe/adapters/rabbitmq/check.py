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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgsafe.checks.findings import DestinationReport, Finding, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import MissingExtra
from msgsafe.message import Guarantee

if TYPE_CHECKING:
    from msgsafe.adapters._config import TransportOptions
    from msgsafe.adapters.rabbitmq import RabbitOptions
    from msgsafe.checks.findings import Inspector

__all__ = [
    "check_rabbitmq",
    "doctor_findings",
    "guarantee_of",
    "inspect_address",
    "inspect_destination",
    "inspector",
]

_TIMEOUT_S = 5.0
_CURRENT = re.compile(r"current is the value '([^']*)'")


def doctor_findings(
    url: BrokerUrl, destinations: Sequence[str], management: str | None
) -> list[Finding]:
    """``msgsafe doctor``'s findings: :func:`check_rabbitmq`."""
    return check_rabbitmq(url, destinations, management)


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


# --- one destination, for the producer -------------------------------------------------

#: How long the answer "this queue does not exist" is kept: a consumer or an operator
#: may declare it any moment.
_MISSING_KEEP_S = 1.0


def guarantee_of(finding: Finding) -> Guarantee:
    """What a queue's finding means for a confirmed message."""
    if finding.setting in ("durable", "exclusive", "auto-delete"):
        return Guarantee.NONE
    if finding.setting == "queue type" and finding.value in ("quorum", "stream"):
        # NOTE: a quorum queue keeps a message on a majority of its members before the
        # confirm; on a one-node cluster that is one copy (doctor reports the node count).
        return Guarantee.REPLICATED
    if finding.setting == "queue type" and finding.value.startswith("classic"):
        return Guarantee.DURABLE
    return Guarantee.UNKNOWN


def inspector(url: BrokerUrl, options: Mapping[str, object]) -> Inspector:
    """The producer's check of ``url``'s destinations, connecting as its transport does."""
    from msgsafe.adapters._config import build_config
    from msgsafe.adapters.rabbitmq import RabbitOptions

    opts = build_config(RabbitOptions, url, options)
    return lambda destination: inspect_destination(url, destination, opts)


def inspect_destination(
    url: BrokerUrl, destination: str, opts: RabbitOptions | None = None
) -> DestinationReport:
    """The guarantee of an AMQP 0-9-1 ``destination`` (a queue through the default
    exchange, or ``exchange/routing-key``), checked over AMQP on a short connection.
    ``declare`` (the producer's ``declare=``): a missing queue will be declared durable
    of that type before the first message, so it counts as that type."""
    if "/" in destination:
        return DestinationReport(
            destination,
            Guarantee.UNKNOWN,
            (
                Finding(
                    Severity.UNKNOWN,
                    f"destination {destination}",
                    "bound queues",
                    "unknown",
                    "AMQP does not show an exchange's bindings, so the queues it routes to "
                    "are not checked (an unroutable message still comes back: Unroutable)",
                    "send to a quorum queue by name, or check the bound queues with msgsafe doctor",
                    "rabbit-ha",
                ),
            ),
        )
    connection = _connect(url, opts)
    declare = opts.declare if opts is not None else None
    try:
        return _queue_report(connection, destination, destination, declare, dropped=False)
    finally:
        _close(connection)


def inspect_address(
    url: BrokerUrl, address: str, opts: TransportOptions, *, declare: str | None
) -> DestinationReport:
    """The guarantee of an AMQP 1.0 ``address`` on RabbitMQ's AMQP 1.0 plugin (3.x),
    checked over AMQP 0-9-1 on the same port.

    NOTE: the plugin declares the queue of a bare ``NAME`` or ``/queue/NAME`` address
    as a *transient* queue (a clean restart loses it and every confirmed message), and
    hangs the link when such a queue exists with other arguments; ``/amq/queue/NAME``
    addresses an existing queue, and a message sent there or to an ``/exchange/`` or
    ``/topic/`` address that no queue takes is *accepted and dropped* (AMQP 1.0 has no
    ``mandatory`` flag). Only ``/amq/queue/NAME`` of an existing durable queue keeps it.
    """
    subject = f"address {address}"
    if address.startswith("/amq/queue/"):
        name = address[len("/amq/queue/") :]
        connection = _connect(url, _over_amqp091(opts))
        try:
            return _queue_report(connection, address, name, declare, dropped=True)
        finally:
            _close(connection)
    if address.startswith(("/exchange/", "/topic/")):
        finding = Finding(
            Severity.CRITICAL,
            subject,
            "route",
            "exchange",
            "RabbitMQ's AMQP 1.0 plugin accepts a message no queue is bound for and drops "
            "it, and AMQP 0-9-1 cannot show the bindings: nothing proves it is kept",
            "send to an existing quorum queue as /amq/queue/NAME, or use an amqp:// URL "
            "(mandatory publishing: an unroutable message raises Unroutable)",
            "rabbit-ha",
        )
        return DestinationReport(address, Guarantee.NONE, (finding,))
    name = address[len("/queue/") :] if address.startswith("/queue/") else address
    finding = Finding(
        Severity.CRITICAL,
        subject,
        "address form",
        address,
        "RabbitMQ's AMQP 1.0 plugin declares this address's queue as a transient queue: a "
        "clean restart of the node loses the queue and every confirmed message in it",
        f"address it as /amq/queue/{name} (an existing durable queue; declare=quorum declares it)",
        "rabbit-ha",
    )
    return DestinationReport(address, Guarantee.NONE, (finding,))


def _over_amqp091(opts: TransportOptions) -> RabbitOptions:
    """The AMQP 1.0 URL's connection options (timeout, TLS) for AMQP 0-9-1 on its port."""
    from msgsafe.adapters.rabbitmq import RabbitOptions

    return RabbitOptions(
        connect_timeout=opts.connect_timeout,
        tls_verify=opts.tls_verify,
        tls_ca_file=opts.tls_ca_file,
        tls_cert_file=opts.tls_cert_file,
        tls_key_file=opts.tls_key_file,
    )


def _queue_report(
    connection: Any, destination: str, name: str, declare: str | None, *, dropped: bool
) -> DestinationReport:
    finding = _queue_probe(connection, name)
    if finding.setting == "exists" and declare is not None:
        if dropped:
            # NOTE: AMQP 1.0 has no declare that makes a durable queue of a chosen type
            # on RabbitMQ; AMQP 0-9-1 on the same port does.
            _declare(connection, name, declare)
            finding = _queue_probe(connection, name)
        else:
            # The AMQP 0-9-1 transport declares it (durable, x-queue-type) before sending.
            finding = _queue_type(f"queue {name}", declare, mirrored=None)
    if finding.setting == "exists":
        if dropped:
            finding = Finding(
                Severity.CRITICAL,
                f"queue {name}",
                "exists",
                "no",
                "RabbitMQ's AMQP 1.0 plugin accepts a message for a missing queue and drops it",
                "declare it (x-queue-type=quorum), e.g. with the option declare=quorum",
                "rabbit-ha",
            )
            return DestinationReport(destination, Guarantee.NONE, (finding,), _MISSING_KEEP_S)
        return DestinationReport(destination, Guarantee.UNKNOWN, (finding,), _MISSING_KEEP_S)
    return DestinationReport(destination, guarantee_of(finding), (finding,))


def _declare(connection: Any, name: str, kind: str) -> None:
    import pika.exceptions

    from msgsafe.errors import Rejected

    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": kind})
        channel.close()
    except pika.exceptions.ChannelClosedByBroker as exc:
        raise Rejected(
            f"declaring queue {name!r} ({kind}) failed: {exc.reply_text}",
            condition=str(exc.reply_code),
        ) from exc


# --- the AMQP connection ----------------------------------------------------------------


def _connect(url: BrokerUrl, opts: RabbitOptions | None = None) -> Any:
    """A blocking connection with the transport's own parameters, to the first host that
    takes it (:func:`msgsafe.adapters.rabbitmq.open_blocking_connection`): a check
    reaches the broker exactly when the transport does."""
    try:
        from msgsafe.adapters.rabbitmq import open_blocking_connection
    except ImportError as exc:
        raise MissingExtra("rabbitmq", "pika") from exc
    return open_blocking_connection(url, opts)


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
    never created: the passive declare runs first. An exclusive queue of another
    connection answers the passive declare with RESOURCE_LOCKED.
    """
    import pika.exceptions

    subject = f"queue {name}"
    try:
        channel = connection.channel()
        channel.queue_declare(name, passive=True)
    except pika.exceptions.ChannelClosedByBroker as exc:
        if exc.reply_code == 404:
            return _missing(subject, name)
        if exc.reply_code == 405:
            return _transient(subject, "exclusive", "true", "an exclusive queue")
        return _probe_unknown(subject, exc.reply_text)
    try:
        channel = connection.channel()
        channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
        channel.close()
    except pika.exceptions.ChannelClosedByBroker as exc:
        reason = str(exc.reply_text)
        if "'durable'" in reason:
            return _transient(subject)
        if "'auto_delete'" in reason:
            return _transient(subject, "auto-delete", "true", "an auto-delete queue")
        if "x-queue-type" in reason:
            match = _CURRENT.search(reason)
            kind = match.group(1) if match else "classic"
            return _queue_type(subject, kind, mirrored=None)
        return _probe_unknown(subject, reason)
    return _queue_type(subject, "quorum", mirrored=None)


def _missing(subject: str, name: str) -> Finding:
    return Finding(
        Severity.WARNING,
        subject,
        "exists",
        "no",
        "publishing to a missing queue is unroutable (msgsafe raises Unroutable)",
        f"declare it as a quorum queue (x-queue-type=quorum), e.g. msgsafe send "
        f"-o declare=quorum ... {name}",
    )


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


def _transient(
    subject: str, setting: str = "durable", value: str = "false", what: str = "a non-durable queue"
) -> Finding:
    gone = {
        "durable": "disappear when its node restarts",
        "exclusive": "disappear when the connection that declared it closes",
        "auto-delete": "disappear when its last consumer leaves",
    }[setting]
    return Finding(
        Severity.CRITICAL,
        subject,
        setting,
        value,
        f"{what} and its messages {gone}",
        "recreate it durable, not exclusive, not auto-delete, as a quorum queue",
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
    if queue.get("exclusive"):
        return [_transient(subject, "exclusive", "true", "an exclusive queue")]
    if queue.get("auto_delete"):
        return [_transient(subject, "auto-delete", "true", "an auto-delete queue")]
    kind = str(queue.get("type", "classic"))
    policy = queue.get("effective_policy_definition") or {}
    mirrored = isinstance(policy, dict) and "ha-mode" in policy
    return [_queue_type(subject, kind, mirrored=mirrored)]
