"""AMQP 1.0 peers: what the open frame advertises (container, product, offered
capabilities, ``failover-server-list``). AMQP 1.0 says nothing about how the broker
stores or replicates a queue, so that is reported as unknown, never assumed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from msgsafe.adapters.amqp10._errors import condition_text
from msgsafe.adapters.amqp10._failover import parse_failover_list, parse_redirect
from msgsafe.adapters.amqp10.config import Amqp10Options, load_options
from msgsafe.checks.findings import DestinationReport, Finding, Severity
from msgsafe.endpoints import BrokerUrl, Endpoint, EndpointList
from msgsafe.errors import AuthenticationError, ConnectError, MissingExtra
from msgsafe.message import Guarantee

if TYPE_CHECKING:
    from msgsafe.checks.findings import Inspector

__all__ = ["check_amqp10", "doctor_findings", "inspect_destination", "inspector"]

_TIMEOUT_S = 5.0
#: How long an opened connection is watched for a close that follows the open.
_SETTLE_S = 0.5


@dataclass
class _Answer:
    """What one node said to an open: its open frame, and a close if one came at once."""

    endpoint: Endpoint
    opened: bool = False
    properties: dict[Any, Any] = field(default_factory=dict)
    container: str = ""
    capabilities: list[str] = field(default_factory=list)
    closed: Any = None  #: the close condition (a refusal or a redirect), if any
    error: str = ""
    condition: Any = None  #: the transport's condition when no open frame came


def _probe(
    url: BrokerUrl,
    endpoint: Endpoint,
    settle_s: float = _SETTLE_S,
    timeout: float = _TIMEOUT_S,
    opts: Amqp10Options | None = None,
) -> _Answer:
    """Open one connection to ``endpoint`` as the transport does (SASL, TLS and virtual
    host from ``opts``); keep it up to ``settle_s`` to see a close that follows the open
    (a Broker-J replica, a redirect)."""
    from proton.handlers import MessagingHandler
    from proton.reactor import Container

    from msgsafe.adapters.amqp10 import LOGIN_GRACE_S, ssl_domain

    options = opts if opts is not None else load_options(url, {})
    answer = _Answer(endpoint)
    mechs = options.sasl_mechanisms or ("PLAIN" if url.username else "ANONYMOUS")

    class Probe(MessagingHandler):
        conn: Any = None
        graced = False

        def on_start(self, event: Any) -> None:
            host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
            scheme = "amqps" if endpoint.tls else "amqp"
            self.conn = event.container.connect(
                f"{scheme}://{host}:{endpoint.port}",
                reconnect=False,
                ssl_domain=ssl_domain(options) if endpoint.tls else None,
                sasl_enabled=True,
                allowed_mechs=mechs,
                allow_insecure_mechs=options.sasl_allow_insecure,
                virtual_host=options.virtual_host,
                user=url.username,
                password=url.password.reveal() if url.password else None,
            )
            event.container.schedule(timeout, self)

        def on_connection_opened(self, event: Any) -> None:
            conn = event.connection
            answer.opened = True
            answer.properties = dict(conn.remote_properties or {})
            answer.container = str(conn.remote_container or "")
            answer.capabilities = [str(c) for c in (conn.remote_offered_capabilities or [])]
            if conn.remote_condition is not None:
                answer.closed = conn.remote_condition
            event.container.schedule(settle_s, self)

        def on_connection_remote_close(self, event: Any) -> None:
            answer.closed = event.connection.remote_condition
            event.connection.close()
            event.container.stop()

        def on_transport_error(self, event: Any) -> None:
            cond = event.transport.condition
            if not answer.opened:
                answer.error = str(cond.description if cond else "transport error")
                answer.condition = cond
            event.container.stop()

        def on_timer_task(self, event: Any) -> None:
            if not answer.opened and not self.graced:
                transport = self.conn.transport if self.conn is not None else None
                if transport is not None and transport.frames_input > 0:
                    # An AMQP 1.0 peer that sent its SASL mechanisms is alive: wait for its
                    # verdict on the login, as the transport does (RabbitMQ's plugin
                    # refuses a bad password only after 3 s).
                    self.graced = True
                    event.container.schedule(LOGIN_GRACE_S, self)
                    return
            if not answer.opened:
                answer.error = f"no open frame within {timeout:g} s"
            event.container.stop()

    Container(Probe()).run()
    return answer


def doctor_findings(
    url: BrokerUrl, destinations: Sequence[str], management: str | None
) -> list[Finding]:
    """``msgsafe doctor``'s findings: :func:`check_amqp10`, then the producer's own check
    of each named address (on RabbitMQ: the queue). ``management`` is RabbitMQ's."""
    del management
    findings = check_amqp10(url)
    for name in destinations:
        report = inspect_destination(url, name)
        findings.extend(report.findings)
        if not report.findings:
            findings.append(
                Finding(Severity.OK, f"address {name}", "guarantee", report.guarantee.value)
            )
    return findings


def check_amqp10(url: BrokerUrl) -> list[Finding]:
    """Each node's role as it answers an open, then findings from the first node that
    serves: its open frame, its ``failover-server-list`` and what the client does with
    it (the URL's ``failover_merge`` and ``failover_allow``), and any redirect."""
    try:
        import proton  # noqa: F401
    except ImportError as exc:
        raise MissingExtra("amqp10", "python-qpid-proton") from exc
    options = load_options(url, {})
    answers = [_probe(url, endpoint) for endpoint in url.endpoints]
    if not any(a.opened for a in answers):
        errors = "; ".join(f"{a.endpoint}: {a.error}" for a in answers)
        raise ConnectError(
            f"no AMQP 1.0 peer opened a connection ({errors})", endpoint=url.redacted()
        )
    serving = [a for a in answers if a.opened and a.closed is None]
    findings = [_role(a, options, bool(serving)) for a in answers]
    if serving:
        findings += _findings(url, serving[0], options)
    return findings


