"""Kafka settings that decide whether an acknowledged message survives broker failures:
replication factor, ``min.insync.replicas``, ``unclean.leader.election.enable`` — per
topic and as broker defaults — read with confluent-kafka's AdminClient."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from msgsafe.checks.findings import DestinationReport, Finding, Severity
from msgsafe.endpoints import BrokerUrl
from msgsafe.errors import (
    AuthenticationError,
    CertificateError,
    ConnectError,
    MissingExtra,
    ProtocolMismatch,
)

if TYPE_CHECKING:
    from msgsafe.adapters.kafka import KafkaOptions
    from msgsafe.checks.findings import Inspector
from msgsafe.message import Guarantee

__all__ = ["check_kafka", "doctor_findings", "inspect_destination", "inspector"]

_TIMEOUT_S = 5.0


#: librdkafka's reason for one failed connection: "... failed: Connection refused (after".
_FAILED = re.compile(r"(?:failed|timed out|Disconnected)[^()]*?(?::\s*([^()]+?))?\s*\(after")


def _cause(failures: list[str]) -> str:
    """The latest connection failure librdkafka reported, in a few words."""
    for text in reversed(failures):
        if "Connection refused" in text:
            return "connection refused"
        if "timed out" in text:
            return "timed out"
        found = _FAILED.search(text)
        if found is not None and found.group(1):
            return found.group(1).strip().lower()
    return ""


def _admin(
    url: BrokerUrl, opts: KafkaOptions | None = None, errors: deque[Any] | None = None
) -> Any:
    """An AdminClient with the settings of the producer's own client (servers, SASL,
    TLS: :func:`msgsafe.adapters.kafka.config.client_settings`); librdkafka's error
    events go to ``errors`` (served by ``poll``)."""
    try:
        from confluent_kafka.admin import AdminClient

        from msgsafe.adapters._config import build_config
        from msgsafe.adapters.kafka import KafkaOptions
        from msgsafe.adapters.kafka.config import client_settings
    except ImportError as exc:
        raise MissingExtra("kafka", "confluent-kafka") from exc
    conf: dict[str, Any] = client_settings(url, opts or build_config(KafkaOptions, url, {}))
    if errors is not None:
        conf["error_cb"] = errors.append
    return AdminClient(conf)


#: librdkafka's error_cb text once every bootstrap broker refused or failed.
_ALL_DOWN = "brokers are down"


def _connect(url: BrokerUrl, opts: KafkaOptions | None = None) -> tuple[Any, Any]:
    """An AdminClient of ``url`` and the cluster's metadata (every topic).

    Raises :class:`ConnectError` as soon as librdkafka reports every broker down (a
    refused port answers in milliseconds), or after ``connect_timeout`` (and a second);
    :class:`AuthenticationError`, :class:`CertificateError` or :class:`ProtocolMismatch`
    when the failure is one no retry can fix (the producer's client would meet the same).
    """
    from confluent_kafka import KafkaError, KafkaException

    errors: deque[Any] = deque(maxlen=8)
    failures: deque[str] = deque(maxlen=8)
    admin = _admin(url, opts, errors)
    wait = (opts.connect_timeout if opts is not None else _TIMEOUT_S) + 1.0
    deadline = time.monotonic() + wait
    while True:
        try:
            return admin, admin.list_topics(timeout=0.1)
        except KafkaException as exc:
            admin.poll(0)  # NOTE: error_cb runs only from poll(); the failures wait there.
            failures.extend(e.str() for e in errors)
            refused = (KafkaError._AUTHENTICATION, KafkaError.SASL_AUTHENTICATION_FAILED)
            # NOTE: librdkafka retries refused credentials on every reconnect, forever.
            login = [e for e in errors if e.code() in refused]
            errors.clear()
            if login:
                raise AuthenticationError(
                    f"the broker refused the SASL login: {login[-1].str()}",
                    endpoint=url.redacted(),
                ) from exc
            down = any(_ALL_DOWN in text for text in failures)
            if down or time.monotonic() >= deadline:
                _raise_unfixable(url, list(failures))
                cause = _cause(list(failures)) or exc.args[0].str()
                raise ConnectError(
                    f"no Kafka broker answered metadata: {cause}", endpoint=url.redacted()
                ) from exc


def _raise_unfixable(url: BrokerUrl, failures: list[str]) -> None:
    """Raise what no retry fixes about a cluster that did not answer: a certificate
    (librdkafka's text says so), or a port of another protocol (the port, asked, says)."""
    from msgsafe.adapters import _peer
    from msgsafe.adapters.kafka import certificate_refusal

    for text in failures:
        said = certificate_refusal(text)
        if said is not None:
            raise CertificateError(said, endpoint=url.redacted())
    for endpoint in url.endpoints:
        where = str(endpoint)
        if url.tls:
            spoken = _peer.identify_peer(where, header=None, kafka=True)
            if spoken == "Kafka":
                raise ProtocolMismatch(
                    f"{_peer.PLAIN_NOT_TLS}: use kafka:// (or the broker's SSL listener)",
                    endpoint=url.redacted(),
                )
        else:
            spoken = _peer.identify_peer(where, header=_peer.AMQP10_HEADER, kafka=False)
            if spoken in _peer.KAFKA_ADVICE:
                raise ProtocolMismatch(
                    f"this port speaks {spoken}, not Kafka: {_peer.KAFKA_ADVICE[spoken]}",
                    endpoint=url.redacted(),
                )


def doctor_findings(
    url: BrokerUrl, destinations: Sequence[str], management: str | None
) -> list[Finding]:
    """``msgsafe doctor``'s findings: :func:`check_kafka` (``management`` is RabbitMQ's)."""
    del management
    return check_kafka(url, destinations)


def check_kafka(url: BrokerUrl, topics: Sequence[str]) -> list[Finding]:
    """Findings for the cluster at ``url`` and ``topics`` (all non-internal when empty)."""

    admin, metadata = _connect(url)
    findings: list[Finding] = []
    brokers = sorted(metadata.brokers)
    findings.append(_broker_count(len(brokers)))
    names = list(topics) or sorted(t for t in metadata.topics if not t.startswith("__"))
    if not names:
        findings.append(
            Finding(Severity.INFO, "cluster", "topics", "none", "no topics to check yet")
        )
    existing = _find_topics(url, metadata, names)
    for name in names:
        topic = existing.get(name)
        if topic is None or topic.error is not None:
            findings.append(
                Finding(
                    Severity.WARNING,
                    f"topic {name}",
                    "exists",
                    "no",
                    "the topic does not exist; auto-creation would use the broker defaults",
                    f"create it: kafka-topics --create --topic {name} --replication-factor 3 "
                    "--config min.insync.replicas=2",
                )
            )
            continue
        replication = min((len(p.replicas) for p in topic.partitions.values()), default=0)
        under = sum(1 for p in topic.partitions.values() if len(p.isrs) < len(p.replicas))
        findings.append(_replication(name, replication))
        if under:
            findings.append(
                Finding(
                    Severity.WARNING,
                    f"topic {name}",
                    "in-sync replicas",
                    f"{under} partition(s) under-replicated now",
                    "the ISR has shrunk: acknowledged writes currently live on fewer brokers",
                    "bring the lagging brokers back; check their disks and network",
                    "kafka",
                )
            )
        configs = _describe(admin, "topic", name)
        findings.extend(_topic_configs(name, replication, configs))
    for broker in brokers[:1]:
        configs = _describe(admin, "broker", str(broker))
        findings.extend(_broker_defaults(broker, configs))
    return findings


def inspector(url: BrokerUrl, options: Mapping[str, object]) -> Inspector:
    """The producer's check of ``url``'s topics, connecting as its client does."""
    from msgsafe.adapters._config import build_config
    from msgsafe.adapters.kafka import KafkaOptions

    opts = build_config(KafkaOptions, url, options)
    return lambda topic: inspect_destination(url, topic, opts)


def inspect_destination(
    url: BrokerUrl, topic: str, opts: KafkaOptions | None = None
) -> DestinationReport:
    """The guarantee of ``topic``: replication factor, ``min.insync.replicas`` and unclean
    leader election; for a topic that does not exist yet, the broker defaults that
    auto-creation would give it. Never creates the topic."""
    admin, metadata = _connect(url, opts)
    existing = _find_topics(url, metadata, [topic], opts, rounds=1)
    found = existing.get(topic)
    brokers = sorted(metadata.brokers)
    configs = _describe(admin, "broker", str(brokers[0])) if brokers else "no broker listed"
    if found is not None:
        replication = min((len(p.replicas) for p in found.partitions.values()), default=0)
        findings = [_replication(topic, replication)]
        # NOTE: a broker that cannot describe its own configs cannot describe a topic's
        # either (librdkafka's mock cluster then leaves the topic request unanswered).
        unsupported = isinstance(configs, str) and "UNSUPPORTED" in configs
        topic_configs = configs if unsupported else _describe(admin, "topic", topic)
        findings.extend(_topic_configs(topic, replication, topic_configs))
        return DestinationReport(topic, _guarantee(findings), tuple(findings))
    # Not there yet: what auto-creation would make of it (the broker's defaults).
    subject = f"topic {topic} (auto-created)"
    # Said in so many words, for a reader that must not create it (msgsafe deadletter).
    absent = Finding(
        Severity.INFO,
        subject,
        "exists",
        "no",
        "the topic does not exist yet: the first send creates it with the broker defaults",
    )
    if isinstance(configs, str) or not configs:
        findings = _not_reported(
            subject,
            ("default.replication.factor, min.insync.replicas",),
            configs,
            "kafka-configs --describe --entity-type brokers --all",
        )
        findings.append(absent)
        return DestinationReport(topic, Guarantee.UNKNOWN, tuple(findings), _MISSING_KEEP_S)
    if configs.get("auto.create.topics.enable", "true").lower() != "true":
        finding = Finding(
            Severity.UNKNOWN,
            subject,
            "exists",
            "no",
            "the topic does not exist and auto-creation is off: a send cannot be confirmed",
            f"create it: kafka-topics --create --topic {topic} --replication-factor 3 "
            "--config min.insync.replicas=2",
            "kafka",
        )
        return DestinationReport(topic, Guarantee.UNKNOWN, (finding,), _MISSING_KEEP_S)
    default_rf = configs.get("default.replication.factor", "")
    replication = int(default_rf) if default_rf.isdigit() else 0
    findings = [
        _replication(topic, replication)
        if replication
        else _not_reported(
            subject, ("default.replication.factor",), "not reported", "kafka-configs"
        )[0],
        _min_isr(subject, replication, configs.get("min.insync.replicas")),
        _unclean(subject, configs.get("unclean.leader.election.enable")),
        absent,
    ]
    return DestinationReport(topic, _guarantee(findings), tuple(findings), _MISSING_KEEP_S)


#: How long the answer for a topic that does not exist is kept (it may be created).
_MISSING_KEEP_S = 5.0


def _guarantee(findings: Sequence[Finding]) -> Guarantee:
    """Kafka's critical findings (one replica, ``min.insync.replicas=1``, unclean
    election) each leave an acknowledged write on one broker: durable, not replicated."""
    if any(f.severity is Severity.CRITICAL for f in findings):
        return Guarantee.DURABLE
    if any(f.severity is Severity.UNKNOWN for f in findings):
        return Guarantee.UNKNOWN
    return Guarantee.REPLICATED


def _find_topics(
    url: BrokerUrl,
    metadata: Any,
    names: Sequence[str],
    opts: KafkaOptions | None = None,
    *,
    rounds: int = 3,
) -> dict[str, Any]:
    """Metadata of each named topic that exists.

    NOTE: a metadata request naming a topic makes brokers with auto-creation create it,
    and tansu answers "all topics" from a per-broker cache that may not list a topic
    created through another broker yet. So: only "all topics" requests, asked of every
    broker in turn, a few times, until each named topic was seen or the rounds ran out.
    """
    from confluent_kafka import KafkaException

    found = {n: metadata.topics[n] for n in names if _usable(metadata.topics.get(n))}
    for done in range(rounds):
        if len(found) == len(names):
            break
        for endpoint in url.endpoints:
            single = BrokerUrl(
                scheme=url.scheme,
                protocol=url.protocol,
                tls=url.tls,
                endpoints=(endpoint,),
                username=url.username,
                password=url.password,
                options=url.options,
            )
            try:
                listed = _admin(single, opts).list_topics(timeout=_TIMEOUT_S).topics
            except KafkaException:
                continue
            found.update({n: listed[n] for n in names if _usable(listed.get(n))})
        if done + 1 < rounds:
            time.sleep(0.2)  # pacing the rounds while broker caches catch up
    return found


def _usable(topic: Any) -> bool:
    return topic is not None and topic.error is None and bool(topic.partitions)


def _describe(admin: Any, kind: str, name: str) -> dict[str, str] | str:
    """Config name -> value, or the reason the broker did not say."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        ConfigResource,
        ResourceType,
    )

    rtype = ResourceType.TOPIC if kind == "topic" else ResourceType.BROKER
    resource = ConfigResource(rtype, name)
    try:
        future = admin.describe_configs([resource], request_timeout=_TIMEOUT_S)[resource]
        entries = future.result(_TIMEOUT_S)
    except (KafkaException, TimeoutError) as exc:
        return f"DescribeConfigs failed: {exc}"
    return {k: v.value for k, v in entries.items() if v.value is not None}


def _broker_count(count: int) -> Finding:
    if count >= 3:
        return Finding(Severity.OK, "cluster", "brokers", str(count))
    return Finding(
        Severity.WARNING,
        "cluster",
        "brokers",
        str(count),
        f"{count} broker(s): a replication factor of 3 with min.insync.replicas=2 is not "
        "possible, so one broker's loss can lose acknowledged writes or stop them",
        "run at least 3 brokers",
        "kafka",
    )


def _replication(topic: str, replication: int) -> Finding:
    subject = f"topic {topic}"
    if replication >= 3:
        return Finding(Severity.OK, subject, "replication factor", str(replication))
    severity = Severity.CRITICAL if replication <= 1 else Severity.WARNING
    return Finding(
        severity,
        subject,
        "replication factor",
        str(replication),
        "Kafka acknowledges once the in-sync replicas have the write in memory; with "
        f"{replication} replica(s) one broker failing hard (disk or power) loses "
        "acknowledged messages",
        f"kafka-reassign-partitions to replication factor 3 for {topic}",
        "kafka",
    )


def _not_reported(
    subject: str, names: Sequence[str], configs: dict[str, str] | str, check: str
) -> list[Finding]:
    """UNKNOWN for each of ``names``: the broker's answer (``configs``: an error text or
    an empty dict) says nothing about them, and doctor does not guess."""
    reason = configs if isinstance(configs, str) else "the broker returned no configs"
    return [
        Finding(
            Severity.UNKNOWN,
            subject,
            name,
            "unknown",
            f"{reason}; not guessing",
            f"check with: {check}",
            "kafka",
        )
        for name in names
    ]


def _topic_configs(topic: str, replication: int, configs: dict[str, str] | str) -> list[Finding]:
    subject = f"topic {topic}"
    if isinstance(configs, str) or not configs:
        return _not_reported(
            subject,
            ("min.insync.replicas", "unclean.leader.election.enable"),
            configs,
            f"kafka-configs --describe --entity-type topics --entity-name {topic}",
        )
    findings = [_min_isr(subject, replication, configs.get("min.insync.replicas"))]
    findings.append(_unclean(subject, configs.get("unclean.leader.election.enable")))
    return findings


def _min_isr(subject: str, replication: int, value: str | None) -> Finding:
    name = "min.insync.replicas"
    if value is None or not value.isdigit():
        return Finding(Severity.UNKNOWN, subject, name, "unknown", "the broker did not report it")
    min_isr = int(value)
    if min_isr < 2:
        return Finding(
            Severity.CRITICAL,
            subject,
            name,
            value,
            "with min.insync.replicas=1 the ISR can shrink to the leader alone, which then "
            "acknowledges acks=all writes by itself; an isolated or failed leader loses them",
            f"kafka-configs --alter --entity-type topics --entity-name {subject[6:]} "
            "--add-config min.insync.replicas=2",
            "kafka",
        )
    if replication and min_isr >= replication:
        return Finding(
            Severity.WARNING,
            subject,
            name,
            value,
            f"min.insync.replicas={min_isr} with {replication} replicas: any one broker down "
            "refuses every write (msgsafe stores them in the outbox; nothing is lost)",
            "keep min.insync.replicas one below the replication factor",
            "kafka",
        )
    return Finding(Severity.OK, subject, name, value)


def _unclean(subject: str, value: str | None) -> Finding:
    name = "unclean.leader.election.enable"
    if value is None:
        return Finding(Severity.UNKNOWN, subject, name, "unknown", "the broker did not report it")
    if value.lower() == "true":
        return Finding(
            Severity.CRITICAL,
            subject,
            name,
            value,
            "a follower outside the ISR may become leader and truncate acknowledged writes "
            "(the story lost 15286 messages this way, even with acks=all)",
            "set unclean.leader.election.enable=false",
            "kafka",
        )
    return Finding(Severity.OK, subject, name, value)


def _broker_defaults(broker: int, configs: dict[str, str] | str) -> list[Finding]:
    subject = f"broker {broker} defaults"
    if isinstance(configs, str) or not configs:
        return _not_reported(
            subject,
            ("default.replication.factor, min.insync.replicas, unclean.leader.election",),
            configs,
            "kafka-configs --describe --entity-type brokers --all",
        )
    findings: list[Finding] = []
    default_rf = configs.get("default.replication.factor")
    if default_rf is not None and default_rf.isdigit() and int(default_rf) < 3:
        findings.append(
            Finding(
                Severity.WARNING,
                subject,
                "default.replication.factor",
                default_rf,
                "auto-created topics get this replication factor",
                "set default.replication.factor=3 (or disable auto.create.topics.enable)",
                "kafka",
            )
        )
    findings.append(_unclean(subject, configs.get("unclean.leader.election.enable")))
    return findings