def inspector(url: BrokerUrl, options: Mapping[str, object]) -> Inspector:
    """The producer's check of ``url``'s addresses, connecting as its transport does."""
    opts = load_options(url, options)
    return lambda address: inspect_destination(url, address, opts)


def inspect_destination(
    url: BrokerUrl, address: str, opts: Amqp10Options | None = None
) -> DestinationReport:
    """The guarantee of ``address``. AMQP 1.0 does not say how a node stores what it
    accepted, so it is :attr:`Guarantee.UNKNOWN` unless the peer is one whose own
    protocol tells: RabbitMQ (the queue behind the address, over AMQP 0-9-1 on the same
    port; see :func:`msgsafe.adapters.rabbitmq.check.inspect_address`).

    A refused login, a certificate that does not verify or a peer of another protocol
    raise their permanent error (the transport would meet the same); otherwise
    :class:`ConnectError` once no peer opened a connection."""
    from msgsafe.adapters.amqp10 import connection_error, unfixable

    options = opts if opts is not None else load_options(url, {})
    answer: _Answer | None = None
    failed: list[_Answer] = []
    for endpoint in url.endpoints:
        answer = _probe(url, endpoint, 0.0, options.connect_timeout, options)
        if answer.opened:
            break
        if answer.condition is not None:
            target = url.redacted()
            fatal = unfixable(answer.condition, target, endpoint)
            if fatal is not None:
                raise fatal
            login = connection_error(answer.condition, endpoint=target)
            if isinstance(login, AuthenticationError):
                raise login
        failed.append(answer)
    if answer is None or not answer.opened:
        errors = "; ".join(f"{a.endpoint}: {a.error}" for a in failed)
        raise ConnectError(
            f"no AMQP 1.0 peer opened a connection ({errors})", endpoint=url.redacted()
        )
    product = str(answer.properties.get("product", ""))
    if product.lower() == "rabbitmq":
        from msgsafe.adapters.rabbitmq.check import inspect_address

        return inspect_address(url, address, options, declare=options.declare)
    finding = Finding(
        Severity.UNKNOWN,
        f"address {address}",
        "durability and replication",
        "unknown",
        f"AMQP 1.0 does not say how {product or 'this peer'} stores or replicates the "
        "node behind an address; not guessing",
        "check the queue with the broker's own tools (Artemis: a durable anycast queue; "
        "Broker-J: a durable queue in a BDB HA group)",
        "qpid-ha",
    )
    return DestinationReport(address, Guarantee.UNKNOWN, (finding,))


def _role(answer: _Answer, options: Amqp10Options, any_serving: bool) -> Finding:
    subject = f"peer {answer.endpoint}"
    if not answer.opened:
        return Finding(
            Severity.INFO if any_serving else Severity.WARNING,
            subject,
            "role",
            f"unreachable: {answer.error}",
            "not listening, paused or down (an Artemis backup does not listen while its live runs)",
        )
    if answer.closed is None:
        product = str(answer.properties.get("product", "")) or "a peer"
        return Finding(Severity.OK, subject, "role", f"serving ({product})")
    text = condition_text(answer.closed) or "closed"
    redirect = parse_redirect(answer.closed, current=answer.endpoint)
    if redirect is not None:
        target = redirect[0]
        verdict = "followed" if options.allows(target) else "NOT followed: outside failover_allow"
        return Finding(Severity.INFO, subject, "role", f"redirects to {target} ({verdict})", text)
    return Finding(
        Severity.INFO if any_serving else Severity.WARNING,
        subject,
        "role",
        f"not serving: {text}",
        "the node opens and closes at once (a Broker-J replica, or a group "
        "without quorum): the client moves on to the next candidate",
    )


def _findings(url: BrokerUrl, answer: _Answer, options: Amqp10Options) -> list[Finding]:
    endpoint = str(answer.endpoint)
    props = answer.properties
    caps = answer.capabilities
    product = " ".join(str(props.get(k, "")) for k in ("product", "version")).strip()
    findings = [
        Finding(
            Severity.INFO,
            f"peer {endpoint}",
            "open frame",
            f"container {answer.container}; {product or 'product not advertised'}; "
            f"capabilities: {', '.join(caps) or 'none'}",
        )
    ]
    failover = props.get("failover-server-list")
    if failover:
        findings.append(_client_plan(url, answer, options))
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


def _client_plan(url: BrokerUrl, answer: _Answer, options: Amqp10Options) -> Finding:
    """What the client does with the advertised list: the rotation it ends with."""
    current = answer.endpoint
    advertised = parse_failover_list(answer.properties, current=current)
    rotation = EndpointList(url.endpoints, merge=options.merge_policy, allow=options.allows)
    rotation.advertise([*advertised, current])
    refused = [e for e in rotation.refused if e != current]
    why = f"advertised: {', '.join(map(str, advertised)) or 'nothing usable'}"
    if refused:
        skipped = ", ".join(map(str, refused))
        why += f"; not followed (TLS downgrade or outside failover_allow): {skipped}"
    return Finding(
        Severity.INFO,
        f"peer {current}",
        "client fail-over plan",
        f"{options.merge_policy.value}: tries {', '.join(map(str, rotation.endpoints))}",
        why,
    )
